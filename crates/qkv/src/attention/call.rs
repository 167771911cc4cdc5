//! The one entry point: the inputs and the spec checked, the [`Scorer`] built (every
//! mask and bias in one place), then the kernel the spec names.

use super::output::AttentionOutput;
use super::spec::{validate_inner, AttentionSpec, Kernel, Scorer};
use super::view::HeadsView;
use super::{reference, tiled};
use crate::error::Result;
use crate::tensor::Tensor;

/// Attention of q: `[B,T,H,D]` over k: `[B,S,G,D]`, v: `[B,S,G,Dv]` under `spec`.
///
/// A query row whose keys are all masked yields zeros (and −∞ log-sum-exp), never NaN.
/// Shapes, masks and non-finite inputs are checked first and reported as [`crate::Error`].
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: &AttentionSpec,
) -> Result<AttentionOutput> {
    let [q, k, v] = HeadsView::of_qkv([q, k, v])?;
    attention_views(&q, &k, &v, spec)
}

/// [`attention`] over views, so K and V can be read in place from a cache whose batch
/// rows have spare capacity.
pub fn attention_views(
    q: &HeadsView,
    k: &HeadsView,
    v: &HeadsView,
    spec: &AttentionSpec,
) -> Result<AttentionOutput> {
    run(q, k, v, spec, true)
}

/// [`attention_views`], scanning K and V for non-finite values only when `check_kv`
/// (a cache checks its rows as they are appended).
pub(super) fn run(
    q: &HeadsView,
    k: &HeadsView,
    v: &HeadsView,
    spec: &AttentionSpec,
    check_kv: bool,
) -> Result<AttentionOutput> {
    let dims = validate_inner(q, k, v, spec)?;
    if check_kv {
        k.check_finite("k")?;
        v.check_finite("v")?;
    }
    let scorer = Scorer::new(dims, spec);
    Ok(match spec.kernel {
        Kernel::Reference => reference::attention([q, k, v], &scorer, spec.want_weights),
        Kernel::Tiled => tiled::attention(
            [q, k, v],
            &scorer,
            spec.want_weights,
            spec.bf16 && !spec.want_weights,
        ),
    })
}
