//! What the attention maps say a model used, beyond one layer's raw weights.
//!
//! A raw map shows where one head of one layer looks. Information also mixes across
//! layers through the residual stream, so Abnar & Zuidema (2020) follow it through the
//! stack, treating each layer's heads-averaged map plus the identity (the residual) as
//! one step:
//!
//! - [`rollout`]: the product of those steps, Â_l · … · Â_1;
//! - [`flow`]: the maximum flow through the layered graph whose capacities they are.
//!
//! Both take one sequence's self-attention maps, `[H, T, T]` per layer from the first,
//! and give one `[T, T]` per layer: row t, how much each input token reaches token t of
//! that layer. Each row sums to 1.
//!
//! [`gradient_rollout`] (Chefer, Gur & Wolf 2021) weighs each head by the gradient of a
//! target with respect to its map, which
//! [`Transformer::attention_grads`](crate::models::Transformer::attention_grads)
//! computes through the training backward.

mod flow;
mod gradient;
mod rollout;

pub use flow::{flow, MAX_FLOW_TOKENS};
pub use gradient::gradient_rollout;
pub use rollout::rollout;

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
fn residual_means(maps: &[Tensor]) -> Result<(usize, Vec<Vec<f64>>)> {
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
fn matrix(t: usize, m: &[f64]) -> Tensor {
    Tensor::from_fn(&[t, t], |i| m[i] as f32)
}
