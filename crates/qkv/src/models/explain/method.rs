//! Every method on one sequence: [`attribute`] and what it returns.

use super::ablation::ablation;
use super::target::{Target, TargetValue};
use crate::attribution::{cross_gradient_rollout, cross_rollout, flow, gradient_rollout, rollout};
use crate::error::{Error, Result};
use crate::models::net::arch::ModelKind;
use crate::models::sentence::PoolingMode;
use crate::models::transformer::{Attentions, Input, Transformer};
use crate::tensor::Tensor;

/// How key tokens are credited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The raw attention weights, per head.
    Weights,
    /// Attention rollout (Abnar & Zuidema 2020), heads combined.
    Rollout,
    /// Attention flow (Abnar & Zuidema 2020), heads combined.
    Flow,
    /// Gradient × attention (Chefer, Gur & Wolf 2021), heads combined.
    Grad,
    /// Weights times the size of what each key adds (Kobayashi et al. 2020), per head.
    ValueNorm,
    /// The target's change when a key is hidden: one score per key.
    Ablation,
}

impl Method {
    pub const ALL: [Method; 6] = [
        Method::Weights,
        Method::Rollout,
        Method::Flow,
        Method::Grad,
        Method::ValueNorm,
        Method::Ablation,
    ];

    /// The name the CLI, JSON and Python use: `weights`, `rollout`, `flow`, `grad`,
    /// `value-norm`, `ablation`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Weights => "weights",
            Method::Rollout => "rollout",
            Method::Flow => "flow",
            Method::Grad => "grad",
            Method::ValueNorm => "value-norm",
            Method::Ablation => "ablation",
        }
    }

    pub fn from_name(name: &str) -> Result<Method> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Method::ALL.iter().map(|m| m.name()).collect();
                Error::invalid(
                    "method",
                    format!("`{name}` is none of {}", names.join(", ")),
                )
            })
    }

    /// Whether its maps keep one matrix per head (else one per layer, heads combined).
    pub fn per_head(self) -> bool {
        matches!(self, Method::Weights | Method::ValueNorm)
    }

    /// Whether it cannot run without a target.
    pub fn needs_target(self) -> bool {
        matches!(self, Method::Grad | Method::Ablation)
    }
}

/// What [`attribute`] found for one sequence.
#[derive(Clone, Debug)]
pub struct Attribution {
    pub method: Method,
    /// Per kind and layer, `[1, H, T, S]` for a per-head method and `[1, 1, T, S]` for
    /// one that combines the heads (row t: the credit of each key s at query t after
    /// that layer); none for ablation. An encoder-decoder's cross-attention is combined
    /// by rollout and grad, not by flow (see `combine`).
    pub maps: Attentions,
    /// The target, fixed on this text, when one was given.
    pub target: Option<TargetValue>,
    /// One score per key of the input text: ablation's, or for another method with a
    /// target the target's row(s) of its last map (heads averaged), the credit each
    /// key gets for the target (see [`target_rows`]); for grad, of R − I, what the
    /// layers' attention added to the identity it starts from.
    pub scores: Option<Vec<f32>>,
}

/// `[1, H, T, S]` → `[H, T, S]`.
fn one_sequence(maps: &[Tensor]) -> Result<Vec<Tensor>> {
    maps.iter()
        .map(|m| m.clone().reshape(&m.shape()[1..]))
        .collect()
}

/// `[T, S]` per layer → `[1, 1, T, S]` per layer.
fn as_maps(combined: Vec<Tensor>) -> Result<Vec<Tensor>> {
    combined
        .into_iter()
        .map(|m| {
            let (t, s) = (m.shape()[0], m.shape()[1]);
            m.reshape(&[1, 1, t, s])
        })
        .collect()
}

