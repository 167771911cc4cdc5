//! Slicing and checking helpers for attention tensors in tests.

use qkv::{AttentionOutput, Tensor};

/// Largest |a − b| over two equal-length slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts that an attention output holds no NaN or infinity in `out` and `weights`.
#[track_caller]
pub fn assert_no_nan(what: &str, a: &AttentionOutput) {
    assert!(
        a.out.data().iter().all(|x| x.is_finite()),
        "{what}: non-finite output"
    );
    if let Some(w) = &a.weights {
        assert!(
            w.data().iter().all(|x| x.is_finite()),
            "{what}: non-finite weights"
        );
    }
    // lse is −∞ for fully masked rows, but never NaN or +∞.
    assert!(
        a.lse
            .data()
            .iter()
            .all(|x| !x.is_nan() && *x != f32::INFINITY),
        "{what}: NaN or +∞ log-sum-exp"
    );
}

/// Rows `rows` of axis 1 of a `[B, N, ...]` tensor, as a new `[B, rows.len(), ...]`
/// tensor (in the order given, so a permutation gathers permuted rows).
pub fn gather_axis1(x: &Tensor, rows: &[usize]) -> Tensor {
    let shape = x.shape();
    let (b, n) = (shape[0], shape[1]);
    let inner: usize = shape[2..].iter().product();
    let mut data = Vec::with_capacity(b * rows.len() * inner);
    for bi in 0..b {
        for &r in rows {
            assert!(r < n, "row {r} outside axis of {n}");
            let start = (bi * n + r) * inner;
            data.extend_from_slice(&x.data()[start..start + inner]);
        }
    }
    let mut new_shape = shape.to_vec();
    new_shape[1] = rows.len();
    Tensor::new(&new_shape, data).expect("gathered element count")
}

/// One batch row `b` of a `[B, ...]` tensor, as `[1, ...]`.
pub fn batch_row(x: &Tensor, b: usize) -> Tensor {
    let inner: usize = x.shape()[1..].iter().product();
    let mut shape = x.shape().to_vec();
    shape[0] = 1;
    Tensor::new(&shape, x.data()[b * inner..(b + 1) * inner].to_vec()).expect("row count")
}

/// One head `h` (axis 2) of a `[B, N, H, D]` tensor, as `[B, N, 1, D]`.
pub fn head(x: &Tensor, h: usize) -> Tensor {
    let [b, n, hn, d] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let mut data = Vec::with_capacity(b * n * d);
    for row in 0..b * n {
        let start = (row * hn + h) * d;
        data.extend_from_slice(&x.data()[start..start + d]);
    }
    Tensor::new(&[b, n, 1, d], data).expect("head element count")
}
