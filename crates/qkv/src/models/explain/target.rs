//! The scalar an attribution explains, read from one forward's logits (a headless
//! encoder's hidden states), and its gradient with respect to them.

use crate::error::{Error, Result};
use crate::models::net::arch::{Head, ModelKind};
use crate::models::sentence::{pool, PoolingMode};
use crate::models::transformer::Transformer;
use crate::tensor::Tensor;
use crate::text::Tokenizer;

/// What the model's output is asked about.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// Decoders and encoder-decoders: log p(token) of the token after the last position
    /// of the (decoder's) input; `None`, the most likely one there.
    NextToken(Option<usize>),
    /// Encoders with a masked-LM head: log p(token) at `position` (the first `[MASK]`);
    /// `None`, the most likely token there.
    Masked {
        position: usize,
        token: Option<usize>,
    },
    /// Sentence encoders: the cosine between the text's embedding (its hidden states
    /// pooled by `pooling`, concatenated in that order) and `with`. Normalising the
    /// embedding does not change a cosine.
    Cosine {
        with: Vec<f32>,
        pooling: Vec<PoolingMode>,
    },
}

/// A target fixed on one text: the token chosen, and its value there.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetValue {
    pub target: Target,
    /// The position whose output it reads (none for a cosine, which reads them all).
    pub position: Option<usize>,
    /// log p of this token (none for a cosine).
    pub token: Option<usize>,
    pub value: f32,
}

/// `[V]` → log-softmax, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_sum = max + sum.ln();
    row.iter().map(|&x| x as f64 - log_sum).collect()
}

fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// Row `b`'s `[T, V]` of `[B, T, V]` logits.
fn row(logits: &Tensor, b: usize) -> (usize, usize, &[f32]) {
    let (t, v) = (logits.shape()[1], logits.shape()[2]);
    (t, v, &logits.data()[b * t * v..(b + 1) * t * v])
}

impl Target {
    /// What `model` is asked about on the text `ids` when nothing else is said: a
    /// decoder's (an encoder-decoder's) next token; a masked-LM encoder's token at the
    /// first mask of the text (`[MASK]` or `<mask>` in the tokenizer); a sentence
    /// encoder's cosine with `compare` (an embedding and the pooling that made it).
    /// `token` names the token instead of the most likely one. None where the model has
    /// no target for this text: a masked-LM text without a mask, an encoder without a
    /// comparison.
    pub fn default_for(
        model: &Transformer,
        tok: Option<&Tokenizer>,
        ids: &[usize],
        token: Option<usize>,
        compare: Option<(Vec<f32>, Vec<PoolingMode>)>,
    ) -> Option<Target> {
        let mask = || {
            let tok = tok?;
            let id = ["[MASK]", "<mask>"].iter().find_map(|m| tok.token_id(m))?;
            ids.iter().position(|&x| x == id)
        };
        match (model.kind(), model.arch.head, compare) {
            (_, _, Some((with, pooling))) => Some(Target::Cosine { with, pooling }),
            (ModelKind::Decoder | ModelKind::EncoderDecoder, _, None) => {
                Some(Target::NextToken(token))
            }
            (ModelKind::Encoder, Head::MaskedLm { .. }, None) => {
                mask().map(|position| Target::Masked { position, token })
            }
            (ModelKind::Encoder, _, None) => None,
        }
    }

    /// Fixes the target on the text of `logits` `[1, T, V]` whose real tokens are `mask`:
    /// the most likely token where none was named, and the value.
    pub fn resolve(&self, logits: &Tensor, mask: &[bool]) -> Result<TargetValue> {
        logits.expect_shape("logits", &[Some(1), None, None])?;
        let (t, v, _) = row(logits, 0);
        let fixed = match self {
            Target::NextToken(token) => {
                Target::NextToken(Some(self.token_at(logits, t - 1, *token)?))
            }
            Target::Masked { position, token } => {
                if *position >= t {
                    return Err(Error::OutOfRange {
                        what: "masked position".into(),
                        index: *position,
                        size: t,
                    });
                }
                Target::Masked {
                    position: *position,
                    token: Some(self.token_at(logits, *position, *token)?),
                }
            }
            Target::Cosine { with, pooling } => {
                if pooling.is_empty() {
                    return Err(Error::invalid("pooling", "no pooling mode"));
                }
                if with.len() != v * pooling.len() {
                    return Err(Error::invalid(
                        "compare",
                        format!(
                            "an embedding of {} numbers, and this model's are {}",
                            with.len(),
                            v * pooling.len()
                        ),
                    ));
                }
                self.clone()
            }
        };
        let value = fixed.value(logits, 0, mask)?;
        Ok(TargetValue {
            position: fixed.position(t),
            token: match &fixed {
                Target::NextToken(k) | Target::Masked { token: k, .. } => *k,
                Target::Cosine { .. } => None,
            },
            target: fixed,
            value: value as f32,
        })
    }

    fn position(&self, t: usize) -> Option<usize> {
        match self {
            Target::NextToken(_) => Some(t - 1),
            Target::Masked { position, .. } => Some(*position),
            Target::Cosine { .. } => None,
        }
    }

