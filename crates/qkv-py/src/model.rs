//! `qkv.load(dir)` and the `Model` it returns: a checkpoint folder's network, tokenizer
//! and chat template, as the methods read them (methods.rs; generate.rs and
//! attribute.rs for the two longest).

use std::path::{Path, PathBuf};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use qkv::models::sentence::SentenceEncoder;
use qkv::models::{KvDType, SequenceClassifier, Transformer};
use qkv::text::{ChatTemplate, Renderer, Tokenizer};
use qkv::weights::DType;

use crate::errors::OrPy;

/// The network: a plain checkpoint, a sentence-transformers folder whose encoder
/// comes with its pooling, or a `…ForSequenceClassification` folder whose encoder comes
/// with its head and labels.
enum Net {
    Plain(Box<Transformer>),
    Sentence(Box<SentenceEncoder>),
    Classifier(Box<SequenceClassifier>),
}

/// A model loaded from a Hugging Face (or qkv) folder. Made by :func:`qkv.load`.
#[pyclass(module = "qkv", frozen)]
pub struct Model {
    net: Net,
    /// the folder's tokenizer, where the network keeps none of its own (a classifier
    /// does: [`Model::maybe_tokenizer`] reads either, so the folder's is read once)
    tokenizer: Option<Tokenizer>,
    chat_template: Option<ChatTemplate>,
    /// renders `chat_template` in worker processes of this Python, bounded in memory
    /// and time (qkv::text::chat_process); `None` where Python names no executable
    renderer: Option<Renderer>,
    pub(crate) dir: PathBuf,
    pub(crate) parameters: usize,
    pub(crate) dtypes: Vec<(String, usize)>,
    /// the vocabulary as the grammar engine reads it, built at the first structured call
    pub(crate) vocabulary: std::sync::OnceLock<qkv::models::generate::grammar::Vocabulary>,
}

impl Model {
    pub(crate) fn transformer(&self) -> &Transformer {
        match &self.net {
            Net::Plain(t) => t,
            Net::Sentence(s) => s.encoder(),
            Net::Classifier(c) => c.encoder(),
        }
    }

    /// The sentence encoder of a sentence-transformers folder.
    pub(crate) fn sentence(&self) -> Option<&SentenceEncoder> {
        match &self.net {
            Net::Sentence(s) => Some(s),
            _ => None,
        }
    }

    /// The head and labels of a `…ForSequenceClassification` folder.
    pub(crate) fn classifier(&self) -> Option<&SequenceClassifier> {
        match &self.net {
            Net::Classifier(c) => Some(c),
            _ => None,
        }
    }

    /// The folder's tokenizer, where it has one.
    pub(crate) fn maybe_tokenizer(&self) -> Option<&Tokenizer> {
        match &self.net {
            Net::Classifier(c) => c.tokenizer(),
            _ => self.tokenizer.as_ref(),
        }
    }

    pub(crate) fn tokenizer(&self) -> PyResult<&Tokenizer> {
        self.maybe_tokenizer().ok_or_else(|| {
            PyValueError::new_err(format!(
                "{} has no tokenizer (tokenizer.json or SentencePiece files); pass token ids",
                self.dir.display()
            ))
        })
    }

    /// The folder's chat template over `messages` (a Python list of dicts), with
    /// `kwargs` as more variables: `apply_chat_template`'s text, which `generate`'s
    /// `messages=` runs too.
    pub(crate) fn chat_prompt<'py>(
        &self,
        py: Python<'py>,
        messages: &Bound<'py, PyAny>,
        add_generation_prompt: bool,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<String> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            PyValueError::new_err(format!(
                "{} has no chat template (chat_template.jinja, chat_template in tokenizer_config.json, or a GGUF file's tokenizer.chat_template)",
                self.dir.display()
            ))
        })?;
        let as_json = |obj: &Bound<'py, PyAny>, name: &str| -> PyResult<serde_json::Value> {
            let text: String = py
                .import("json")?
                .call_method1("dumps", (obj,))
                .map_err(|e| PyValueError::new_err(format!("invalid {name}: not JSON: {e}")))?
                .extract()?;
            serde_json::from_str(&text)
                .map_err(|e| PyValueError::new_err(format!("invalid {name}: {e}")))
        };
        let serde_json::Value::Array(messages) = as_json(messages, "messages")? else {
            return Err(PyValueError::new_err(
                "invalid messages: a list of {\"role\": ..., \"content\": ...}",
            ));
        };
        let extra = match kwargs {
            Some(k) => match as_json(k.as_any(), "keywords")? {
                serde_json::Value::Object(map) => map,
                _ => unreachable!("a dict is a JSON object"),
            },
            None => serde_json::Map::new(),
        };
        match &self.renderer {
            Some(r) => py
                .detach(|| r.render(template, &messages, add_generation_prompt, &extra))
                .or_py(),
            None => template
                .render_with(&messages, add_generation_prompt, &extra)
                .or_py(),
        }
    }
}

