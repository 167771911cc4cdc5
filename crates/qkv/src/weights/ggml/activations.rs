//! x quantized for the products against blocks, as llama.cpp quantizes the
//! activations it multiplies them with:
//!
//! - **Q8_K** for the K-quants (`quantize_row_q8_K_ref`): per super-block of 256, the
//!   value of largest magnitude m (its sign kept), codes q = round(−127·x/m) (halves to
//!   even, capped at 127) and the scale d = 1/(−127/m), so x ≈ q·d; also the codes'
//!   sums per 16, which the offsets of the weights' sub-blocks multiply;
//! - **Q8_0** for Q4_0: per block of 32, d = max|x|/127 rounded to f16 and
//!   q = round(x/d), the int8 kernels' quantizer.
//!
//! llama.cpp passes a NaN in x over silently (it is never the largest magnitude); here
//! it makes the group's scale NaN, so that the product it enters is NaN, as in f32.

use super::layout::{BlockType, QK_K};
use crate::weights::int8::quant::{block_scale, quantize_groups};
use rayon::prelude::*;

/// Rows from which quantizing x is worth spreading over the pool.
const PARALLEL_ROWS: usize = 64;

/// Steps a code sum covers.
pub const SUM: usize = 16;

/// x `[rows, K]` quantized for one block type.
pub struct QuantizedX {
    pub k: usize,
    /// steps per scale: 256 (Q8_K) or 32 (Q8_0)
    pub group: usize,
    /// `[rows, K]`
    pub codes: Vec<i8>,
    /// `[rows, K / group]`
    pub scales: Vec<f32>,
    /// `[rows, K / 16]`: Σ codes of each 16 steps
    pub sums: Vec<i16>,
}

/// One row of [`QuantizedX`]: codes, scales, sums.
pub type XRow<'a> = (&'a [i8], &'a [f32], &'a [i16]);

/// One row's input and codes, and its scales and sums, as the quantizing pass zips them.
type RowIn<'a> = (&'a [f32], &'a mut [i8]);
type RowOut<'a> = (&'a mut [f32], &'a mut [i16]);

impl QuantizedX {
    /// Quantizes x `[rows, k]` for weights of type `ty` (k a multiple of the type's
    /// block), the rows over the pool when `parallel` and there are many.
    pub fn new(x: &[f32], rows: usize, k: usize, ty: BlockType, parallel: bool) -> Self {
        assert!(x.len() == rows * k && k.is_multiple_of(ty.weights()));
        let group = ty.x_group();
        let mut codes = vec![0i8; rows * k];
        let mut scales = vec![0.0f32; rows * (k / group)];
        let mut sums = vec![0i16; rows * (k / SUM)];
        let one_row = |((x, q), (d, s)): (RowIn, RowOut)| {
            if ty == BlockType::Q4_0 {
                let mut block_sums = vec![0i32; d.len()];
                quantize_groups(x, group, q, d, &mut block_sums);
                d.iter_mut().for_each(|d| *d = block_scale(*d));
            } else {
                for ((x, q), d) in x.chunks_exact(QK_K).zip(q.chunks_exact_mut(QK_K)).zip(d) {
                    *d = quantize_q8_k(x, q);
                }
            }
            for (s, q) in s.iter_mut().zip(q.chunks_exact(SUM)) {
                *s = q.iter().map(|&c| i16::from(c)).sum();
            }
        };
        let parts = x.chunks_exact(k).zip(codes.chunks_exact_mut(k)).zip(
            scales
                .chunks_exact_mut(k / group)
                .zip(sums.chunks_exact_mut(k / SUM)),
        );
        if parallel && rows >= PARALLEL_ROWS {
            parts
                .collect::<Vec<_>>()
                .into_par_iter()
                .with_min_len(PARALLEL_ROWS / 2)
                .for_each(one_row);
        } else {
            parts.for_each(one_row);
        }
        QuantizedX {
            k,
            group,
            codes,
            scales,
            sums,
        }
    }

    /// Rows quantized.
    pub fn rows(&self) -> usize {
        self.codes.len() / self.k
    }

    /// Row r's codes, scales and sums.
    pub fn row(&self, r: usize) -> XRow<'_> {
        let (g, s) = (self.k / self.group, self.k / SUM);
        (
            &self.codes[r * self.k..][..self.k],
            &self.scales[r * g..][..g],
            &self.sums[r * s..][..s],
        )
    }

    /// x as the products read it, `[rows, K]`: q·d.
    pub fn dequantized(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.codes.len());
        for r in 0..self.rows() {
            let (codes, scales, _) = self.row(r);
            out.extend(
                codes
                    .iter()
                    .enumerate()
                    .map(|(c, &q)| f32::from(q) * scales[c / self.group]),
            );
        }
        out
    }
}

