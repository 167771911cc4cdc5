//! What the backward of one attention call returns.

use crate::tensor::Tensor;

/// Gradients of one attention call. Freshly allocated (Q, K, V are activations, not
/// parameters, so there is nothing to accumulate into); a caller that owns a
/// parameter upstream of them (a projection, a bias table) accumulates from these.
#[derive(Clone, Debug)]
pub struct AttentionGrads {
    /// [B, T, H, D]
    pub dq: Tensor,
    /// [B, S, G, D]: summed over the H/G query heads that share each key head.
    pub dk: Tensor,
    /// [B, S, G, Dv]: summed likewise.
    pub dv: Tensor,
    /// Same shape as the [`Bias::Dense`](crate::attention::Bias::Dense) of the spec, `[Bm, Hm, T, S]`: dS summed over
    /// the axes the bias is broadcast along. `Some` only when asked for.
    pub dbias: Option<Tensor>,
}