/// Loads the model folder ``path``: a Hugging Face checkpoint (BERT, GPT-2, Llama,
/// Mistral, Qwen2, BLOOM, Marian, T5), a sentence-transformers folder (with
/// ``modules.json``), or a folder qkv saved; or a GGUF file of a ``llama`` or ``qwen2``
/// model, its tokenizer and chat template from its metadata and its Q8_0 weights
/// computed from their blocks whatever ``dtype`` says. Nothing is downloaded.
///
/// ``dtype`` is the number type the linear layers compute in: ``"f32"``; ``"bf16"``
/// (weights and each layer's input rounded to bfloat16, products and sums in f32);
/// ``"int8"`` (8-bit codes with a scale per 32 weights of a row, as GGUF's Q8_0, and
/// each layer's input quantized the same way on the fly) or ``"int8-row"`` (a scale per
/// row). Norms, softmax, embeddings and a tied head stay f32.
///
/// ``kv_dtype`` is the type :meth:`Model.generate` keeps its KV cache in: ``"f32"``, or
/// ``"bf16"`` (half the bytes a step reads on long contexts; keys and values rounded
/// to bfloat16, the attention computed in f32). Only a model that decodes has a cache.
///
/// A ``UserWarning`` names each thing the folder says that qkv reads differently
/// from transformers or not at all: a ``config.json`` key qkv does not know, a special
/// token id outside the vocabulary (left unset: such an EOS never stops generation).
///
/// Raises:
///     FileNotFoundError: ``path`` is not a folder, or lacks a file it needs.
///     ValueError: the config or weights are invalid or of an unsupported
///         architecture (the message names the file and field), ``dtype`` or
///         ``kv_dtype`` is not one of the names, or ``kv_dtype`` is not ``"f32"`` for a
///         model without a decoder.
#[pyfunction]
#[pyo3(signature = (path, *, dtype = "f32", kv_dtype = "f32"))]
pub fn load(py: Python<'_>, path: PathBuf, dtype: &str, kv_dtype: &str) -> PyResult<Model> {
    let dtype: DType = dtype.parse().or_py()?;
    let kv_dtype: KvDType = kv_dtype.parse().or_py()?;
    let mut model = py.detach(|| read(&path, dtype, kv_dtype)).or_py()?;
    if model.chat_template.is_some() {
        let python: String = py.import("sys")?.getattr("executable")?.extract()?;
        if !python.is_empty() {
            let serve = "import qkv._qkv as q; q._serve_renders()".to_string();
            model.renderer = Some(Renderer::new(python.into(), vec!["-c".into(), serve]));
        }
    }
    // what the folder says that qkv reads differently from transformers or not at all
    for warning in &model.transformer().load_warnings {
        py.import("warnings")?
            .call_method1("warn", (warning.as_str(),))?;
    }
    if model.transformer().kv_dtype != kv_dtype {
        return Err(PyValueError::new_err(format!(
            "invalid kv_dtype: `{kv_dtype}`: {} has no decoder, so no KV cache to store",
            path.display()
        )));
    }
    Ok(model)
}

/// The folder `dir` with its linear layers in `dtype` and, if it decodes, its KV cache
/// in `kv_dtype`.
fn read(dir: &Path, dtype: DType, kv_dtype: KvDType) -> qkv::Result<Model> {
    let (net, parameters, dtypes, rows) = match dir.join("modules.json").is_file() {
        true => {
            let encoder = SentenceEncoder::load_in(dir, dtype)?;
            let parameters = encoder.stored_parameters();
            let dtypes = encoder.stored_dtypes().to_vec();
            let rows = encoder.encoder().arch.token_rows();
            (Net::Sentence(Box::new(encoder)), parameters, dtypes, rows)
        }
        false => {
            // Python calls only run forward: the projections are packed once here, in
            // bf16 or int8 with no f32 copy of them
            let loaded = qkv::models::load_in(dir, dtype)?;
            let mut model = loaded.model;
            if dtype == DType::F32 {
                model.pack_weights();
            }
            if model.arch.decoder.is_some() {
                model.kv_dtype = kv_dtype;
            }
            let rows = model.arch.token_rows();
            let net = match model
                .info()
                .architecture
                .ends_with("ForSequenceClassification")
            {
                true => Net::Classifier(Box::new(SequenceClassifier::with_encoder(dir, model)?)),
                false => Net::Plain(Box::new(model)),
            };
            (net, loaded.parameters, loaded.dtypes, rows)
        }
    };
    let tokenizer = match net {
        Net::Classifier(_) => None,
        _ => Tokenizer::optional(dir)?
            .map(|t| t.fitting(rows))
            .transpose()?,
    };
    Ok(Model {
        net,
        tokenizer,
        chat_template: ChatTemplate::from_dir(dir)?,
        renderer: None,
        dir: dir.to_path_buf(),
        parameters,
        dtypes,
        vocabulary: std::sync::OnceLock::new(),
    })
}
