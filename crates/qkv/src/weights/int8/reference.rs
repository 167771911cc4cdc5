//! The readable twin of the int8 products: x quantized as every form quantizes it,
//! both operands dequantized to f32 (q·d), then the f32 product
//! ([`crate::weights::stored`]). The tests hold every form to it.

use super::rows::QuantizedRows;
use super::weight::Int8Weight;
use crate::weights::stored::reference_product;

/// y `[rows, N]` ← (accumulate ? y : 0) + deq(q(x))·deq(W)ᵀ.
pub fn product(y: &mut [f32], x: &[f32], rows: usize, w: &Int8Weight, accumulate: bool) {
    let x = QuantizedRows::new(x, rows, w, false).dequantized(w.k());
    reference_product(y, &x, rows, w, accumulate);
}
