//! Attention rollout (Abnar & Zuidema 2020): R_1 = Â_1, R_l = Â_l · R_{l−1}.

use super::residual::{matrix, product, residual_means};
use crate::error::Result;
use crate::tensor::Tensor;

/// Rollout through every layer: `maps` `[H, T, T]` per layer → `[T, T]` per layer, row
/// t of layer l the share of each input token in token t after layer l.
pub fn rollout(maps: &[Tensor]) -> Result<Vec<Tensor>> {
    let (t, steps) = residual_means(maps)?;
    let mut joint: Option<Vec<f64>> = None;
    let mut out = Vec::with_capacity(steps.len());
    for step in steps {
        let next = match &joint {
            None => step,
            Some(prev) => product(t, &step, prev),
        };
        out.push(matrix(t, &next));
        joint = Some(next);
    }
    Ok(out)
}
