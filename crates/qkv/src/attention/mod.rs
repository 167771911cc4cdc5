//! Scaled dot-product attention, `softmax(Q·Kᵀ·scale + bias)·V`: the one entry point
//! every layer and model calls, with masks and position biases as parts of one spec.
//!
//! Layout: Q `[B,T,H,D]`, K `[B,S,G,D]`, V `[B,S,G,Dv]`, output `[B,T,H,Dv]`. G key/value
//! heads serve H query heads (G = H: multi-head, 1 < G < H: grouped-query, G = 1:
//! multi-query); kernels read the shared heads through strides, never copying K/V.

mod backward;
mod cache;
mod decode;
mod micro;
mod packed;
mod reference;
mod spec;
mod tiled;
mod view;

pub use backward::{attention_backward, attention_backward_views, AttentionGrads};
pub use cache::{KvCache, LayerKv, Step};
pub use spec::{validate, AttentionSpec, Bias, Broadcast, CausalAlign, Dims, Kernel};
pub use view::HeadsView;

use crate::error::Result;
use crate::tensor::Tensor;
use spec::Scorer;

/// What one attention call returns.
#[derive(Clone, Debug)]
pub struct AttentionOutput {
    /// [B, T, H, Dv]
    pub out: Tensor,
    /// [B, H, T]: log Σ_j exp(score_ij) per query row, −∞ for a fully masked row.
    pub lse: Tensor,
    /// [B, H, T, S] softmax weights, when the spec asked for them.
    pub weights: Option<Tensor>,
}

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
    attention_views(
        &HeadsView::of(q, "q")?,
        &HeadsView::of(k, "k")?,
        &HeadsView::of(v, "v")?,
        spec,
    )
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
/// (see [`spec::validate_inner`]).
fn run(
    q: &HeadsView,
    k: &HeadsView,
    v: &HeadsView,
    spec: &AttentionSpec,
    check_kv: bool,
) -> Result<AttentionOutput> {
    let dims = spec::validate_inner(q, k, v, spec, check_kv)?;
    let scorer = Scorer::new(dims, spec);
    Ok(match spec.kernel {
        Kernel::Reference => reference::attention(q, k, v, &scorer, spec.want_weights),
        Kernel::Tiled => tiled::attention(q, k, v, &scorer, spec.want_weights),
    })
}