/// One super-block of 256 as Q8_K: codes into `q`, the scale returned (module docs).
pub fn quantize_q8_k(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!((x.len(), q.len()), (QK_K, QK_K));
    // |v| as bits: ordered as the magnitudes are, infinities and NaNs above every
    // finite value, and an integer maximum vectorizes where a float one does not
    let magnitude = |v: f32| v.to_bits() & 0x7FFF_FFFF;
    let top = x.iter().map(|&v| magnitude(v)).max().unwrap_or(0);
    if top >= f32::INFINITY.to_bits() {
        q.fill(0);
        return f32::NAN;
    }
    if top == 0 {
        q.fill(0);
        return 0.0;
    }
    // the first value of largest magnitude, sign kept, as llama.cpp picks it
    let largest = *x
        .iter()
        .find(|&&v| magnitude(v) == top)
        .expect("the maximum is in x");
    let iscale = -127.0 / largest;
    for (c, &v) in q.iter_mut().zip(x) {
        *c = nearest_even(iscale * v).min(127.0) as i8;
    }
    1.0 / iscale
}

/// `v` rounded to the nearest integer, halves to even, for |v| < 2²²: adding 1.5·2²³
/// leaves no fraction bits, so the sum is rounded as the FPU rounds (to nearest even),
/// and subtracting it back is exact. `f32::round_ties_even` does the same, but is a
/// call into libm without SSE4.1; this vectorizes.
fn nearest_even(v: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (v + SHIFT) - SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_K's scale takes the sign of the largest magnitude, ties round to even, codes
    /// stop at 127, sums are per 16; a NaN or an infinity makes the scale NaN.
    #[test]
    fn q8_k_is_llama_cpps() {
        // the largest magnitude −127: the inverse scale is exactly 1, so halves are ties
        let mut x = [0.0f32; QK_K];
        x[..4].copy_from_slice(&[-127.0, 2.5, 0.5, 1.5]);
        let mut q = [0i8; QK_K];
        assert_eq!(quantize_q8_k(&x, &mut q), 1.0);
        assert_eq!(&q[..4], &[-127, 2, 0, 2]);
        for v in [
            -126.5f32,
            -3.5,
            -0.5,
            -0.49999997,
            0.5,
            1.5,
            2.5,
            126.5,
            127.0,
            0.0,
        ] {
            assert_eq!(nearest_even(v), v.round_ties_even(), "{v}");
        }
        x[0] = 127.0;
        assert_eq!(quantize_q8_k(&x, &mut q), -1.0);
        assert_eq!(&q[..4], &[-127, -2, 0, -2]);
        assert!(quantize_q8_k(&[0.0; QK_K], &mut q) == 0.0 && q.iter().all(|&c| c == 0));
        x[9] = f32::NAN;
        assert!(quantize_q8_k(&x, &mut q).is_nan());
        x[9] = f32::INFINITY;
        assert!(quantize_q8_k(&x, &mut q).is_nan());
        // of two equal magnitudes the first gives the sign, as llama.cpp's loop picks it
        (x[9], x[20], x[30]) = (0.0, 200.0, -200.0);
        assert_eq!(quantize_q8_k(&x, &mut q), 1.0 / (-127.0 / 200.0));
        (x[20], x[30]) = (-200.0, 200.0);
        assert_eq!(quantize_q8_k(&x, &mut q), 1.0 / (127.0 / 200.0));

        let xs: Vec<f32> = (0..2 * QK_K).map(|i| (i as f32 * 0.37).sin()).collect();
        let qx = QuantizedX::new(&xs, 1, 2 * QK_K, BlockType::Q6K, false);
        let (codes, scales, sums) = qx.row(0);
        assert_eq!((scales.len(), sums.len()), (2, 32));
        for (s, c) in sums.iter().zip(codes.chunks(16)) {
            assert_eq!(*s, c.iter().map(|&v| i16::from(v)).sum::<i16>());
        }
        let deq = qx.dequantized();
        for (a, b) in deq.iter().zip(&xs) {
            assert!((a - b).abs() <= scales[0].abs().max(scales[1].abs()) / 2.0 + 1e-7);
        }
    }

    /// Q4_0's activations are the int8 kernels' Q8_0 blocks, f16 scales included.
    #[test]
    fn q8_0_for_q4_0_is_the_int8_quantizer() {
        let xs: Vec<f32> = (0..3 * 64).map(|i| (i as f32 * 0.71).cos() * 3.0).collect();
        let qx = QuantizedX::new(&xs, 3, 64, BlockType::Q4_0, true);
        for r in 0..3 {
            let (codes, scales, _) = qx.row(r);
            for b in 0..2 {
                let mut want = [0i8; 32];
                let d =
                    crate::weights::int8::quant::quantize(&xs[r * 64 + 32 * b..][..32], &mut want);
                assert_eq!(scales[b], block_scale(d));
                assert_eq!(&codes[32 * b..][..32], &want);
            }
        }
    }
}
