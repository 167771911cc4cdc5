//! The recurrent models of [`crate::rnn`] as [`TrainableModel`]s, so they train through
//! the same trainer, tasks and checkpoints as the Transformers.
//!
//! - [`RecurrentKind::Lm`] reads each row as a Transformer decoder does and predicts
//!   every next token from its state.
//! - [`RecurrentKind::Seq2Seq`] and [`RecurrentKind::Seq2SeqAttention`] split each row
//!   at the task's separator ([`source_target_batch`]): the tokens before it are the
//!   encoder's source, the separator and the answer the decoder's inputs. Their logits
//!   are laid out over the whole row (zeros at the source positions, which are never
//!   scored), so the loss and the accuracy are those of the row as the task scores it.
//!
//! A saved model is `config.json` (`"architectures": ["QkvRecurrent"]` and the
//! [`RecurrentSpec`]) and `model.safetensors` under the parameter paths.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{Error, Result};
use crate::io::{write_atomic, Checkpoint};
use crate::layers::{Embedding, Linear};
use crate::module::{Module, Path as ParamPath};
use crate::rng::Rng;
use crate::rnn::{Additive, Elman, ElmanLayer, RnnLm, RnnSeq2Seq, Seq2SeqInput};
use crate::tensor::Tensor;
use crate::train::loss::cross_entropy_in_place;
use crate::train::tasks::source_target_batch;
use crate::train::trainable::{Batch, TrainableModel};

/// The `architectures` entry of a saved recurrent model's config.json.
pub const ARCHITECTURE: &str = "QkvRecurrent";

/// Which recurrent model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecurrentKind {
    /// an Elman language model over the whole row
    #[serde(rename = "lm")]
    Lm,
    /// the 2014 encoder-decoder: the context is the encoder's final state
    #[serde(rename = "seq2seq")]
    Seq2Seq,
    /// the encoder-decoder with Bahdanau's additive attention
    #[serde(rename = "seq2seq_attention")]
    Seq2SeqAttention,
}

/// Everything that shapes a recurrent model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecurrentSpec {
    pub kind: RecurrentKind,
    /// V, shared by source and target
    pub vocab: usize,
    /// E
    pub embedding: usize,
    /// Hd
    pub hidden: usize,
    /// layers of the Elman stack (the encoder's, for the encoder-decoders)
    pub layers: usize,
    /// A, the additive attention's width (encoder-decoder with attention)
    pub attention_width: usize,
    /// the token that ends the source (encoder-decoders)
    pub separator: Option<usize>,
}

/// The model and its gradients.
#[derive(Clone, Debug)]
enum Net {
    Lm(Box<RnnLm>),
    Seq2Seq(Box<RnnSeq2Seq>),
}

impl Module for Net {
    fn visit<'a>(&'a self, path: &mut ParamPath, f: &mut dyn FnMut(&str, &'a Tensor)) {
        match self {
            Net::Lm(m) => m.visit(path, f),
            Net::Seq2Seq(m) => m.visit(path, f),
        }
    }

    fn visit_mut<'a>(&'a mut self, path: &mut ParamPath, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        match self {
            Net::Lm(m) => m.visit_mut(path, f),
            Net::Seq2Seq(m) => m.visit_mut(path, f),
        }
    }
}

/// A recurrent model the trainer can optimise.
#[derive(Clone, Debug)]
pub struct RecurrentModel {
    spec: RecurrentSpec,
    net: Net,
    grads: Option<Net>,
}

impl RecurrentModel {
    /// A new model of `spec`, its weights drawn from `seed`: embeddings ~ N(0, 1), the
    /// other matrices ~ N(0, 1/fan_in) (PyTorch's uniform ±1/√fan_in has variance
    /// 1/(3·fan_in); these start a little livelier), biases zero.
    pub fn new(spec: &RecurrentSpec, seed: u64) -> Result<Self> {
        check_spec(spec)?;
        let mut rng = Rng::new(seed);
        let net = build(spec, &mut |shape: &[usize], kind: Init| match kind {
            Init::Embedding => rng.tensor(shape, 1.0),
            Init::Matrix => rng.tensor(shape, 1.0 / (shape[1] as f32).sqrt()),
            Init::Vector => Tensor::zeros(shape),
            Init::Score => rng.tensor(shape, 1.0 / (shape[0] as f32).sqrt()),
        })?;
        Ok(RecurrentModel {
            spec: spec.clone(),
            net,
            grads: None,
        })
    }

    pub fn spec(&self) -> &RecurrentSpec {
        &self.spec
    }

    /// The language model, when this is one.
    pub fn lm(&self) -> Option<&RnnLm> {
        match &self.net {
            Net::Lm(m) => Some(m),
            Net::Seq2Seq(_) => None,
        }
    }

    /// Whether `dir/config.json` names a recurrent model (its `architectures`).
    pub fn is_saved_in(dir: &Path) -> bool {
        crate::io::read_regular_text(&dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|c| c["architectures"][0] == ARCHITECTURE)
    }