/// The query rows whose credit is the target's, with weights summing to 1: the row the
/// token target reads, or for a cosine every row the pooling reads (the mean over
/// them for mean pooling).
pub fn target_rows(target: &Target, t: usize) -> Vec<(usize, f64)> {
    match target {
        Target::NextToken(_) => vec![(t - 1, 1.0)],
        Target::Masked { position, .. } => vec![(*position, 1.0)],
        Target::Cosine { pooling, .. } => {
            let mut rows = vec![0f64; t];
            for mode in pooling {
                match mode {
                    PoolingMode::Cls => rows[0] += 1.0,
                    PoolingMode::LastToken => rows[t - 1] += 1.0,
                    PoolingMode::WeightedMean => {
                        let total = (t * (t + 1) / 2) as f64;
                        rows.iter_mut()
                            .enumerate()
                            .for_each(|(i, r)| *r += (i + 1) as f64 / total);
                    }
                    _ => rows.iter_mut().for_each(|r| *r += 1.0 / t as f64),
                }
            }
            let n = pooling.len() as f64;
            rows.into_iter()
                .enumerate()
                .filter(|(_, w)| *w > 0.0)
                .map(|(i, w)| (i, w / n))
                .collect()
        }
    }
}

/// The target rows of `map` `[1, H, T, S]`, heads averaged: `[S]`. With
/// `minus_identity` (a self-attention map, T = S), the identity's rows are taken off
/// first: gradient × attention starts from R = I, so that R − I is what attention added.
fn credit(map: &Tensor, rows: &[(usize, f64)], minus_identity: bool) -> Vec<f32> {
    let [_, h, t, s] = map.shape()[..] else {
        unreachable!("maps are [1, H, T, S]")
    };
    let mut out = vec![0f64; s];
    for head in map.data().chunks_exact(t * s) {
        for &(r, w) in rows {
            for (o, &x) in out.iter_mut().zip(&head[r * s..(r + 1) * s]) {
                *o += w * x as f64 / h as f64;
            }
        }
    }
    if minus_identity {
        rows.iter().for_each(|&(r, w)| out[r] -= w);
    }
    out.into_iter().map(|x| x as f32).collect()
}

/// The map whose target rows score the keys of the input text: the last layer's of the
/// input's own self-attention (decoder or encoder), or an encoder-decoder's last
/// cross-attention, which reads the source from the decoder's rows.
fn scoring_map(model: &Transformer, maps: &Attentions) -> Option<Tensor> {
    match model.kind() {
        ModelKind::Decoder => maps.decoder.last().cloned(),
        ModelKind::Encoder => maps.encoder.last().cloned(),
        ModelKind::EncoderDecoder => maps.cross.last().cloned(),
    }
}

/// The length of the sequence the target reads: the decoder's input, or an encoder's.
fn target_len(model: &Transformer, input: &Input) -> usize {
    match model.kind() {
        ModelKind::Encoder => input.source.map_or(0, |b| b.len),
        _ => input.target.map_or(0, |b| b.len),
    }
}

/// The mask of the tokens the target reads (all real: one unpadded sequence).
fn all_real(model: &Transformer, input: &Input) -> Vec<bool> {
    vec![true; target_len(model, input)]
}

/// Checks the input is one unpadded sequence of the kind the model reads.
fn check_input(model: &Transformer, input: &Input) -> Result<()> {
    let one = |name: &str, b: Option<&crate::batch::TokenBatch>| -> Result<()> {
        match b {
            None => Err(Error::invalid(
                name,
                format!("{} needs it", model.info().architecture),
            )),
            Some(b) if b.batch != 1 || b.mask.iter().any(|&m| !m) => Err(Error::invalid(
                name,
                format!(
                    "attribution explains one unpadded sequence, not {} rows",
                    b.batch
                ),
            )),
            Some(_) => Ok(()),
        }
    };
    match model.kind() {
        ModelKind::Decoder => one("target", input.target),
        ModelKind::Encoder => one("source", input.source),
        ModelKind::EncoderDecoder => {
            one("source", input.source)?;
            one("target", input.target)
        }
    }
}

/// Runs `method` on one sequence (`input` one unpadded row). `target` is what grad and
/// ablation explain (they refuse to run without one); for the others it only adds
/// [`Attribution::scores`].
pub fn attribute(
    model: &Transformer,
    input: &Input,
    method: Method,
    target: Option<&Target>,
) -> Result<Attribution> {
    attribute_with_progress(model, input, method, target, &mut |_, _| {})
}