    fn token_at(&self, logits: &Tensor, position: usize, token: Option<usize>) -> Result<usize> {
        let (_, v, data) = row(logits, 0);
        match token {
            Some(k) if k >= v => Err(Error::OutOfRange {
                what: "target token".into(),
                index: k,
                size: v,
            }),
            Some(k) => Ok(k),
            None => Ok(argmax(&log_softmax(
                &data[position * v..(position + 1) * v],
            ))),
        }
    }

    /// The value on row `b` of `logits` `[B, T, V]`, whose real tokens are `mask` `[T]`
    /// (a cosine pools over those only). A token target must be fixed first
    /// ([`Target::resolve`]).
    pub fn value(&self, logits: &Tensor, b: usize, mask: &[bool]) -> Result<f64> {
        let (t, v, data) = row(logits, b);
        match self {
            Target::NextToken(Some(k)) => Ok(log_softmax(&data[(t - 1) * v..t * v])[*k]),
            Target::Masked {
                position,
                token: Some(k),
            } => Ok(log_softmax(&data[position * v..(position + 1) * v])[*k]),
            Target::Cosine { with, pooling } => {
                let h = Tensor::new(&[1, t, v], data.to_vec())?;
                let e = pool(&h, mask, pooling)?.remove(0);
                Ok(cosine(&e, with))
            }
            _ => Err(Error::invalid("target", "its token is not fixed yet")),
        }
    }

    /// d value / d logits `[1, T, V]` of a fixed target on a text whose tokens are all
    /// real.
    pub fn gradient(&self, logits: &Tensor) -> Result<Tensor> {
        let (t, v, data) = row(logits, 0);
        let mut grad = vec![0f32; t * v];
        match self {
            Target::NextToken(Some(k)) | Target::Masked { token: Some(k), .. } => {
                let p = self.position(t).expect("a token target reads one position");
                // d log softmax(z)_k / dz = onehot(k) − softmax(z)
                let logp = log_softmax(&data[p * v..(p + 1) * v]);
                for (i, (g, lp)) in grad[p * v..(p + 1) * v].iter_mut().zip(&logp).enumerate() {
                    *g = (f64::from(u8::from(i == *k)) - lp.exp()) as f32;
                }
            }
            Target::Cosine { with, pooling } => {
                let h = Tensor::new(&[1, t, v], data.to_vec())?;
                let e = pool(&h, &vec![true; t], pooling)?.remove(0);
                let de = cosine_gradient(&e, with);
                for (mode, (de, e)) in pooling
                    .iter()
                    .zip(de.chunks_exact(v).zip(e.chunks_exact(v)))
                {
                    pool_backward(*mode, data, t, v, e, de, &mut grad);
                }
            }
            _ => return Err(Error::invalid("target", "its token is not fixed yet")),
        }
        Tensor::new(&[1, t, v], grad)
    }
}

fn norm(x: &[f32]) -> f64 {
    x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt()
}

/// cos(a, b), 0 when either is zero.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = norm(a) * norm(b);
    if n > 0.0 {
        dot / n
    } else {
        0.0
    }
}

/// d cos(e, w) / d e = w / (‖e‖‖w‖) − cos · e / ‖e‖².
fn cosine_gradient(e: &[f32], w: &[f32]) -> Vec<f64> {
    let (ne, nw) = (norm(e), norm(w));
    if ne == 0.0 || nw == 0.0 {
        return vec![0.0; e.len()];
    }
    let c = cosine(e, w);
    e.iter()
        .zip(w)
        .map(|(&x, &y)| y as f64 / (ne * nw) - c * x as f64 / (ne * ne))
        .collect()
}

/// Adds to `grad` `[T, C]` the gradient through one pooling mode over all `t` tokens of
/// `hidden` `[T, C]`: `pooled` `[C]` was its output, `d` `[C]` the gradient there.
fn pool_backward(
    mode: PoolingMode,
    hidden: &[f32],
    t: usize,
    c: usize,
    pooled: &[f32],
    d: &[f64],
    grad: &mut [f32],
) {
    let mut add = |token: usize, weight: f64| {
        for (g, &dv) in grad[token * c..(token + 1) * c].iter_mut().zip(d) {
            *g += (weight * dv) as f32;
        }
    };
    match mode {
        PoolingMode::Cls => add(0, 1.0),
        PoolingMode::LastToken => add(t - 1, 1.0),
        PoolingMode::Mean => (0..t).for_each(|i| add(i, 1.0 / t as f64)),
        PoolingMode::MeanSqrtLen => (0..t).for_each(|i| add(i, 1.0 / (t as f64).sqrt())),
        PoolingMode::WeightedMean => {
            let total = (t * (t + 1) / 2) as f64;
            (0..t).for_each(|i| add(i, (i + 1) as f64 / total));
        }
        PoolingMode::Max => {
            // each dimension's gradient goes to the first token holding its maximum
            for (j, (&m, &dv)) in pooled.iter().zip(d).enumerate() {
                let token = (0..t).find(|&i| hidden[i * c + j] == m).unwrap_or(0);
                grad[token * c + j] += dv as f32;
            }
        }
    }
}
