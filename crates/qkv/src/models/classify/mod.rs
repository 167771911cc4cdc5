//! Sequence classification as `*ForSequenceClassification` computes it: the encoder's
//! last hidden state of the first token (`[CLS]`, `<s>`; or the mean over the tokens,
//! as ModernBERT's `classifier_pooling: mean` asks), a dense layer and its activation
//! (and ModernBERT's LayerNorm), then one logit per label (`head.rs`). Cross-encoder rerankers (the ms-marco MiniLM
//! ones) are such models with one label, read on a query and a document together.
//!
//! Scores follow the tool a user would compare with:
//! - [`SequenceClassifier::classify`] scores as transformers' text-classification
//!   pipeline: no function for `problem_type: regression`, a sigmoid for multi-label
//!   models or one label, else a softmax;
//! - [`SequenceClassifier::rerank`] as sentence-transformers' `CrossEncoder.predict`:
//!   the config's `sentence_transformers.activation_fn` where it names one, else a
//!   sigmoid for one label.

use std::path::Path;

use serde::Deserialize;

mod head;
mod policy;

use head::{Head, HeadSettings};
pub use policy::Truncate;
use policy::{first_max, judge_lengths};

use super::folder::load_in;
use super::net::arch::ModelKind;
use super::transformer::Transformer;
use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::io::{bad_field, read_config, read_json_or_default};
use crate::tensor::Tensor;
use crate::text::Tokenizer;
use crate::weights::DType;

/// Inputs per forward pass, the pipeline's and `CrossEncoder`'s default batch.
const BATCH: usize = 32;

/// The function that turns a row of logits into scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    Softmax,
    Sigmoid,
    /// The logits themselves (regression).
    Identity,
}

impl Scoring {
    /// `logits` `[L]` → scores `[L]`.
    pub fn apply(self, logits: &[f32]) -> Vec<f32> {
        match self {
            Scoring::Identity => logits.to_vec(),
            Scoring::Sigmoid => logits.iter().map(|z| 1.0 / (1.0 + (-z).exp())).collect(),
            Scoring::Softmax => {
                let mut p = logits.to_vec();
                crate::ops::softmax_rows(&mut p, logits.len());
                p
            }
        }
    }
}

/// An encoder with a sequence-classification head, and the folder's tokenizer.
pub struct SequenceClassifier {
    dir: std::path::PathBuf,
    model: Transformer,
    tokenizer: Option<Tokenizer>,
    pad_id: usize,
    max_len: usize,
    head: Head,
    labels: Vec<String>,
    scoring: Scoring,
    rerank_scoring: Scoring,
}

/// The fields of `config.json` the head's outputs are named and scored by.
#[derive(Deserialize, Default)]
#[serde(default)]
struct HeadConfig {
    id2label: std::collections::BTreeMap<String, String>,
    problem_type: Option<String>,
    sentence_transformers: Option<CrossEncoderConfig>,
    /// sentence-transformers before 4.0 kept the activation here
    sbert_ce_default_activation_function: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CrossEncoderConfig {
    activation_fn: Option<String>,
}

/// `tokenizer_config.json`'s length limit, where it gives a real one.
#[derive(Deserialize, Default)]
#[serde(default)]
struct LengthOnly {
    model_max_length: Option<f64>,
}

impl SequenceClassifier {
    /// Loads the `…ForSequenceClassification` folder `dir`, its encoder's linear layers
    /// in `dtype` ([`crate::models::load_in`]).
    pub fn load(dir: &Path, dtype: DType) -> Result<Self> {
        if crate::io::gguf::is_gguf(dir) {
            return Err(Error::Unsupported(format!(
                "{}: a GGUF file holds no sequence-classification head; give the Hugging Face folder",
                dir.display()
            )));
        }
        Self::with_encoder(dir, load_in(dir, dtype)?.model)
    }

