//! The step both of Abnar & Zuidema's methods take per layer: the heads' mean plus the
//! residual's identity, rows renormalised.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Â = 0.5·I + 0.5·mean over heads of `map` `[H, T, T]`, rows renormalised (so rows of
/// zeros, a fully masked query, stay the identity's), in f64: `[T·T]`, row-major.
fn residual_mean(map: &Tensor, layer: usize) -> Result<(usize, Vec<f64>)> {
    let [h, t, s] = map.shape()[..] else {
        return Err(Error::shape(
            format!("maps[{layer}]"),
            "[H, T, T]",
            map.shape(),
        ));
    };
    if t != s || h == 0 || t == 0 {
        return Err(Error::shape(
            format!("maps[{layer}]"),
            "[H ≥ 1, T ≥ 1, T] (self-attention)",
            map.shape(),
        ));
    }
    map.check_finite(&format!("maps[{layer}]"))?;
    let mut m = vec![0f64; t * t];
    for head in map.data().chunks_exact(t * t) {
        m.iter_mut().zip(head).for_each(|(a, &w)| *a += w as f64);
    }
    for (i, row) in m.chunks_exact_mut(t).enumerate() {
        row.iter_mut().for_each(|a| *a *= 0.5 / h as f64);
        row[i] += 0.5;
        let sum: f64 = row.iter().sum();
        row.iter_mut().for_each(|a| *a /= sum);
    }
    Ok((t, m))
}

/// The residual-augmented map of every layer, all of one length: `(T, [L][T·T])`.
pub(super) fn residual_means(maps: &[Tensor]) -> Result<(usize, Vec<Vec<f64>>)> {
    if maps.is_empty() {
        return Err(Error::invalid("maps", "no layers"));
    }
    let mut t0 = None;
    let mut out = Vec::with_capacity(maps.len());
    for (l, map) in maps.iter().enumerate() {
        let (t, m) = residual_mean(map, l)?;
        if *t0.get_or_insert(t) != t {
            return Err(Error::shape(
                format!("maps[{l}]"),
                "the first layer's T",
                map.shape(),
            ));
        }
        out.push(m);
    }
    Ok((t0.expect("at least one layer"), out))
}

/// `[T·T]` rows in f64 → a `[T, T]` tensor.
pub(super) fn matrix(t: usize, m: &[f64]) -> Tensor {
    Tensor::from_fn(&[t, t], |i| m[i] as f32)
}

/// a·b for row-major `[T, T]` matrices.
pub(super) fn product(t: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
    matmul(a, t, t, b, t)
}

/// a·b for row-major a `[n, k]` and b `[k, m]`: `[n, m]`.
pub(super) fn matmul(a: &[f64], n: usize, k: usize, b: &[f64], m: usize) -> Vec<f64> {
    let mut c = vec![0f64; n * m];
    for (c_row, a_row) in c.chunks_exact_mut(m).zip(a.chunks_exact(k).take(n)) {
        for (&a_ik, b_row) in a_row.iter().zip(b.chunks_exact(m)) {
            c_row
                .iter_mut()
                .zip(b_row)
                .for_each(|(c, &b)| *c += a_ik * b);
        }
    }
    c
}
