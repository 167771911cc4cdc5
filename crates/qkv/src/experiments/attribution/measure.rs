//! How well each method's credit for a target agrees with ablation on one text:
//! Spearman's ρ between their per-key scores, and whether both put the same key first.

use crate::error::Result;
use crate::models::explain::{attribute, Method, Target};
use crate::models::{Input, Transformer};

/// The methods compared with ablation, in the order the report lists them.
pub(super) const COMPARED: [Method; 5] = [
    Method::Weights,
    Method::ValueNorm,
    Method::Rollout,
    Method::Flow,
    Method::Grad,
];

/// Ranks from 1, ties sharing their mean rank.
fn ranks(x: &[f32]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0f64; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        order[i..=j].iter().for_each(|&k| r[k] = mean);
        i = j + 1;
    }
    r
}

/// Spearman's ρ: Pearson's correlation of the ranks; 0 when either side is constant
/// (no ranking to agree with).
pub(super) fn spearman(a: &[f32], b: &[f32]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma).powi(2);
        sbb += (y - mb).powi(2);
    }
    if saa == 0.0 || sbb == 0.0 {
        0.0
    } else {
        sab / (saa * sbb).sqrt()
    }
}

fn top(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |best, i| if x[i] > x[best] { i } else { best })
}

/// One text: per compared method, (ρ with ablation, same top key as ablation); and the
/// scores of every method, ablation last.
pub(super) struct Agreement {
    pub(super) rho: Vec<f64>,
    pub(super) same_top: Vec<bool>,
    pub(super) scores: Vec<Vec<f32>>,
}

/// Runs every method and ablation on `input` for `target`.
pub(super) fn agreement(model: &Transformer, input: &Input, target: &Target) -> Result<Agreement> {
    let credit = |method| -> Result<Vec<f32>> {
        Ok(attribute(model, input, method, Some(target))?
            .scores
            .expect("a target gives scores"))
    };
    let truth = credit(Method::Ablation)?;
    let mut scores = COMPARED
        .iter()
        .map(|&m| credit(m))
        .collect::<Result<Vec<_>>>()?;
    let rho = scores.iter().map(|s| spearman(s, &truth)).collect();
    let same_top = scores.iter().map(|s| top(s) == top(&truth)).collect();
    scores.push(truth);
    Ok(Agreement {
        rho,
        same_top,
        scores,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against scipy 1.17.1's `spearmanr` (ties by mean rank).
    #[test]
    fn spearman_matches_scipy() {
        let a = [0.1, 0.4, 0.4, 0.2, 0.9];
        let b = [1.0, 3.0, 2.0, 2.0, 5.0];
        // scipy.stats.spearmanr(a, b).statistic
        assert!((spearman(&a, &b) - 0.921_052_631_578_947_5).abs() < 1e-12);
        assert!((spearman(&a, &a) - 1.0).abs() < 1e-12);
        let rev: Vec<f32> = a.iter().map(|x| -x).collect();
        assert!((spearman(&a, &rev) + 1.0).abs() < 1e-12);
        assert_eq!(spearman(&a, &[1.0; 5]), 0.0);
    }
}
