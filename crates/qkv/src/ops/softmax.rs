//! Numerically stable softmax over the last axis.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Index of the largest value of a row (logits): the first of ties; NaN never wins.
pub fn argmax(row: &[f32]) -> usize {
    // the largest value through 16 running maxima (a loop the compiler vectorises; a
    // vocabulary of 32 000 is read at memory speed), then its first position
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = m.max(x);
        }
    }
    let best = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    row.iter().position(|&x| x == best).unwrap_or(0)
}

/// Softmax of each `n`-wide row of `x`, in place. The row maximum is subtracted
/// first so `exp` never overflows. A row whose entries are all −∞ (every key masked)
/// becomes zeros, not NaN.
pub fn softmax_rows(x: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    for row in x.chunks_exact_mut(n) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum = exp_shifted_sum(row, max);
        if sum == 0.0 {
            continue;
        }
        let inv = 1.0 / sum;
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// `row[j] ← exp(row[j] − max)` for the row's maximum `max`, returning the row's new sum
/// (≥ 1). A row whose maximum is −∞ (nothing visible) becomes zeros and sums to 0.
pub fn exp_shifted_sum(row: &mut [f32], max: f32) -> f32 {
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return 0.0;
    }
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum
}

/// Softmax over the last axis of `x`.
pub fn softmax(x: &Tensor) -> Tensor {
    let mut y = x.clone();
    let n = y.last_dim();
    softmax_rows(y.data_mut(), n);
    y
}

/// Backward of [`softmax_rows`]: for each `n`-wide row, **accumulates**
/// `dx += y ∘ (dy − Σⱼ dyⱼ·yⱼ)`, where `y` is the softmax output the forward returned
/// (the Jacobian of softmax is diag(y) − y·yᵀ, so only `y` is needed, not the input).
/// A fully masked row (all-zero `y`) gets zero gradient. `y`, `dy` and `dx` have the
/// same length, a multiple of `n`.
pub fn softmax_backward(y: &[f32], dy: &[f32], n: usize, dx: &mut [f32]) -> Result<()> {
    if y.len() != dy.len() || y.len() != dx.len() {
        return Err(Error::shape(
            "softmax backward dy, dx",
            format!("{} elements each, as y", y.len()),
            &[dy.len(), dx.len()],
        ));
    }
    if n == 0 {
        return Ok(());
    }
    if !y.len().is_multiple_of(n) {
        return Err(Error::shape(
            "softmax backward y",
            format!("rows of {n}"),
            &[y.len()],
        ));
    }
    for ((yr, gr), dr) in y
        .chunks_exact(n)
        .zip(dy.chunks_exact(n))
        .zip(dx.chunks_exact_mut(n))
    {
        let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
        for ((d, &yi), &gi) in dr.iter_mut().zip(yr).zip(gr) {
            *d += yi * (gi - dot);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first index of the largest value, one comparison at a time.
    fn argmax_reference(row: &[f32]) -> usize {
        let mut best = None;
        for (i, &x) in row.iter().enumerate() {
            if !x.is_nan() && best.is_none_or(|b: usize| x > row[b]) {
                best = Some(i);
            }
        }
        best.unwrap_or(0)
    }

    #[test]
    fn argmax_takes_the_first_of_ties_and_never_nan_at_any_length() {
        let mut rng = crate::rng::Rng::new(3);
        for n in [1, 2, 15, 16, 17, 33, 1000, 32000] {
            // few distinct values, so ties are common
            let mut row: Vec<f32> = (0..n)
                .map(|_| (rng.uniform() * 7.0).floor() as f32)
                .collect();
            assert_eq!(argmax(&row), argmax_reference(&row), "n {n}");
            row[n / 2] = f32::NAN;
            row[n - 1] = f32::INFINITY;
            assert_eq!(argmax(&row), argmax_reference(&row), "n {n} with NaN and ∞");
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN]), 1);
    }

    #[test]
    fn argmax_takes_first_of_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), 1);
    }

    #[test]
    fn backward_of_masked_row_is_zero_and_accumulates() {
        let y = vec![0.0; 3];
        let mut dx = vec![1.0; 3];
        softmax_backward(&y, &[1.0, -2.0, 3.0], 3, &mut dx).unwrap();
        assert_eq!(dx, vec![1.0; 3]);
        // a uniform upstream gradient has no effect: softmax is shift-invariant
        let mut x = vec![0.3, -1.0, 2.0];
        softmax_rows(&mut x, 3);
        let mut dx = vec![0.0; 3];
        softmax_backward(&x, &[0.7; 3], 3, &mut dx).unwrap();
        assert!(dx.iter().all(|d| d.abs() < 1e-7), "{dx:?}");
    }

    #[test]
    fn backward_names_mismatched_lengths() {
        let err = softmax_backward(&[0.5; 4], &[0.0; 3], 2, &mut [0.0; 4]).unwrap_err();
        assert!(err.to_string().contains("softmax backward dy, dx"), "{err}");
        let err = softmax_backward(&[0.5; 4], &[0.0; 4], 3, &mut [0.0; 4]).unwrap_err();
        assert!(err.to_string().contains("rows of 3"), "{err}");
    }

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
