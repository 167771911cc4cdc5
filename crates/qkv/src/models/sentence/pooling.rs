//! Pooling a text's token states into one vector, as sentence-transformers' Pooling
//! module does, and the L2 normalisation of its Normalize module.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// One pooled representation of a text's token states; several are concatenated in the
/// order the pooling config lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first real token (`[CLS]`).
    Cls,
    /// Per-dimension maximum over real tokens.
    Max,
    /// Mean over real tokens.
    Mean,
    /// Sum over real tokens divided by √(number of real tokens).
    MeanSqrtLen,
    /// Mean weighted by 1-based position (later tokens weigh more).
    WeightedMean,
    /// The last real token.
    LastToken,
}

impl PoolingMode {
    /// The legacy `pooling_mode_*` flags in sentence-transformers' concatenation order.
    pub(super) const FLAG_ORDER: [PoolingMode; 6] = [
        PoolingMode::Cls,
        PoolingMode::Max,
        PoolingMode::Mean,
        PoolingMode::MeanSqrtLen,
        PoolingMode::WeightedMean,
        PoolingMode::LastToken,
    ];

    pub(super) fn from_name(name: &str) -> Option<Self> {
        match name {
            "cls" => Some(PoolingMode::Cls),
            "max" => Some(PoolingMode::Max),
            "mean" => Some(PoolingMode::Mean),
            "mean_sqrt_len_tokens" => Some(PoolingMode::MeanSqrtLen),
            "weightedmean" => Some(PoolingMode::WeightedMean),
            "lasttoken" => Some(PoolingMode::LastToken),
            _ => None,
        }
    }
}

/// Pools token states over each row's real tokens.
/// hidden: [B, T, C]; mask: [B·T] → B vectors of length C·(number of modes).
pub fn pool(hidden: &Tensor, mask: &[bool], modes: &[PoolingMode]) -> Result<Vec<Vec<f32>>> {
    hidden.expect_shape("token states", &[None, None, None])?;
    let (b, t, c) = (hidden.shape()[0], hidden.shape()[1], hidden.shape()[2]);
    if mask.len() != b * t {
        return Err(Error::shape(
            "attention_mask",
            format!("[{b}, {t}] like the token states"),
            &[mask.len()],
        ));
    }
    let mut out = Vec::with_capacity(b);
    for r in 0..b {
        let rows = &hidden.data()[r * t * c..(r + 1) * t * c];
        let real = &mask[r * t..(r + 1) * t];
        let tokens = || {
            rows.chunks_exact(c)
                .zip(real)
                .enumerate()
                .filter(|(_, (_, &m))| m)
                .map(|(p, (x, _))| (p, x))
        };
        let count = real.iter().filter(|&&m| m).count();
        let mut v = Vec::with_capacity(c * modes.len());
        for mode in modes {
            match mode {
                PoolingMode::Cls | PoolingMode::LastToken => {
                    let pick = if *mode == PoolingMode::Cls {
                        tokens().next()
                    } else {
                        tokens().next_back()
                    };
                    match pick {
                        Some((_, x)) => v.extend_from_slice(x),
                        None => v.extend(std::iter::repeat_n(0.0, c)),
                    }
                }
                PoolingMode::Max => {
                    let mut m = vec![f32::NEG_INFINITY; c];
                    for (_, x) in tokens() {
                        for (a, &y) in m.iter_mut().zip(x) {
                            *a = a.max(y);
                        }
                    }
                    v.extend(m);
                }
                PoolingMode::Mean | PoolingMode::MeanSqrtLen | PoolingMode::WeightedMean => {
                    let weighted = *mode == PoolingMode::WeightedMean;
                    // f64 sums: a mean over hundreds of tokens stays exact to f32 rounding
                    let mut sum = vec![0.0f64; c];
                    let mut total = 0.0f64;
                    for (p, x) in tokens() {
                        let w = if weighted { (p + 1) as f64 } else { 1.0 };
                        total += w;
                        for (s, &y) in sum.iter_mut().zip(x) {
                            *s += w * y as f64;
                        }
                    }
                    let div = match mode {
                        PoolingMode::MeanSqrtLen => (count as f64).max(1e-9).sqrt(),
                        _ => total.max(1e-9),
                    };
                    v.extend(sum.iter().map(|s| (s / div) as f32));
                }
            }
        }
        out.push(v);
    }
    Ok(out)
}

/// x ← x / max(‖x‖₂, 1e-12), as `torch.nn.functional.normalize`.
pub fn l2_normalize(x: &mut [f32]) {
    let norm = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
    let r = 1.0 / norm.max(1e-12);
    for v in x {
        *v = (*v as f64 * r) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Tensor, Vec<bool>) {
        let data = vec![
            1.0, -1.0, 3.0, 0.0, 2.0, 5.0, //
            4.0, 2.0, -2.0, 6.0, 100.0, 100.0,
        ];
        let mask = vec![true, true, true, true, true, false];
        (Tensor::new(&[2, 3, 2], data).unwrap(), mask)
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn each_mode_over_real_tokens_only() {
        let (h, mask) = sample();
        let run = |m| pool(&h, &mask, &[m]).unwrap();
        let r = run(PoolingMode::Cls);
        close(&r[0], &[1.0, -1.0]);
        close(&r[1], &[4.0, 2.0]);
        let r = run(PoolingMode::LastToken);
        close(&r[0], &[2.0, 5.0]);
        close(&r[1], &[-2.0, 6.0]);
        let r = run(PoolingMode::Max);
        close(&r[0], &[3.0, 5.0]);
        close(&r[1], &[4.0, 6.0]);
        let r = run(PoolingMode::Mean);
        close(&r[0], &[2.0, 4.0 / 3.0]);
        close(&r[1], &[1.0, 4.0]);
        let r = run(PoolingMode::MeanSqrtLen);
        close(&r[0], &[6.0 / 3f32.sqrt(), 4.0 / 3f32.sqrt()]);
        close(&r[1], &[2.0 / 2f32.sqrt(), 8.0 / 2f32.sqrt()]);
        // weights 1, 2, 3 by position
        let r = run(PoolingMode::WeightedMean);
        close(&r[0], &[(1.0 + 6.0 + 6.0) / 6.0, (-1.0 + 0.0 + 15.0) / 6.0]);
        close(&r[1], &[(4.0 - 4.0) / 3.0, (2.0 + 12.0) / 3.0]);
    }

    #[test]
    fn several_modes_concatenate_in_order() {
        let (h, mask) = sample();
        let r = pool(&h, &mask, &[PoolingMode::Cls, PoolingMode::Mean]).unwrap();
        close(&r[1], &[4.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn mask_of_wrong_length_is_named() {
        let (h, _) = sample();
        let err = pool(&h, &[true; 5], &[PoolingMode::Mean]).unwrap_err();
        assert!(err.to_string().contains("attention_mask"), "{err}");
    }

    #[test]
    fn normalize_gives_unit_length_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        close(&v, &[0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        l2_normalize(&mut z);
        close(&z, &[0.0, 0.0]);
    }
}
