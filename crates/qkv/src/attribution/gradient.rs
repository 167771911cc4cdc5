//! Gradient × attention (Chefer, Gur & Wolf 2021, "Generic attention-model
//! explainability"): each layer's heads weighted by how the target's gradient says they
//! matter, then accumulated with the residual: Ā_l = mean_h (∇A_l ⊙ A_l)⁺,
//! R_0 = I, R_l = R_{l−1} + Ā_l·R_{l−1}.

use super::residual::product;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// R after every layer: `maps` and their gradients `grads` `[H, T, T]` per layer (one
/// sequence's self-attention, from the first layer) → `[T, T]` per layer. Rows are not
/// normalised, as in the authors' code.
pub fn gradient_rollout(maps: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>> {
    if maps.is_empty() || maps.len() != grads.len() {
        return Err(Error::invalid(
            "grads",
            format!(
                "{} maps and {} gradients: one of each per layer",
                maps.len(),
                grads.len()
            ),
        ));
    }
    let t = maps[0].shape().get(1).copied().unwrap_or(0);
    let mut r = identity(t);
    let mut out = Vec::with_capacity(maps.len());
    for (l, (a, g)) in maps.iter().zip(grads).enumerate() {
        let mean = positive_mean(a, g, &format!("maps[{l}]"), &format!("grads[{l}]"), t, t)?;
        // R += Ā·R
        let add = product(t, &mean, &r);
        r.iter_mut().zip(&add).for_each(|(x, a)| *x += a);
        out.push(Tensor::from_fn(&[t, t], |i| r[i] as f32));
    }
    Ok(out)
}

/// The `[n, n]` identity, row-major.
pub(super) fn identity(n: usize) -> Vec<f64> {
    (0..n * n)
        .map(|i| f64::from(u8::from(i / n == i % n)))
        .collect()
}

/// Ā = mean over heads of the positive part of ∇A ⊙ A, for a map `a` `[H, T, S]` (named
/// `name`) and its gradient `g` (named `grad`): `[T·S]`, row-major.
pub(super) fn positive_mean(
    a: &Tensor,
    g: &Tensor,
    name: &str,
    grad: &str,
    t: usize,
    s: usize,
) -> Result<Vec<f64>> {
    let [h, ti, si] = a.shape()[..] else {
        return Err(Error::shape(name, format!("[H, {t}, {s}]"), a.shape()));
    };
    if ti != t || si != s || h == 0 {
        return Err(Error::shape(name, format!("[H, {t}, {s}]"), a.shape()));
    }
    if g.shape() != a.shape() {
        return Err(Error::shape(grad, format!("{:?}", a.shape()), g.shape()));
    }
    a.check_finite(name)?;
    g.check_finite(grad)?;
    let mut mean = vec![0f64; t * s];
    for (head_a, head_g) in a
        .data()
        .chunks_exact(t * s)
        .zip(g.data().chunks_exact(t * s))
    {
        for ((m, &x), &dx) in mean.iter_mut().zip(head_a).zip(head_g) {
            *m += (f64::from(x) * f64::from(dx)).max(0.0) / h as f64;
        }
    }
    Ok(mean)
}
