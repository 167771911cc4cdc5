//! The readable twin of the block products: x quantized as every form quantizes it,
//! both operands dequantized to f32, then the f32 product ([`crate::weights::stored`]).

use super::activations::QuantizedX;
use super::weight::BlockWeight;
use crate::weights::stored::reference_product;

/// y `[rows, N]` ← (accumulate ? y : 0) + deq(q(x))·deq(W)ᵀ.
pub fn product(y: &mut [f32], x: &[f32], rows: usize, w: &BlockWeight, accumulate: bool) {
    let x = QuantizedX::new(x, rows, w.k(), w.ty(), false).dequantized();
    reference_product(y, &x, rows, w, accumulate);
}
