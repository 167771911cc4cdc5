//! Cross-entropy over a vocabulary: the loss a language model trains on.
//!
//! For logits z: `[N, V]` and targets t: `[N]`, the loss is the mean over the rows whose
//! target is not [`IGNORE_INDEX`] of −log softmax(zᵢ)`[tᵢ]` = logsumexp(zᵢ) − zᵢ`[tᵢ]`,
//! as `torch.nn.functional.cross_entropy(z, t, ignore_index=-100)` computes it.
//! Its gradient is (softmax(zᵢ) − onehot(tᵢ)) / n_valid on those rows and zero on
//! ignored ones.
//!
//! One deliberate difference from PyTorch: when every target is ignored (a batch of
//! padding only), PyTorch's mean is 0/0 = NaN; here it is an error saying there are no
//! scored targets, so the batch is neither trained on as NaN nor reported as loss 0.
//! Non-finite logits still give a non-finite loss, for the trainer to report.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The target value that marks a position without a loss (padding, prompt tokens),
/// as in PyTorch.
pub const IGNORE_INDEX: i64 = -100;

/// Rows per rayon task: enough work per task that splitting pays off for wide
/// vocabularies without splitting small batches at all.
const MIN_ELEMENTS_PER_TASK: usize = 1 << 15;

/// Mean cross-entropy of `logits` (`[N, V]`, or any `[.., V]` with N rows) against
/// `targets` (`[N]` token ids in 0..V, or −100 to ignore the row), and its gradient
/// d loss / d logits (`[.., V]`, shaped as `logits`).
///
/// Errors if `targets` does not have one entry per row, or a target is neither in
/// 0..V nor −100, and when every target is ignored (no scored targets; torch gives NaN).
pub fn cross_entropy(logits: &Tensor, targets: &[i64]) -> Result<(f32, Tensor)> {
    let mut dlogits = logits.clone();
    let loss = cross_entropy_in_place(&mut dlogits, targets)?;
    Ok((loss, dlogits))
}

/// As [`cross_entropy`], but overwrites `logits` with the gradient instead of
/// allocating one (the logits are the largest activation of a language model, and
/// nothing needs them after the loss). On error `logits` is left unchanged.
pub fn cross_entropy_in_place(logits: &mut Tensor, targets: &[i64]) -> Result<f32> {
    let v = logits.last_dim();
    if logits.rank() == 0 || v == 0 {
        return Err(Error::shape(
            "cross-entropy logits",
            "[N, V ≥ 1]",
            logits.shape(),
        ));
    }
    let n = logits.numel() / v;
    if targets.len() != n {
        return Err(Error::shape(
            "cross-entropy targets",
            format!("[{n}] (one per row of logits {:?})", logits.shape()),
            &[targets.len()],
        ));
    }
    let mut valid = 0usize;
    for (i, &t) in targets.iter().enumerate() {
        if t == IGNORE_INDEX {
            continue;
        }
        if t < 0 {
            return Err(Error::invalid(
                "cross-entropy targets",
                format!(
                    "target {t} at row {i} is negative and not the ignore index {IGNORE_INDEX}"
                ),
            ));
        }
        if t as u64 >= v as u64 {
            return Err(Error::OutOfRange {
                what: format!("cross-entropy target at row {i}"),
                index: t as usize,
                size: v,
            });
        }
        valid += 1;
    }
    if valid == 0 {
        // torch returns NaN (0 / 0); a loss of 0 would read as a perfect fit
        return Err(Error::invalid(
            "cross-entropy targets",
            format!("no scored targets: all {n} are the ignore index {IGNORE_INDEX}"),
        ));
    }
    // d mean / d (row loss) = 1 / n_valid for every valid row.
    let scale = 1.0 / valid as f32;
    let rows_per_task = (MIN_ELEMENTS_PER_TASK / v).max(1);
    // Per-row losses are computed in parallel and summed in a fixed order afterwards,
    // so the result does not depend on the thread count.
    let mut row_loss = vec![0.0f64; n];
    logits
        .data_mut()
        .par_chunks_mut(v * rows_per_task)
        .zip(row_loss.par_chunks_mut(rows_per_task))
        .zip(targets.par_chunks(rows_per_task))
        .for_each(|((rows, losses), ts)| {
            for ((row, loss), &t) in rows.chunks_exact_mut(v).zip(losses).zip(ts) {
                *loss = row_backward(row, t, scale);
            }
        });
    Ok((row_loss.iter().sum::<f64>() / valid as f64) as f32)
}

/// Turns one row of logits into its gradient `scale·(softmax(row) − onehot(t))` and
/// returns its loss logsumexp(row) − row`[t]`; an ignored row becomes zeros, loss 0.
fn row_backward(row: &mut [f32], t: i64, scale: f32) -> f64 {
    if t == IGNORE_INDEX {
        row.fill(0.0);
        return 0.0;
    }
    let t = t as usize;
    // Subtracting the maximum keeps exp ≤ 1, so nothing overflows.
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let target_shifted = (row[t] - max) as f64;
    let mut sum = 0.0f64;
    for z in row.iter_mut() {
        *z = (*z - max).exp();
        sum += *z as f64;
    }
    // loss = log Σ exp(z − max) − (z_t − max)
    let loss = sum.ln() - target_shifted;
    // forward: p = exp(z − max) / sum  →  d loss / dz = scale·(p − onehot(t))
    let k = (scale as f64 / sum) as f32;
    for z in row.iter_mut() {
        *z *= k;
    }
    row[t] -= scale;
    loss
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_log_v() {
        let logits = Tensor::zeros(&[2, 4]);
        let (loss, d) = cross_entropy(&logits, &[1, 3]).unwrap();
        assert!((loss - 4f32.ln()).abs() < 1e-6);
        // (1/4 − 1)/2 at the target, (1/4)/2 elsewhere
        assert!((d.data()[1] + 0.375).abs() < 1e-7 && (d.data()[0] - 0.125).abs() < 1e-7);
    }

    #[test]
    fn huge_logits_stay_finite() {
        let logits = Tensor::new(&[1, 3], vec![1e30, -1e30, 0.0]).unwrap();
        let (loss, d) = cross_entropy(&logits, &[0]).unwrap();
        assert_eq!(loss, 0.0);
        assert!(d.data().iter().all(|v| v.is_finite()));
        let (loss, _) = cross_entropy(&logits, &[2]).unwrap();
        assert_eq!(loss, 1e30);
    }

    #[test]
    fn bad_targets_are_errors_and_leave_logits() {
        let mut logits = Tensor::from_fn(&[2, 3], |i| i as f32);
        let before = logits.clone();
        let err = cross_entropy_in_place(&mut logits, &[0, 3])
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 1") && err.contains("3"), "{err}");
        let err = cross_entropy_in_place(&mut logits, &[-1, 0])
            .unwrap_err()
            .to_string();
        assert!(err.contains("-1") && err.contains("row 0"), "{err}");
        assert!(cross_entropy_in_place(&mut logits, &[0]).is_err());
        assert_eq!(logits, before);
    }

    #[test]
    fn all_ignored_is_an_error_not_a_perfect_loss() {
        let logits = Tensor::from_fn(&[3, 5], |i| i as f32 * 0.1);
        let err = cross_entropy(&logits, &[IGNORE_INDEX; 3])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no scored targets"), "{err}");
    }
}
