//! The methods of `Model` as Python sees them: a checkpoint folder's forward (with
//! every layer's attention weights), generation (generate.rs), attribution
//! (attribute.rs), sentence embeddings, classification (classify.rs), the tokenizer
//! and the chat template.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use qkv::models::generation_config::EarlyStopping;
use qkv::models::request::Request;
use qkv::models::{Head, Input, ModelKind, TokenBatch};
use qkv::Tensor;

use crate::arrays;
use crate::errors::OrPy;
use crate::generate;
use crate::ints::{self, Int};
use crate::model::Model;

/// `input_ids` `[B, T]` with an optional 0/1 `attention_mask` `[B, T]`.
fn batch(
    ids: &Bound<'_, PyAny>,
    name: &str,
    mask: Option<&Bound<'_, PyAny>>,
) -> PyResult<TokenBatch> {
    let (shape, ids) = arrays::ints(ids, name)?;
    let [b, t]: [usize; 2] = shape.as_slice().try_into().map_err(|_| {
        PyValueError::new_err(format!(
            "shape mismatch for `{name}`: expected [B, T], got {shape:?}"
        ))
    })?;
    let mask = match mask.filter(|m| !m.is_none()) {
        None => None,
        Some(m) => {
            let (mshape, values) = arrays::ints(m, "attention_mask")?;
            if mshape != shape {
                return Err(PyValueError::new_err(format!(
                    "shape mismatch for `attention_mask`: expected {shape:?} (as `{name}`), got {mshape:?}"
                )));
            }
            if let Some(i) = values.iter().position(|&x| x > 1) {
                return Err(PyValueError::new_err(format!(
                    "`attention_mask` must hold 0 or 1, got {} at flat index {i}",
                    values[i]
                )));
            }
            Some(values.iter().map(|&x| x == 1).collect())
        }
    };
    TokenBatch::new(ids, mask, b, t).or_py()
}

fn tensors<'py>(py: Python<'py>, list: Vec<Tensor>) -> PyResult<Bound<'py, PyList>> {
    let arrays = list
        .into_iter()
        .map(|t| {
            let shape = t.shape().to_vec();
            arrays::out(py, t.into_data(), &shape)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, arrays)
}

fn tensor<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let shape = t.shape().to_vec();
    Ok(arrays::out(py, t.into_data(), &shape)?.into_any())
}

fn stopping_rule(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<EarlyStopping>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if let Ok(flag) = obj.extract::<bool>() {
        return Ok(Some(match flag {
            true => EarlyStopping::Done,
            false => EarlyStopping::Heuristic,
        }));
    }
    match obj.extract::<String>().as_deref() {
        Ok("never") => Ok(Some(EarlyStopping::Never)),
        _ => Err(PyValueError::new_err(format!(
            "`early_stopping` must be True, False or \"never\", got {obj}"
        ))),
    }
}

#[pymethods]
impl Model {
    /// What the checkpoint is, as ``qkv inspect`` prints it: ``family``,
    /// ``architecture``, ``kind`` (``"encoder"``, ``"decoder"``, ``"encoder-decoder"``),
    /// ``layers``, ``decoder_layers``, ``hidden``, ``heads``,
    /// ``kv_heads``, ``head_dim``, ``ffn_dim``, ``vocab``, ``max_positions``,
    /// ``position``, ``norm``, ``ffn``, the special tokens (``bos_token_id``,
    /// ``eos_token_id`` as a list, ``pad_token_id``, ``decoder_start_token_id``),
    /// ``parameters``, ``dtypes`` (element counts by dtype on disk; empty for a
    /// sentence-transformers folder), ``dtype`` (what the linear layers compute in,
    /// as ``load`` was asked) and, for a classifier, ``labels`` (``id2label`` in order).
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = self.transformer().info();
        let d = PyDict::new(py);
        d.set_item("family", &i.family)?;
        d.set_item("architecture", &i.architecture)?;
        d.set_item(
            "kind",
            match self.transformer().kind() {
                ModelKind::Encoder => "encoder",
                ModelKind::Decoder => "decoder",
                ModelKind::EncoderDecoder => "encoder-decoder",
            },
        )?;
        d.set_item("layers", i.layers)?;
        d.set_item("decoder_layers", i.decoder_layers)?;
        d.set_item("hidden", i.hidden)?;
        d.set_item("heads", i.heads)?;
        d.set_item("kv_heads", i.kv_heads)?;
        d.set_item("head_dim", i.head_dim)?;
        d.set_item("ffn_dim", i.ffn_dim)?;
        d.set_item("vocab", i.vocab)?;
        d.set_item("max_positions", i.max_positions)?;
        d.set_item("position", &i.position)?;
        d.set_item("norm", &i.norm)?;
        d.set_item("ffn", &i.ffn)?;
        let special = self.transformer().special_tokens();
        d.set_item("bos_token_id", special.bos)?;
        d.set_item("eos_token_id", special.eos.clone())?;
        d.set_item("pad_token_id", special.pad)?;
        d.set_item("decoder_start_token_id", special.decoder_start)?;
        d.set_item("parameters", self.parameters)?;
        let dtypes = PyDict::new(py);
        for (name, n) in &self.dtypes {
            dtypes.set_item(name, n)?;
        }
        d.set_item("dtypes", dtypes)?;
        d.set_item("dtype", self.transformer().dtype().name())?;
        d.set_item("kv_dtype", self.transformer().kv_dtype.name())?;
        if let Some(c) = self.classifier() {
            d.set_item("labels", c.labels().to_vec())?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let i = self.transformer().info();
        format!(
            "qkv.Model({}, {} from {})",
            i.family,
            i.architecture,
            self.dir.display()
        )
    }