/// [`attribute`], calling `progress(done, total)` as ablation's forwards finish (keys
/// hidden so far of the text's; the other methods run one or two forwards and do not
/// call it).
pub fn attribute_with_progress(
    model: &Transformer,
    input: &Input,
    method: Method,
    target: Option<&Target>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Attribution> {
    check_input(model, input)?;
    if method.needs_target() && target.is_none() {
        return Err(Error::invalid(
            "target",
            format!(
                "method {} explains a target, and none was given",
                method.name()
            ),
        ));
    }
    let mask = all_real(model, input);
    let mut fixed: Option<TargetValue> = None;
    let maps = match method {
        Method::Weights | Method::Rollout | Method::Flow | Method::Ablation => {
            let out = model.forward(input, method != Method::Ablation)?;
            if let Some(t) = target {
                fixed = Some(t.resolve(&out.logits, &mask)?);
            }
            match method {
                Method::Rollout | Method::Flow => combine(method, &out.attentions, None)?,
                _ => out.attentions,
            }
        }
        Method::ValueNorm => {
            if let Some(t) = target {
                let logits = model.forward(input, false)?.logits;
                fixed = Some(t.resolve(&logits, &mask)?);
            }
            model.value_norms(input)?
        }
        Method::Grad => {
            let t = target.expect("checked above");
            let (maps, grads) = model.attention_grads(input, |logits| {
                let value = t.resolve(logits, &mask)?;
                let grad = value.target.gradient(logits);
                fixed = Some(value);
                grad
            })?;
            combine(method, &maps, Some(&grads))?
        }
    };
    let scores = match (&fixed, method) {
        (Some(t), Method::Ablation) => Some(ablation(model, input, t, progress)?),
        (Some(t), _) => scoring_map(model, &maps).map(|m| {
            let rows = target_rows(&t.target, m.shape()[2]);
            // grad's self-attention relevance starts from I; its cross-attention's from 0
            let seq2seq = model.kind() == ModelKind::EncoderDecoder;
            credit(&m, &rows, method == Method::Grad && !seq2seq)
        }),
        (None, _) => None,
    };
    let maps = match method {
        Method::Ablation => Attentions::default(),
        _ => maps,
    };
    Ok(Attribution {
        method,
        maps,
        target: fixed,
        scores,
    })
}

/// Rollout, flow or grad (with the maps' gradients `grads`) of `maps` `[1, H, T, S]`
/// per layer → `[1, 1, T, S]` per layer: each stack's self-attention by the method, and
/// an encoder-decoder's cross-attention by [`cross_rollout`] or
/// [`cross_gradient_rollout`] (flow is defined on one stack's graph: its cross is left
/// empty).
fn combine(method: Method, maps: &Attentions, grads: Option<&Attentions>) -> Result<Attentions> {
    let (enc, dec, cross) = (
        one_sequence(&maps.encoder)?,
        one_sequence(&maps.decoder)?,
        one_sequence(&maps.cross)?,
    );
    let stack = |m: &[Tensor], f: fn(&[Tensor]) -> Result<Vec<Tensor>>| match m.is_empty() {
        true => Ok(Vec::new()),
        false => f(m),
    };
    let seq2seq = !enc.is_empty() && !cross.is_empty();
    let (encoder, decoder, cross) = match (method, grads) {
        (Method::Rollout, _) => (
            stack(&enc, rollout)?,
            stack(&dec, rollout)?,
            match seq2seq {
                true => cross_rollout(&enc, &dec, &cross)?,
                false => Vec::new(),
            },
        ),
        (Method::Flow, _) => (stack(&enc, flow)?, stack(&dec, flow)?, Vec::new()),
        (Method::Grad, Some(g)) => {
            let (ge, gd, gx) = (
                one_sequence(&g.encoder)?,
                one_sequence(&g.decoder)?,
                one_sequence(&g.cross)?,
            );
            let encoder = match enc.is_empty() {
                true => Vec::new(),
                false => gradient_rollout(&enc, &ge)?,
            };
            let (decoder, cross) = match (seq2seq, dec.is_empty()) {
                (true, _) => cross_gradient_rollout((&enc, &ge), (&dec, &gd), (&cross, &gx))?,
                (false, true) => (Vec::new(), Vec::new()),
                (false, false) => (gradient_rollout(&dec, &gd)?, Vec::new()),
            };
            (encoder, decoder, cross)
        }
        _ => unreachable!("rollout, flow, and grad with its gradients"),
    };
    Ok(Attentions {
        encoder: as_maps(encoder)?,
        decoder: as_maps(decoder)?,
        cross: as_maps(cross)?,
    })
}
