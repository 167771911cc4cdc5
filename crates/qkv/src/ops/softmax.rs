//! Numerically stable softmax over the last axis.

use crate::tensor::Tensor;

/// Softmax of each `n`-wide row of `x`, in place. The row maximum is subtracted
/// first so `exp` never overflows. A row whose entries are all −∞ (every key masked)
/// becomes zeros, not NaN.
pub fn softmax_rows(x: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    for row in x.chunks_exact_mut(n) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            row.fill(0.0);
            continue;
        }
        let mut sum = 0.0;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// Softmax over the last axis of `x`.
pub fn softmax(x: &Tensor) -> Tensor {
    let mut y = x.clone();
    let n = y.last_dim();
    softmax_rows(y.data_mut(), n);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sum_to_one_even_for_huge_values() {
        let mut x = vec![1e4, 1e4 - 1.0, -1e4, 0.5, 0.25, 0.125];
        softmax_rows(&mut x, 3);
        for row in x.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            assert!(row.iter().all(|v| v.is_finite()));
        }
    }

    #[test]
    fn fully_masked_row_is_zero() {
        let mut x = vec![f32::NEG_INFINITY; 4];
        softmax_rows(&mut x, 4);
        assert_eq!(x, vec![0.0; 4]);
    }
}