    /// One batch through the model, as transformers' ``model(...)``.
    ///
    /// Args:
    ///     input_ids: integers ``[B, T]`` (the encoder's tokens for an
    ///         encoder-decoder).
    ///     attention_mask: 0/1 ``[B, T]``, 0 for padding (left padding for decoders).
    ///     decoder_input_ids: integers ``[B, T2]``, needed by encoder-decoders.
    ///     token_type_ids: integers ``[B, T]``, BERT's segments.
    ///     output_attentions: also return every layer's attention weights.
    ///
    /// Returns:
    ///     A dict of float32 arrays. Decoders and encoder-decoders: ``logits``
    ///     ``[B, T, V]``. Encoders: ``last_hidden_state`` ``[B, T, C]``, and ``logits``
    ///     when the folder has a masked-LM head. With ``output_attentions``: a list of
    ///     ``[B, H, T, S]`` arrays per layer under ``attentions`` (encoder-only and
    ///     decoder-only models) or ``encoder_attentions``, ``decoder_attentions`` and
    ///     ``cross_attentions`` (encoder-decoders), as transformers names them.
    #[pyo3(signature = (input_ids, attention_mask=None, *, decoder_input_ids=None, token_type_ids=None, output_attentions=false))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        input_ids: &Bound<'py, PyAny>,
        attention_mask: Option<&Bound<'py, PyAny>>,
        decoder_input_ids: Option<&Bound<'py, PyAny>>,
        token_type_ids: Option<&Bound<'py, PyAny>>,
        output_attentions: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let m = self.transformer();
        let tokens = batch(input_ids, "input_ids", attention_mask)?;
        let types = match token_type_ids.filter(|t| !t.is_none()) {
            Some(t) => {
                let types = batch(t, "token_type_ids", None)?;
                if types.batch != tokens.batch || types.len != tokens.len {
                    return Err(PyValueError::new_err(format!(
                        "shape mismatch for `token_type_ids`: expected [{}, {}] (as `input_ids`), got [{}, {}]",
                        tokens.batch, tokens.len, types.batch, types.len
                    )));
                }
                Some(types.ids)
            }
            None => None,
        };
        let decoder = match decoder_input_ids.filter(|d| !d.is_none()) {
            Some(d) => Some(batch(d, "decoder_input_ids", None)?),
            None => None,
        };
        let out = PyDict::new(py);
        match m.kind() {
            ModelKind::Encoder => {
                let input = Input {
                    source: Some(&tokens),
                    token_types: types.as_deref(),
                    target: None,
                };
                let has_head = m.arch.head != Head::None;
                let hidden = py
                    .detach(|| m.hidden_states(&tokens, types.as_deref()))
                    .or_py()?;
                out.set_item("last_hidden_state", tensor(py, hidden)?)?;
                if has_head || output_attentions {
                    let run = py.detach(|| m.forward(&input, output_attentions)).or_py()?;
                    if has_head {
                        out.set_item("logits", tensor(py, run.logits)?)?;
                    }
                    if output_attentions {
                        out.set_item("attentions", tensors(py, run.attentions.encoder)?)?;
                    }
                }
            }
            ModelKind::Decoder => {
                if decoder.is_some() {
                    return Err(PyValueError::new_err(
                        "`decoder_input_ids` is for encoder-decoders; a decoder-only model reads `input_ids`",
                    ));
                }
                let input = Input {
                    target: Some(&tokens),
                    ..Default::default()
                };
                let run = py.detach(|| m.forward(&input, output_attentions)).or_py()?;
                out.set_item("logits", tensor(py, run.logits)?)?;
                if output_attentions {
                    out.set_item("attentions", tensors(py, run.attentions.decoder)?)?;
                }
            }
            ModelKind::EncoderDecoder => {
                let Some(decoder) = decoder else {
                    return Err(PyValueError::new_err(format!(
                        "{} is an encoder-decoder: it needs `decoder_input_ids`",
                        m.info().architecture
                    )));
                };
                let input = Input {
                    source: Some(&tokens),
                    token_types: None,
                    target: Some(&decoder),
                };
                let run = py.detach(|| m.forward(&input, output_attentions)).or_py()?;
                out.set_item("logits", tensor(py, run.logits)?)?;
                if output_attentions {
                    let a = run.attentions;
                    out.set_item("encoder_attentions", tensors(py, a.encoder)?)?;
                    out.set_item("decoder_attentions", tensors(py, a.decoder)?)?;
                    out.set_item("cross_attentions", tensors(py, a.cross)?)?;
                }
            }
        }
        Ok(out)
    }

    /// Continues a prompt (decoder-only models) or transforms a source sentence
    /// (encoder-decoders: a translation), with the options of ``qkv generate``. What
    /// the keywords leave open comes from the folder's ``generation_config.json``, as
    /// transformers' ``generate()`` reads it.
    ///
    /// Args:
    ///     prompt: text (needs the folder's tokenizer) or a list of token ids; or a
    ///         list of either.
    ///     messages: instead of ``prompt``, a conversation (``[{"role": ...,
    ///         "content": ...}, ...]``) made into the prompt by the folder's chat
    ///         template with the assistant's turn opened, as
    ///         ``apply_chat_template(messages, tokenize=True)``; the answer is text.
    ///     max_new_tokens: new tokens at most (default: the folder's
    ///         ``max_new_tokens``, or ``max_length`` less the prompt).
    ///     greedy: always take the most likely token, even where the folder samples.
    ///     num_beams: beam search with this many beams.
    ///     length_penalty: beam scores are divided by the length to this power.
    ///     early_stopping: ``True``, ``False`` or ``"never"``, as transformers.
    ///     temperature, top_k, top_p, min_p: sample (in this order of processing).
    ///     repetition_penalty: the logits of tokens already read or written divided
    ///         by it (multiplied when negative), as transformers applies it (default:
    ///         the folder's).
    ///     seed: the sampler's seed.
    ///     json_schema: hold the output to a JSON schema (a dict, or its JSON text):
    ///         the text is JSON valid under it, written compactly. One prompt.
    ///     grammar: hold the output to a grammar: llama.cpp's GBNF (``root ::= …``)
    ///         or llguidance's Lark dialect (``start: …``). One prompt.
    ///     stream: return an iterator over the output as it is made (one prompt
    ///         only): text pieces for a text prompt, as ``qkv generate`` prints
    ///         them, else token ids.
    ///
    /// ``prompt`` may also be a list of prompts (texts, or lists of ids), and the
    /// result is a list: a decoder's prompts run through the server's engine
    /// (continuous batching: each joins in chunks packed into the others' steps and
    /// leaves at its own end; prompt i samples with ``seed + i``), beam search and
    /// encoder-decoders as one left-padded batch.
    ///
    /// Returns:
    ///     The generated text when ``prompt`` is text, else the list of new token ids.
    #[pyo3(signature = (prompt=None, *, messages=None, max_new_tokens=None, greedy=false, num_beams=None, length_penalty=None, early_stopping=None, temperature=None, top_k=None, top_p=None, min_p=None, repetition_penalty=None, seed=Int::of(0), json_schema=None, grammar=None, stream=false))]
    #[pyo3(
        text_signature = "($self, prompt=None, *, messages=None, max_new_tokens=None, greedy=False, num_beams=None, length_penalty=None, early_stopping=None, temperature=None, top_k=None, top_p=None, min_p=None, repetition_penalty=None, seed=0, json_schema=None, grammar=None, stream=False)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        slf: &Bound<'py, Self>,
        prompt: Option<&Bound<'py, PyAny>>,
        messages: Option<&Bound<'py, PyAny>>,
        max_new_tokens: Option<Int>,
        greedy: bool,
        num_beams: Option<Int>,
        length_penalty: Option<f64>,
        early_stopping: Option<&Bound<'py, PyAny>>,
        temperature: Option<f64>,
        top_k: Option<Int>,
        top_p: Option<f64>,
        min_p: Option<f64>,
        repetition_penalty: Option<f64>,
        seed: Int,
        json_schema: Option<&Bound<'py, PyAny>>,
        grammar: Option<String>,
        stream: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = Request {
            max_new_tokens: ints::count(max_new_tokens, "max_new_tokens")?,
            greedy,
            num_beams: ints::count(num_beams, "num_beams")?,
            length_penalty: length_penalty.map(|p| p as f32),
            early_stopping: stopping_rule(early_stopping)?,
            temperature: temperature.map(|t| t as f32),
            top_k: ints::count(top_k, "top_k")?,
            top_p: top_p.map(|p| p as f32),
            min_p: min_p.map(|p| p as f32),
            seed: seed.seed("seed")?,
            repetition_penalty: repetition_penalty.map(|r| r as f32),
            ..Request::default()
        };
        let prompt = match (prompt, messages) {
            (Some(p), None) => generate::Prompt::Given(p),
            (None, Some(m)) => generate::Prompt::Chat(m),
            _ => {
                return Err(PyValueError::new_err(
                    "give `prompt` or `messages` (a conversation through the chat template), one of them",
                ))
            }
        };
        let grammar = generate::grammar_of(json_schema, grammar)?;
        generate::generate(slf, prompt, &request, grammar, stream)
    }

    /// What the model used on one text, by one attribution method.
    ///
    /// Args:
    ///     text: a str (through the folder's tokenizer) or a list of token ids; the
    ///         source of an encoder-decoder.
    ///     method: ``"weights"`` (the attention weights), ``"value-norm"`` (each weight
    ///         times the size of what its key adds), ``"rollout"`` and ``"flow"``
    ///         (Abnar & Zuidema 2020), ``"grad"`` (gradient × attention, Chefer et al.
    ///         2021) or ``"ablation"`` (the target's change when a token is hidden
    ///         from attention).
    ///     target: what grad and ablation explain (the others add ``scores`` for
    ///         it): by default a decoder's most likely next token, a masked-LM
    ///         encoder's most likely token at the first mask of the text; an int
    ///         names the token instead; a str, for a sentence-transformers folder, is
    ///         a text whose embedding's cosine with this one is the target.
    ///     decoder_input: encoder-decoders: the decoder's input, a text (the start
    ///         token is put before it) or ids (start token included).
    ///
    /// Returns:
    ///     A dict: ``method``; ``tokens`` (and ``target_tokens``), readable labels;
    ///     ``target`` (``kind``, ``position``, ``token``, ``value``) or None;
    ///     ``scores``, float32 ``[S]``, each input token's credit for the target
    ///     (ablation: the target minus the target without it), or None; and except
    ///     for ablation ``maps``: per attention (``encoder``, ``decoder``,
    ///     ``cross``) a list per layer of float32 ``[H, T, S]`` (weights, value-norm)
    ///     or ``[T, S]`` (rollout, flow and grad combine the heads).
    ///
    /// Raises:
    ///     ValueError: an unknown method, a method that needs a target the text does
    ///         not give, a token outside the vocabulary, a text past the positions.
    #[pyo3(signature = (text, *, method="weights", target=None, decoder_input=None))]
    fn attribute<'py>(
        &self,
        py: Python<'py>,
        text: &Bound<'py, PyAny>,
        method: &str,
        target: Option<&Bound<'py, PyAny>>,
        decoder_input: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::attribute::attribute(self, py, text, method, target, decoder_input)
    }

    /// Sentence embeddings, as sentence-transformers' ``encode`` computes them with the
    /// folder's pooling and normalisation.
    ///
    /// Args:
    ///     texts: the sentences.
    ///     batch_size: sentences per forward (default 32).
    ///
    /// Returns:
    ///     float32 ``[N, dim]``.
    ///
    /// Raises:
    ///     ValueError: the folder is not a sentence-transformers folder.
    #[pyo3(signature = (texts, *, batch_size=Int::of(32)))]
    #[pyo3(text_signature = "($self, texts, *, batch_size=32)")]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        batch_size: Int,
    ) -> PyResult<Bound<'py, PyAny>> {
        let batch_size = batch_size.at_least("batch_size", 1)?;
        let Some(encoder) = self.sentence() else {
            return Err(PyValueError::new_err(format!(
                "{} is not a sentence-transformers folder (no modules.json): it has no pooling to embed with",
                self.dir.display()
            )));
        };
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vectors = py
            .detach(|| encoder.embed_batched(&refs, batch_size))
            .or_py()?;
        let dim = encoder.dim();
        let flat: Vec<f32> = vectors.into_iter().flatten().collect();
        Ok(arrays::out(py, flat, &[texts.len(), dim])?.into_any())
    }

    /// Labels and scores of a ``…ForSequenceClassification`` folder (a sentiment or
    /// NLI classifier, a cross-encoder reranker), as transformers' text-classification
    /// pipeline scores them and ``qkv classify`` prints them: a softmax over the labels,
    /// a sigmoid for one label or ``problem_type: multi_label_classification``, the
    /// logits themselves for ``regression``.
    ///
    /// Args:
    ///     texts: the inputs.
    ///     pairs: a second text per input, read together with it (``[CLS] text [SEP]
    ///         pair [SEP]``), as a cross-encoder reads a query and a document.
    ///     truncate: an input longer than the model takes is cut to it with a
    ///         ``UserWarning`` (``"warn"``), without one (``"cut"``), or refused
    ///         (``"refuse"``, a ``ValueError`` naming it).
    ///
    /// Returns:
    ///     ``{"label": [str] * N, "score": float32 [N], "scores": float32 [N, L],
    ///     "logits": float32 [N, L]}``: the top label and its score, every label's
    ///     score in ``info["labels"]`` order, and the raw logits.
    ///
    /// Raises:
    ///     ValueError: the folder has no classification head, ``pairs`` and ``texts``
    ///         differ in length, or an input is too long under ``truncate="refuse"``.
    #[pyo3(signature = (texts, *, pairs=None, truncate="warn"))]
    #[pyo3(text_signature = "($self, texts, *, pairs=None, truncate='warn')")]
    fn classify<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        pairs: Option<Vec<String>>,
        truncate: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::classify::classify(self, py, texts, pairs, truncate)
    }

    /// Token ids of ``text`` with the folder's tokenizer (``add_special_tokens`` as
    /// transformers' default: BOS/EOS, [CLS]/[SEP] where the tokenizer adds them).
    #[pyo3(signature = (text, *, add_special_tokens=true))]
    fn encode(&self, text: &str, add_special_tokens: bool) -> PyResult<Vec<usize>> {
        self.tokenizer()?.encode(text, add_special_tokens).or_py()
    }

    /// Text of ``ids``, without special tokens.
    fn decode(&self, ids: Vec<Int>) -> PyResult<String> {
        let ids = ints::counts(ids, "ids")?;
        self.tokenizer()?.decode(&ids).or_py()
    }

    /// The prompt that the conversation ``messages`` (``[{"role": ..., "content":
    /// ...}, ...]``) makes through the folder's chat template, as transformers'
    /// ``tokenizer.apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)``; with ``tokenize=True``, its token ids (no special
    /// tokens added: the template writes them). Other keywords (``tools``,
    /// ``date_string``, …) are passed to the template.
    ///
    /// Raises:
    ///     ValueError: the folder has no chat template (``chat_template.jinja``, or
    ///         ``chat_template`` in ``tokenizer_config.json``), the messages are not
    ///         JSON, or the template refuses them (its ``raise_exception``).
    #[pyo3(signature = (messages, *, add_generation_prompt=true, tokenize=false, **kwargs))]
    fn apply_chat_template<'py>(
        &self,
        py: Python<'py>,
        messages: &Bound<'py, PyAny>,
        add_generation_prompt: bool,
        tokenize: bool,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let text = self.chat_prompt(py, messages, add_generation_prompt, kwargs)?;
        match tokenize {
            false => Ok(text.into_pyobject(py)?.into_any()),
            true => {
                let ids = self.tokenizer()?.encode(&text, false).or_py()?;
                Ok(PyList::new(py, ids)?.into_any())
            }
        }
    }
}
