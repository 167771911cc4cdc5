//! The formula as the articles write it: scores = Q·Kᵀ·scale + bias, masked,
//! P = softmax(scores), out = P·V, with the whole T×S score matrix in memory.
//! Slow and plain on purpose: it is the twin the tiled kernel is tested against.

use super::spec::Scorer;
use super::{AttentionOutput, HeadsView};
use crate::ops::softmax_rows;
use crate::tensor::Tensor;

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// q: [B,T,H,D], k: [B,S,G,D], v: [B,S,G,Dv] (validated) → out [B,T,H,Dv], lse [B,H,T].
pub(crate) fn attention(
    q: &HeadsView,
    k: &HeadsView,
    v: &HeadsView,
    scorer: &Scorer,
    want_weights: bool,
) -> AttentionOutput {
    let dims = scorer.dims;
    let (t, s, h_n, dv) = (dims.t, dims.s, dims.h, dims.dv);

    let mut out = Tensor::zeros(&[dims.b, t, h_n, dv]);
    let mut lse = Tensor::zeros(&[dims.b, h_n, t]);
    let mut weights = want_weights.then(|| Tensor::zeros(&[dims.b, h_n, t, s]));
    let mut scores = vec![0.0f32; t * s];
    for b in 0..dims.b {
        for h in 0..h_n {
            let g = dims.kv_head(h);
            for i in 0..t {
                let row = &mut scores[i * s..(i + 1) * s];
                for (j, x) in row.iter_mut().enumerate() {
                    *x = scorer.scale * dot(q.vector(b, i, h), k.vector(b, j, g));
                }
                scorer.apply_row(b, h, i, 0, row);
                lse.data_mut()[(b * h_n + h) * t + i] = log_sum_exp(row);
            }
            softmax_rows(&mut scores, s);
            for i in 0..t {
                let o = &mut out.data_mut()[((b * t + i) * h_n + h) * dv..][..dv];
                for j in 0..s {
                    let p = scores[i * s + j];
                    for (oc, vc) in o.iter_mut().zip(v.vector(b, j, g)) {
                        *oc += p * vc;
                    }
                }
            }
            if let Some(w) = weights.as_mut() {
                w.data_mut()[(b * h_n + h) * t * s..][..t * s].copy_from_slice(&scores);
            }
        }
    }
    AttentionOutput { out, lse, weights }
}

/// log Σ exp(x), −∞ for an all −∞ row.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln()
}