    /// The classifier of the folder `dir` whose encoder `model` is already loaded (as
    /// [`crate::models::load_in`] reads it): the head, labels, scoring and tokenizer are
    /// read from the folder.
    pub fn with_encoder(dir: &Path, model: Transformer) -> Result<Self> {
        let family = model.family;
        let layout = family
            .def()
            .classifier
            .filter(|_| model.kind() == ModelKind::Encoder);
        let Some(layout) = layout else {
            return Err(Error::Unsupported(format!(
                "{}: `{}` has no sequence-classification head qkv reads (BERT, RoBERTa, XLM-RoBERTa, DistilBERT and ModernBERT have)",
                dir.display(),
                model.info().architecture
            )));
        };
        let c = model.arch.d_model;
        let head = Head::read(dir, &layout, c, &read_config::<HeadSettings>(dir)?)?;
        let cfg: HeadConfig = read_config(dir)?;
        let labels = read_labels(dir, &cfg.id2label, head.out.out_features())?;
        let scoring = match cfg.problem_type.as_deref() {
            Some("regression") => Scoring::Identity,
            Some("multi_label_classification") => Scoring::Sigmoid,
            _ if labels.len() == 1 => Scoring::Sigmoid,
            _ => Scoring::Softmax,
        };
        let named = cfg
            .sentence_transformers
            .and_then(|s| s.activation_fn)
            .or(cfg.sbert_ce_default_activation_function);
        let rerank_scoring = match named.as_deref() {
            None if labels.len() == 1 => Scoring::Sigmoid,
            None => Scoring::Identity,
            Some(name) => cross_encoder_activation(dir, name)?,
        };
        let tokenizer = Tokenizer::optional(dir)?
            .map(|t| t.fitting(model.arch.token_rows()))
            .transpose()?;
        let positions = model.info().max_positions.unwrap_or(usize::MAX);
        let limit: LengthOnly = read_json_or_default(&dir.join("tokenizer_config.json"))?;
        let max_len = limit
            .model_max_length
            .filter(|&n| n >= 1.0 && n < positions as f64)
            .map_or(positions, |n| n as usize);
        let pad_id = model.special_tokens().pad.unwrap_or(0);
        Ok(SequenceClassifier {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            pad_id,
            max_len,
            head,
            labels,
            scoring,
            rerank_scoring,
        })
    }

    /// The label of each output, from `id2label` (`LABEL_i` where the config has none).
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// How [`SequenceClassifier::classify`] scores: transformers' pipeline's rule.
    pub fn scoring(&self) -> Scoring {
        self.scoring
    }

    /// Inputs are cut to this many tokens, special tokens included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn encoder(&self) -> &Transformer {
        &self.model
    }

    /// Logits `[B, L]` of a right-padded batch whose rows each start with the token the
    /// head reads (`[CLS]`, `<s>`); `types` `[B·T]` are segment ids, for a model that
    /// has token types.
    pub fn logits(&self, batch: &TokenBatch, types: Option<&[usize]>) -> Result<Tensor> {
        let types = types.filter(|_| self.model.arch.embed.token_types > 0);
        let h = self.model.hidden_states(batch, types)?;
        self.head.forward(&h, batch)
    }

    /// Logits, one row of [`SequenceClassifier::labels`]' length per input: a text, or
    /// a pair read together (`[CLS] A [SEP] B [SEP]`), each cut to
    /// [`SequenceClassifier::max_len`] tokens longest text first.
    pub fn classify(&self, inputs: &[(&str, Option<&str>)]) -> Result<Vec<Vec<f32>>> {
        let mut rows = Vec::with_capacity(inputs.len());
        for chunk in inputs.chunks(BATCH) {
            let (batch, types) = self.tokenize(chunk)?;
            let logits = self.logits(&batch, Some(&types))?;
            rows.extend(
                logits
                    .data()
                    .chunks_exact(self.labels.len())
                    .map(<[f32]>::to_vec),
            );
        }
        Ok(rows)
    }

