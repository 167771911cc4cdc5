//! The readable twin of the int8 products: x quantized as every form quantizes it,
//! both operands dequantized to f32 (q·d), then the f32 product
//! ([`crate::ops::gemm`], itself held to f64 loops). The tests hold every form to it.

use super::rows::QuantizedRows;
use super::weight::Int8Weight;
use crate::ops::{gemm, MatMut, MatRef, Par};

/// y `[rows, N]` ← (accumulate ? y : 0) + deq(q(x))·deq(W)ᵀ.
pub fn product(y: &mut [f32], x: &[f32], rows: usize, w: &Int8Weight, accumulate: bool) {
    let (n, k) = (w.n(), w.k());
    let x = QuantizedRows::new(x, rows, w).dequantized(k);
    let wf = w.to_f32();
    gemm(
        MatMut::row_major(y, rows, n),
        MatRef::row_major(&x, rows, k),
        MatRef::row_major(&wf, n, k).t(),
        1.0,
        accumulate,
        Par::Auto,
    )
    .expect("shapes from the weight");
}
