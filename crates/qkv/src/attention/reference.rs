//! The formula as the articles write it: scores = Q·Kᵀ·scale + bias, masked,
//! P = softmax(scores), out = P·V, with the whole T×S score matrix in memory.
//! Slow and plain on purpose: it is the twin the tiled kernel is tested against.

use super::output::AttentionOutput;
use super::spec::Scorer;
use super::view::HeadsView;
use crate::ops::softmax_rows;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Σ a·b, kept as 8 interleaved partial sums: a single running sum must be added in
/// order, one element at a time, while 8 independent ones fill a vector register.
/// The reference backward recomputes P with it too.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    let mut lanes = [0.0f32; 8];
    for (x, y) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The readable twin of `tiled::attention`, on the same validated operands: each
/// (batch row, head) is one parallel task that materialises its T×S scores.
pub(crate) fn attention(
    views: [&HeadsView; 3],
    scorer: &Scorer,
    want_weights: bool,
) -> AttentionOutput {
    let ([q, k, v], dims) = (views, scorer.dims);
    let (t, s, h_n, dv) = (dims.t, dims.s, dims.h, dims.dv);
    let heads: Vec<Head> = (0..dims.b * h_n)
        .into_par_iter()
        .map(|bh| one_head(q, k, v, scorer, bh / h_n, bh % h_n, want_weights))
        .collect();

    let mut out = Tensor::zeros(&[dims.b, t, h_n, dv]);
    let mut lse = Tensor::zeros(&[dims.b, h_n, t]);
    let mut weights = want_weights.then(|| Tensor::zeros(&[dims.b, h_n, t, s]));
    for (bh, head) in heads.into_iter().enumerate() {
        let (b, h) = (bh / h_n, bh % h_n);
        for i in 0..t {
            out.data_mut()[((b * t + i) * h_n + h) * dv..][..dv]
                .copy_from_slice(&head.out[i * dv..(i + 1) * dv]);
        }
        lse.data_mut()[bh * t..(bh + 1) * t].copy_from_slice(&head.lse);
        if let (Some(w), Some(p)) = (weights.as_mut(), head.weights) {
            w.data_mut()[bh * t * s..(bh + 1) * t * s].copy_from_slice(&p);
        }
    }
    AttentionOutput { out, lse, weights }
}

/// One head's results: out [T, Dv], lse [T], and the weights [T, S] when asked for.
struct Head {
    out: Vec<f32>,
    lse: Vec<f32>,
    weights: Option<Vec<f32>>,
}

/// Attention of head h in batch row b, the formula step by step.
fn one_head(
    q: &HeadsView,
    k: &HeadsView,
    v: &HeadsView,
    scorer: &Scorer,
    b: usize,
    h: usize,
    want_weights: bool,
) -> Head {
    let dims = scorer.dims;
    let (t, s, dv) = (dims.t, dims.s, dims.dv);
    let g = dims.kv_head(h);
    let mut scores = vec![0.0f32; t * s];
    let mut lse = vec![0.0f32; t];
    for i in 0..t {
        let row = &mut scores[i * s..(i + 1) * s];
        for (j, x) in row.iter_mut().enumerate() {
            *x = scorer.scale * dot(q.vector(b, i, h), k.vector(b, j, g));
        }
        scorer.apply_row(b, h, i, 0, row);
        lse[i] = log_sum_exp(row);
    }
    softmax_rows(&mut scores, s);
    let mut out = vec![0.0f32; t * dv];
    for i in 0..t {
        let o = &mut out[i * dv..(i + 1) * dv];
        for j in 0..s {
            let p = scores[i * s + j];
            for (oc, vc) in o.iter_mut().zip(v.vector(b, j, g)) {
                *oc += p * vc;
            }
        }
    }
    Head {
        out,
        lse,
        weights: want_weights.then_some(scores),
    }
}

/// log Σ exp(x), −∞ for an all −∞ row.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln()
}