    /// Reads a folder written by [`TrainableModel::save`].
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = crate::io::read_regular_text(&path)?;
        let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.display().to_string(),
            field: "(file)".into(),
            reason: e.to_string(),
        })?;
        let spec: RecurrentSpec =
            serde_json::from_value(config["qkv_recurrent"].clone()).map_err(|e| Error::Config {
                path: path.display().to_string(),
                field: "qkv_recurrent".into(),
                reason: e.to_string(),
            })?;
        check_spec(&spec)?;
        let ckpt = Checkpoint::open(dir)?;
        let mut failure = None;
        let mut net = build(&spec, &mut |shape: &[usize], _| Tensor::zeros(shape))?;
        net.visit_mut(&mut ParamPath::default(), &mut |name, t| {
            if failure.is_none() {
                match ckpt.tensor_shaped(name, t.shape()) {
                    Ok(read) => *t = read,
                    Err(e) => failure = Some(e),
                }
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(RecurrentModel {
            spec,
            net,
            grads: None,
        })
    }

    /// The split batch of an encoder-decoder, and the source length k.
    fn split(&self, batch: &Batch) -> Result<(Batch, usize)> {
        let sep = self
            .spec
            .separator
            .expect("checked: encoder-decoders have one");
        let split = source_target_batch(batch, sep)?;
        let k = split.source.as_ref().map_or(0, |s| s.len);
        Ok((split, k))
    }

    /// Logits `[B, T, V]` over the batch's rows, and what the backward needs.
    fn run(&self, batch: &Batch) -> Result<(Tensor, Tape)> {
        let lengths = row_lengths(batch)?;
        match &self.net {
            Net::Lm(m) => {
                let (logits, cache) = m.forward(&batch.inputs, batch.batch, lengths.as_deref())?;
                Ok((logits, Tape::Lm(cache)))
            }
            Net::Seq2Seq(m) => {
                if lengths.is_some() {
                    return Err(Error::Unsupported(
                        "padded rows for the recurrent encoder-decoder (the tasks have none)"
                            .into(),
                    ));
                }
                let (split, k) = self.split(batch)?;
                let source = split.source.as_ref().expect("split batches have a source");
                let source_lengths = vec![k; batch.batch];
                let input = Seq2SeqInput {
                    source: &source.ids,
                    source_lengths: &source_lengths,
                    target: &split.inputs,
                    batch: batch.batch,
                };
                let (dec_logits, cache) = m.forward(&input)?;
                // the decoder's step i is the row's position k + i
                let (t_n, v) = (batch.len, self.spec.vocab);
                let mut logits = Tensor::zeros(&[batch.batch, t_n, v]);
                for (b, rows) in dec_logits.data().chunks_exact((t_n - k) * v).enumerate() {
                    logits.data_mut()[(b * t_n + k) * v..(b + 1) * t_n * v].copy_from_slice(rows);
                }
                Ok((logits, Tape::Seq2Seq(cache, k)))
            }
        }
    }
}

/// The forward's record for the backward.
enum Tape {
    Lm(crate::rnn::lm::RnnLmCache),
    Seq2Seq(crate::rnn::Seq2SeqCache, usize),
}

/// Row lengths from a right-padded mask (`None` when every token is real).
fn row_lengths(batch: &Batch) -> Result<Option<Vec<usize>>> {
    let Some(mask) = &batch.mask else {
        return Ok(None);
    };
    let lengths = mask
        .chunks_exact(batch.len)
        .enumerate()
        .map(|(r, row)| {
            let n = row.iter().take_while(|&&m| m).count();
            if n == 0 || row[n..].contains(&true) {
                Err(Error::invalid(
                    "batch.mask",
                    format!("row {r}: a recurrent model needs real tokens first, then padding"),
                ))
            } else {
                Ok(n)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(lengths))
}

/// How a parameter is drawn.
#[derive(Clone, Copy)]
enum Init {
    Embedding,
    /// `[out, in]`
    Matrix,
    /// biases
    Vector,
    /// the additive attention's v `[A]`
    Score,
}

fn check_spec(s: &RecurrentSpec) -> Result<()> {
    let sizes = [
        ("vocab", s.vocab),
        ("embedding", s.embedding),
        ("hidden", s.hidden),
        ("layers", s.layers),
    ];
    if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
        return Err(Error::invalid(
            format!("recurrent {name}"),
            "must be at least 1",
        ));
    }
    match (s.kind, s.separator) {
        (RecurrentKind::Lm, _) => Ok(()),
        (_, None) => Err(Error::invalid(
            "recurrent separator",
            "an encoder-decoder splits each row at a separator token; this data has none \
             (a task with a source: copy, reverse, sort, recall)",
        )),
        (RecurrentKind::Seq2SeqAttention, _) if s.attention_width == 0 => Err(Error::invalid(
            "recurrent attention_width",
            "must be at least 1",
        )),
        (_, Some(sep)) if sep >= s.vocab => Err(Error::OutOfRange {
            what: "recurrent separator".into(),
            index: sep,
            size: s.vocab,
        }),
        _ => Ok(()),
    }
}

/// The model of `spec`, each tensor made by `make(shape, how)`.
fn build(spec: &RecurrentSpec, make: &mut dyn FnMut(&[usize], Init) -> Tensor) -> Result<Net> {
    let (v, e, hd) = (spec.vocab, spec.embedding, spec.hidden);
    let layer = |fan_in: usize, make: &mut dyn FnMut(&[usize], Init) -> Tensor| ElmanLayer {
        weight_ih: make(&[hd, fan_in], Init::Matrix),
        weight_hh: make(&[hd, hd], Init::Matrix),
        bias_ih: make(&[hd], Init::Vector),
        bias_hh: make(&[hd], Init::Vector),
    };
    let embed = Embedding::new(make(&[v, e], Init::Embedding))?;
    let stack = Elman::new(
        (0..spec.layers)
            .map(|k| layer(if k == 0 { e } else { hd }, make))
            .collect(),
    )?;
    Ok(match spec.kind {
        RecurrentKind::Lm => Net::Lm(Box::new(RnnLm::new(
            embed,
            stack,
            Linear::new(make(&[v, hd], Init::Matrix), Some(make(&[v], Init::Vector)))?,
        )?)),
        RecurrentKind::Seq2Seq | RecurrentKind::Seq2SeqAttention => {
            let target_embed = Embedding::new(make(&[v, e], Init::Embedding))?;
            let decoder = layer(e + hd, make);
            let attention = (spec.kind == RecurrentKind::Seq2SeqAttention)
                .then(|| {
                    let a = spec.attention_width;
                    Additive::new(
                        make(&[a, hd], Init::Matrix),
                        make(&[a, hd], Init::Matrix),
                        make(&[a], Init::Vector),
                        make(&[a], Init::Score),
                    )
                })
                .transpose()?;
            let out = Linear::new(
                make(&[v, 2 * hd], Init::Matrix),
                Some(make(&[v], Init::Vector)),
            )?;
            Net::Seq2Seq(Box::new(RnnSeq2Seq::new(
                embed,
                target_embed,
                stack,
                decoder,
                attention,
                out,
            )?))
        }
    })
}

impl TrainableModel for RecurrentModel {
    fn zero_grads(&mut self) {
        self.net.zero_grads_in(&mut self.grads);
    }

    fn loss_and_backward(&mut self, batch: &Batch) -> Result<f32> {
        let (mut logits, tape) = self.run(batch)?;
        let loss = cross_entropy_in_place(&mut logits, &batch.targets)?;
        if !loss.is_finite() {
            return Ok(loss);
        }
        let grads = self.grads.get_or_insert_with(|| self.net.zeros_like());
        match (&self.net, grads, tape) {
            (Net::Lm(m), Net::Lm(g), Tape::Lm(cache)) => m.backward(&cache, &logits, g),
            (Net::Seq2Seq(m), Net::Seq2Seq(g), Tape::Seq2Seq(cache, k)) => {
                // the decoder's part of d logits: positions k.. of every row
                let (b_n, t_n, v) = (batch.batch, batch.len, self.spec.vocab);
                let d: Vec<f32> = logits
                    .data()
                    .chunks_exact(t_n * v)
                    .flat_map(|row| row[k * v..].iter().copied())
                    .collect();
                m.backward(&cache, &Tensor::new(&[b_n, t_n - k, v], d)?, g)
            }
            _ => unreachable!("the tape comes from this model's own forward"),
        }?;
        Ok(loss)
    }

    fn logits(&self, batch: &Batch) -> Result<Tensor> {
        self.run(batch).map(|(logits, _)| logits)
    }

    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        let grads = self.grads.get_or_insert_with(|| self.net.zeros_like());
        let mut g = Vec::new();
        grads.visit(&mut ParamPath::default(), &mut |_, t| g.push(t));
        let mut g = g.into_iter();
        self.net
            .visit_mut(&mut ParamPath::default(), &mut |name, p| {
                f(name, p, g.next().expect("one gradient per parameter"))
            });
    }

    fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let params = self.net.params();
        crate::io::save(&dir.join("model.safetensors"), &params_refs(&params), None)?;
        let config = json!({
            "architectures": [ARCHITECTURE],
            "vocab_size": self.spec.vocab,
            "qkv_recurrent": self.spec,
        });
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serialises");
        write_atomic(&dir.join("config.json"), format!("{text}\n").as_bytes())
    }
}

fn params_refs<'a>(params: &'a [(String, &'a Tensor)]) -> Vec<(&'a str, &'a Tensor)> {
    params.iter().map(|(n, t)| (n.as_str(), *t)).collect()
}
