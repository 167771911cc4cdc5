//! A `…ForSequenceClassification` head as its checkpoint stores it (see
//! [`ClassifierLayout`]): the pooled last hidden state `[B, C]` → dense → activation →
//! LayerNorm (ModernBERT) → out `[B, L]`.

use std::path::Path;

use serde::Deserialize;

use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::io::{bad_field, Checkpoint};
use crate::layers::{Linear, Norm};
use crate::models::families::{ClassifierLayout, PoolActivation};
use crate::ops::Activation;
use crate::tensor::Tensor;

/// The `config.json` fields of ModernBERT's head, with `ModernBertConfig`'s defaults.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct HeadSettings {
    /// `cls` (the first token) or `mean` (over the real tokens)
    classifier_pooling: Option<String>,
    classifier_activation: Option<String>,
    /// whether the dense layer has a bias (ModernBERT's default: no)
    classifier_bias: Option<bool>,
    norm_eps: Option<f64>,
}

/// How a row's hidden states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pooling {
    /// The first token's (`[CLS]`, `<s>`): rows must not start with padding.
    First,
    /// The mean over the row's real tokens.
    Mean,
}

/// The activation after the dense layer.
#[derive(Clone, Copy, Debug)]
enum HeadActivation {
    Tanh,
    Hf(Activation),
}

pub(super) struct Head {
    pooling: Pooling,
    /// `[C] → [C]`, BERT's pooler or the head's own dense layer
    dense: Linear,
    activation: HeadActivation,
    norm: Option<Norm>,
    /// `[C] → [L]`
    pub out: Linear,
}

impl Head {
    /// The head of the folder `dir` laid out as `layout`, for hidden states of width `c`.
    pub fn read(dir: &Path, layout: &ClassifierLayout, c: usize, s: &HeadSettings) -> Result<Self> {
        let ckpt = Checkpoint::open(dir)?;
        let get = |name: String| -> Result<Tensor> {
            match ckpt.has(&name) {
                true => ckpt.tensor(&name),
                false => Err(Error::Unsupported(format!(
                    "{}: tensor `{name}` not found: not a sequence-classification checkpoint (`…ForSequenceClassification`)",
                    dir.display()
                ))),
            }
        };
        let shaped = |name: String, shape: &[usize]| -> Result<Tensor> {
            let t = get(name.clone())?;
            match t.shape() == shape && shape.iter().all(|&n| n > 0) {
                true => Ok(t),
                false => Err(Error::Shape {
                    tensor: format!("{} in {}", name, dir.display()),
                    expected: format!("{shape:?}"),
                    got: t.shape().to_vec(),
                }),
            }
        };
        let dense_weight = shaped(format!("{}.weight", layout.dense), &[c, c])?;
        let dense_bias = match s.classifier_bias {
            Some(false) => None,
            _ => Some(shaped(format!("{}.bias", layout.dense), &[c])?),
        };
        let dense = Linear::new(dense_weight, dense_bias)?;
        let activation = match layout.activation {
            PoolActivation::Tanh => HeadActivation::Tanh,
            PoolActivation::Relu => HeadActivation::Hf(Activation::Relu),
            PoolActivation::Configured => {
                let name = s.classifier_activation.as_deref().unwrap_or("gelu");
                HeadActivation::Hf(
                    Activation::from_hf_name(name)
                        .map_err(|e| bad_field(dir, "classifier_activation", e.to_string()))?,
                )
            }
        };
        let norm = match layout.norm {
            None => None,
            Some(name) => {
                let bias_name = format!("{name}.bias");
                let bias = match ckpt.has(&bias_name) {
                    true => Some(shaped(bias_name, &[c])?),
                    false => None,
                };
                let eps = crate::io::epsilon(dir, "norm_eps", s.norm_eps.unwrap_or(1e-5))?;
                Some(Norm::layer_norm(
                    shaped(format!("{name}.weight"), &[c])?,
                    bias,
                    eps,
                )?)
            }
        };
        let pooling = match s.classifier_pooling.as_deref() {
            None | Some("cls") => Pooling::First,
            Some("mean") => Pooling::Mean,
            Some(other) => {
                return Err(bad_field(
                    dir,
                    "classifier_pooling",
                    format!("`{other}`: transformers pools by `cls` or `mean`"),
                ))
            }
        };
        let out_weight = format!("{}.weight", layout.out);
        let labels = get(out_weight.clone())?
            .shape()
            .first()
            .copied()
            .unwrap_or(0);
        let out = Linear::new(
            shaped(out_weight, &[labels, c])?,
            Some(shaped(format!("{}.bias", layout.out), &[labels])?),
        )?;
        Ok(Head {
            pooling,
            dense,
            activation,
            norm,
            out,
        })
    }

    /// Logits `[B, L]` from the encoder's last hidden states `h` `[B, T, C]` of `batch`.
    pub fn forward(&self, h: &Tensor, batch: &TokenBatch) -> Result<Tensor> {
        let c = h.last_dim();
        let t = batch.len;
        let pooled: Vec<f32> = match self.pooling {
            Pooling::First => {
                if let Some(b) = (0..batch.batch).find(|&b| !batch.mask[b * t]) {
                    return Err(Error::invalid(
                        "attention_mask",
                        format!("row {b} starts with padding; the head reads the first token, so pad on the right"),
                    ));
                }
                h.data()
                    .chunks_exact(t * c)
                    .flat_map(|row| &row[..c])
                    .copied()
                    .collect()
            }
            // Σ_t m_t·h_t / Σ_t m_t over each row's real tokens
            Pooling::Mean => (0..batch.batch)
                .flat_map(|b| {
                    let mask = &batch.mask[b * t..(b + 1) * t];
                    let real = mask.iter().filter(|&&m| m).count().max(1) as f32;
                    let rows = &h.data()[b * t * c..(b + 1) * t * c];
                    (0..c).map(move |j| {
                        let sum: f32 = (0..t).filter(|&i| mask[i]).map(|i| rows[i * c + j]).sum();
                        sum / real
                    })
                })
                .collect(),
        };
        let mut z = self
            .dense
            .forward(&Tensor::new(&[batch.batch, c], pooled)?)?;
        match self.activation {
            HeadActivation::Tanh => z.data_mut().iter_mut().for_each(|x| *x = x.tanh()),
            HeadActivation::Hf(a) => a.apply_slice(z.data_mut()),
        }
        if let Some(norm) = &self.norm {
            z = norm.forward(&z)?;
        }
        self.out.forward(&z)
    }
}
