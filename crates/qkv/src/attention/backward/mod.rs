//! The backward pass of [`attention`](super::attention): given the upstream gradient
//! dO of the output, the gradients of Q, K, V and (for a learnable dense bias such as
//! T5's) of the additive bias.
//!
//! Forward, per batch row b and query head h (g = the key/value head h reads):
//!
//! ```text
//! S = scale·Q·Kᵀ + bias, masked to −∞      (1)   [T, S]
//! P = softmax(S) row by row                (2)   [T, S]
//! O = P·V                                  (3)   [T, Dv]
//! ```
//!
//! Backward, from the last line up:
//!
//! ```text
//! dV = Pᵀ·dO                     from (3)
//! dP = dO·Vᵀ                     from (3)
//! dS = P∘(dP − D),  D_i = Σ_j P_ij·dP_ij = Σ_c dO_ic·O_ic      from (2), softmax's Jacobian
//! dQ = scale·dS·K,  dK = scale·dSᵀ·Q,  dbias = dS               from (1)
//! ```
//!
//! Masked entries have P = 0, hence dS = 0: no gradient flows through a masked score,
//! and a fully masked query row (output defined as zeros) gives zero gradient to
//! everything, never NaN. Under GQA the H/G query heads sharing one key/value head
//! each add their dK and dV into it.
//!
//! Two kernels, as in the forward: `reference` materialises P per (batch, head) and
//! is written to be read; `tiled` is the FlashAttention-2 backward (P recomputed tile
//! by tile from the saved log-sum-exp, never stored whole). Tests hold them equal.

mod grads;
mod reference;
mod tiled;

pub use grads::AttentionGrads;

use super::output::AttentionOutput;
use super::spec::{validate, AttentionSpec, Bias, Kernel, Scorer};
use super::view::HeadsView;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Backward of [`attention`](super::attention) for q: `[B,T,H,D]`, k: `[B,S,G,D]`,
/// v: `[B,S,G,Dv]`, the forward's result `fwd` (its `out` `[B,T,H,Dv]` and `lse`
/// `[B,H,T]` are used; the weights are not needed) and the upstream gradient
/// d_out: `[B,T,H,Dv]`, under the same `spec` as the forward.
///
/// `want_dbias` asks for the gradient of a [`Bias::Dense`] (a learnable bias such as
/// T5's relative bias, or a float mask that requires grad); it is an error without
/// one. ALiBi has no parameters: its slopes are fixed, so there is nothing to return.
///
/// Dispatches on `spec.kernel`. The reference kernel recomputes P from Q and K and so
/// uses neither `fwd.out` nor `fwd.lse`; the tiled kernel uses both.
pub fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    fwd: &AttentionOutput,
    d_out: &Tensor,
    spec: &AttentionSpec,
    want_dbias: bool,
) -> Result<AttentionGrads> {
    let [q, k, v] = HeadsView::of_qkv([q, k, v])?;
    attention_backward_views(&q, &k, &v, fwd, d_out, spec, want_dbias)
}

/// The gradient of the softmax weights P `[B,H,T,S]` from the upstream gradient d_out
/// `[B,T,H,Dv]` of the output O = P·V and the values v `[B,S,G,Dv]`: dP = dO·Vᵀ per batch
/// row and head (query head h reads key/value head h·G/H). It is what attribution by
/// gradients reads (the maps' gradients); the kernels form the same product tile by
/// tile on their way to dS.
pub fn weight_grads(d_out: &Tensor, v: &Tensor) -> Result<Tensor> {
    let [b, t, h, dv] = d_out.shape()[..] else {
        return Err(Error::shape("d_out", "[B, T, H, Dv]", d_out.shape()));
    };
    v.expect_shape("v", &[Some(b), None, None, Some(dv)])?;
    let (s, g) = (v.shape()[1], v.shape()[2]);
    if g == 0 || h % g != 0 {
        return Err(Error::shape(
            "v",
            "[B, S, G, Dv] with G dividing H",
            v.shape(),
        ));
    }
    let mut dp = Tensor::zeros(&[b, h, t, s]);
    let out = dp.data_mut();
    for bi in 0..b {
        for head in 0..h {
            let kv = head / (h / g);
            for i in 0..t {
                let d_o = &d_out.data()[((bi * t + i) * h + head) * dv..][..dv];
                let row = &mut out[((bi * h + head) * t + i) * s..][..s];
                for (j, x) in row.iter_mut().enumerate() {
                    let v_j = &v.data()[((bi * s + j) * g + kv) * dv..][..dv];
                    *x = d_o.iter().zip(v_j).map(|(a, c)| a * c).sum();
                }
            }
        }
    }
    Ok(dp)
}

/// [`attention_backward`] over views, mirroring [`super::attention_views`].
pub fn attention_backward_views(
    q: &HeadsView,
    k: &HeadsView,
    v: &HeadsView,
    fwd: &AttentionOutput,
    d_out: &Tensor,
    spec: &AttentionSpec,
    want_dbias: bool,
) -> Result<AttentionGrads> {
    let dims = validate(q, k, v, spec)?;
    let (b, t, h, dv) = (dims.b, dims.t, dims.h, dims.dv);
    d_out.expect_shape("d_out", &[Some(b), Some(t), Some(h), Some(dv)])?;
    d_out.check_finite("d_out")?;
    fwd.out
        .expect_shape("forward out", &[Some(b), Some(t), Some(h), Some(dv)])?;
    fwd.out.check_finite("forward out")?;
    fwd.lse
        .expect_shape("forward lse", &[Some(b), Some(h), Some(t)])?;
    if let Some(i) = fwd
        .lse
        .data()
        .iter()
        .position(|x| x.is_nan() || *x == f32::INFINITY)
    {
        return Err(Error::NonFinite {
            tensor: "forward lse".into(),
            index: i,
            value: fwd.lse.data()[i],
        });
    }
    let dbias_shape = match (want_dbias, &spec.bias) {
        (false, _) => None,
        (true, Some(Bias::Dense(bias))) => Some(bias.shape),
        (true, _) => {
            return Err(Error::invalid(
                "want_dbias",
                "the spec has no dense bias to differentiate (ALiBi slopes are fixed)",
            ))
        }
    };
    let scorer = Scorer::new(dims, spec);
    let d_out = HeadsView::of(d_out, "d_out")?;
    Ok(match spec.kernel {
        Kernel::Reference => reference::backward([q, k, v, &d_out], &scorer, dbias_shape),
        Kernel::Tiled => tiled::backward([q, k, v, &d_out], fwd, &scorer, dbias_shape),
    })
}
