//! int8 weights: products of f32 activations with weights stored as 8-bit codes and
//! scales, at about a quarter of f32's bytes. What leaves a product is f32.
//!
//! - [`quant`]: the codes of a group of numbers, d = max|x|/127 and q = round(x/d), as
//!   llama.cpp's Q8_0 makes them;
//! - [`weight`]: a `[N, K]` weight, one scale per 32 steps of a row (Q8_0's blocks, the
//!   default) or per row ([`ScaleLayout`]), in panels of 16 output columns;
//! - [`product`](mod@product): y (+)= deq(q(x))·deq(W)ᵀ, x quantized on the fly in the
//!   weight's groups. Every row count runs integer tiles, each group's sum exact in
//!   i32, so a result does not depend on the row count: `vpdpbusd` on AVX-512 VNNI,
//!   `vpmaddubsw` on AVX2; without AVX2 both operands are dequantized and the f32
//!   product runs, having read the weight at a quarter of the bytes. Where the process has AMX-INT8, more than four rows times
//!   a weight with a scale per row run AMX's `tdpbsud` (the `amx` module), with the VNNI
//!   tiles' bits;
//! - [`reference`](mod@reference): the twin the tests hold every form to: both operands
//!   dequantized, then the f32 product.

mod amx;
mod kernel;
pub mod product;
pub mod q8_0;
pub mod quant;
pub mod reference;
mod rows;
mod slab;
pub mod weight;

pub use weight::{Int8Weight, ScaleLayout};
