//! What one attention call returns: the output, the log-sum-exp the backward and the
//! recomputed weights need, and the weights when asked for.

use crate::tensor::Tensor;

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
