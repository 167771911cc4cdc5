//! What every bf16 product form takes, once its start is resolved to adding or not.

use super::weight::Bf16Weight;

/// A product's operands, checked by [`super::product`]: y `[rows, N]` ← (accumulate ? y
/// : 0) + bf16(x) `[rows, K]`·Wᵀ, row-major.
pub(super) struct Job<'a> {
    pub y: &'a mut [f32],
    pub x: &'a [f32],
    pub rows: usize,
    pub w: &'a Bf16Weight,
    pub accumulate: bool,
}
