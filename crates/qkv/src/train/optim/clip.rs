//! Global-norm gradient clipping as torch computes it: the total norm, the clipping
//! factor, and clipping in place.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::chunks::PAR_CHUNK;
use super::params::Params;

/// The global 2-norm of all gradients, √(Σ‖g‖²), as `torch.nn.utils.get_total_norm`
/// computes it: each gradient's norm (accumulated in f64, rounded to f32), then the norm
/// of those norms. Errors on a non-finite gradient, naming the parameter.
pub fn grad_norm<P: Params + ?Sized>(params: &mut P) -> Result<f32> {
    let mut sum_sq = 0.0f64;
    let mut err: Option<Error> = None;
    params.visit(&mut |name, _, g| {
        if err.is_none() {
            match tensor_norm(name, g) {
                Ok(n) => sum_sq += n as f64 * n as f64,
                Err(e) => err = Some(e),
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => total_from(sum_sq),
    }
}

/// ‖g‖₂ in f32 (torch: `vector_norm` of each gradient), accumulated in f64: over the
/// pool in chunks of [`PAR_CHUNK`], whose sums are added in order, so that the result
/// does not depend on how the threads took them.
fn tensor_norm(name: &str, g: &Tensor) -> Result<f32> {
    let sum_sq = |c: &[f32]| c.iter().map(|&x| x as f64 * x as f64).sum::<f64>();
    let chunks: Vec<f64> = g.data().par_chunks(PAR_CHUNK).map(sum_sq).collect();
    let s: f64 = chunks.iter().sum();
    if !s.is_finite() {
        g.check_finite(&format!("{name} (gradient)"))?;
    }
    let n = s.sqrt() as f32;
    if !n.is_finite() {
        return Err(Error::NonFinite {
            tensor: format!("{name} (gradient norm)"),
            index: 0,
            value: n,
        });
    }
    Ok(n)
}

fn total_from(sum_sq: f64) -> Result<f32> {
    let total = sum_sq.sqrt() as f32;
    if !total.is_finite() {
        return Err(Error::NonFinite {
            tensor: "total gradient norm".into(),
            index: 0,
            value: total,
        });
    }
    Ok(total)
}

/// torch's clipping factor `min(max_norm / (total_norm + 1e-6), 1)`, evaluated as torch
/// does in f32 (`float / Tensor` is `reciprocal(total_norm + 1e-6) * max_norm`).
pub fn clip_coefficient(total_norm: f32, max_norm: f64) -> Result<f32> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::invalid(
            "max_norm",
            format!("{max_norm} is not a finite value > 0"),
        ));
    }
    Ok(((1.0f32 / (total_norm + 1e-6f32)) * max_norm as f32).min(1.0))
}

/// Global-norm clipping in place, `torch.nn.utils.clip_grad_norm_(grads, max_norm)`:
/// computes the total norm (as [`grad_norm`]), then multiplies every gradient by
/// [`clip_coefficient`] — always, as torch does, so a coefficient of exactly 1 leaves
/// them unchanged. Returns the total norm *before* clipping. On a non-finite gradient
/// nothing is changed and the error names the parameter.
pub fn clip_grad_norm(grads: &mut [(&str, &mut Tensor)], max_norm: f64) -> Result<f32> {
    let mut sum_sq = 0.0f64;
    for (name, g) in grads.iter() {
        let n = tensor_norm(name, g)? as f64;
        sum_sq += n * n;
    }
    let total = total_from(sum_sq)?;
    let coef = clip_coefficient(total, max_norm)?;
    for (_, g) in grads.iter_mut() {
        for x in g.data_mut() {
            *x *= coef;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::optim::params::two_params;

    #[test]
    fn clip_rejects_non_finite_and_bad_max_norm() {
        let mut ps = two_params();
        let (a, b) = ps.split_at_mut(1);
        let mut grads = [("a", &mut a[0].grad), ("b", &mut b[0].grad)];
        assert!(clip_grad_norm(&mut grads, 0.0).is_err());
        assert!(clip_grad_norm(&mut grads, f64::NAN).is_err());
        grads[0].1.data_mut()[1] = f32::INFINITY;
        let before = grads[1].1.clone();
        let err = clip_grad_norm(&mut grads, 1.0).unwrap_err().to_string();
        assert!(
            err.contains("a (gradient)") && err.contains("index 1"),
            "{err}"
        );
        assert_eq!(*grads[1].1, before);
        let err = grad_norm(&mut ps[..]).unwrap_err().to_string();
        assert!(err.contains("h.0.mlp.weight (gradient)"), "{err}");
    }
}