    /// The folder's tokenizer, where it has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The folder's tokenizer, which texts need (token ids do not).
    fn text_tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: no tokenizer (tokenizer.json) in the folder; it scores token ids only",
                self.dir.display()
            ))
        })
    }

    /// The inputs [`SequenceClassifier::classify`] would cut: (index, tokens before the
    /// cut) of each longer than [`SequenceClassifier::max_len`].
    pub fn overlong(&self, inputs: &[(&str, Option<&str>)]) -> Result<Vec<(usize, usize)>> {
        let tokenizer = self.text_tokenizer()?;
        let mut long = Vec::new();
        for (i, &(a, b)) in inputs.iter().enumerate() {
            let n = tokenizer.pair_len(a, b)?;
            if n > self.max_len {
                long.push((i, n));
            }
        }
        Ok(long)
    }

    /// Applies `policy` to `inputs` ahead of [`SequenceClassifier::classify`]: the
    /// warnings to show, one per input longer than the model takes (none under `Cut`,
    /// which tokenizes nothing for it), or under `Refuse` an error for the first such
    /// input. `name(i)` names input `i` as the caller's user knows it (`--text 2`,
    /// `text 1`, `--input row 7`).
    pub fn check_lengths(
        &self,
        inputs: &[(&str, Option<&str>)],
        policy: Truncate,
        name: impl Fn(usize) -> String,
    ) -> Result<Vec<String>> {
        if policy == Truncate::Cut {
            return Ok(Vec::new());
        }
        judge_lengths(policy, self.max_len, &self.overlong(inputs)?, name)
    }

    /// The label a row of [`SequenceClassifier::labels`]' scores names and its score:
    /// the top one, the first of equals (as `argmax` and transformers' pipeline take
    /// it); a NaN never wins.
    pub fn top(&self, scores: &[f32]) -> (&str, f32) {
        let best = first_max(scores);
        let label = self.labels.get(best).map_or("", String::as_str);
        (label, scores.get(best).copied().unwrap_or(f32::NAN))
    }

    /// The batch and segment ids [`SequenceClassifier::classify`] runs for `inputs`.
    pub fn tokenize(&self, inputs: &[(&str, Option<&str>)]) -> Result<(TokenBatch, Vec<usize>)> {
        let tokenizer = self.text_tokenizer()?;
        tokenizer.encode_pairs(inputs, self.pad_id, self.max_len)
    }

    /// Relevance of each document to `query`, as `CrossEncoder.predict` scores the pairs
    /// (query, document). The model must have one output.
    pub fn rerank(&self, query: &str, docs: &[&str]) -> Result<Vec<f32>> {
        self.check_reranker()?;
        let pairs: Vec<(&str, Option<&str>)> = docs.iter().map(|d| (query, Some(*d))).collect();
        Ok(self.relevance(&self.classify(&pairs)?))
    }

    /// Refuses a model of several labels as a reranker: its relevance is no one number.
    pub fn check_reranker(&self) -> Result<()> {
        match self.labels.len() {
            1 => Ok(()),
            n => Err(Error::Unsupported(format!(
                "reranking needs a cross-encoder of one output; this model has {n} labels ({})",
                self.labels.join(", ")
            ))),
        }
    }

    /// Each row of one-output logits as a relevance score, under `CrossEncoder`'s
    /// activation (see the module docs).
    pub fn relevance(&self, logits: &[Vec<f32>]) -> Vec<f32> {
        logits
            .iter()
            .map(|row| self.rerank_scoring.apply(&row[..1])[0])
            .collect()
    }
}

/// `id2label` as a list of `n` names, `LABEL_i` where the config gives none; a map of
/// another size or with other keys is an error naming the field.
fn read_labels(
    dir: &Path,
    id2label: &std::collections::BTreeMap<String, String>,
    n: usize,
) -> Result<Vec<String>> {
    if id2label.is_empty() {
        return Ok((0..n).map(|i| format!("LABEL_{i}")).collect());
    }
    if id2label.len() != n {
        return Err(bad_field(
            dir,
            "id2label",
            format!("{} names for a head of {n} outputs", id2label.len()),
        ));
    }
    (0..n)
        .map(|i| {
            id2label.get(&i.to_string()).cloned().ok_or_else(|| {
                bad_field(
                    dir,
                    "id2label",
                    format!("no name for label {i} of the head's {n} outputs"),
                )
            })
        })
        .collect()
}

/// The activation a cross-encoder's config names by its torch path.
fn cross_encoder_activation(dir: &Path, name: &str) -> Result<Scoring> {
    match name.rsplit('.').next() {
        Some("Sigmoid") => Ok(Scoring::Sigmoid),
        Some("Identity") => Ok(Scoring::Identity),
        _ => Err(bad_field(
            dir,
            "sentence_transformers.activation_fn",
            format!("`{name}`: qkv scores with torch's Sigmoid or Identity"),
        )),
    }
}
