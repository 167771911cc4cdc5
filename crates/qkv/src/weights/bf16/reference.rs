//! The readable twin of the bf16 products: x rounded to bf16, the weight widened to
//! f32, then the f32 product ([`crate::weights::stored`]). The tests hold every fast form
//! to it.

use super::convert::round_to_bf16;
use super::weight::Bf16Weight;
use crate::weights::stored::reference_product;

/// y `[rows, N]` ← (accumulate ? y : 0) + bf16(x)·Wᵀ: x rounded to bf16, both widened
/// to f32, the f32 product.
pub fn product(y: &mut [f32], x: &[f32], rows: usize, w: &Bf16Weight, accumulate: bool) {
    let x: Vec<f32> = x.iter().map(|&v| round_to_bf16(v)).collect();
    reference_product(y, &x, rows, w, accumulate);
}
