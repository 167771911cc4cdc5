//! The readable twins of the bf16 products: the weight widened to f32, then the f32
//! product ([`crate::ops::gemm`], itself held to f64 loops). The tests hold every
//! fast form to these.

use super::convert::round_to_bf16;
use super::weight::Bf16Weight;
use crate::ops::{gemm, MatMut, MatRef, Par};

/// y `[rows, N]` ← (accumulate ? y : 0) + bf16(x)·Wᵀ: x rounded to bf16, both widened
/// to f32, the f32 product.
pub fn product(y: &mut [f32], x: &[f32], rows: usize, w: &Bf16Weight, accumulate: bool) {
    let (n, k) = (w.n(), w.k());
    let x: Vec<f32> = x.iter().map(|&v| round_to_bf16(v)).collect();
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
