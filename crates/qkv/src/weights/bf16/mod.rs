//! bf16 weights: products of f32 activations with weights stored as bfloat16 (the top
//! 16 bits of an f32: its sign, all 8 exponent bits and 7 of the 23 mantissa bits), at
//! half the bytes of f32. Sums are f32; what leaves a product is f32.
//!
//! - [`convert`]: f32 → bf16 with round-to-nearest-even, as PyTorch's `.to(bfloat16)`;
//! - [`weight`]: a `[N, K]` weight in the one layout both products read (panels of 16
//!   output columns, K in pairs);
//! - [`product`](mod@product): y (+)= bf16(x)·Wᵀ: x rounded to bf16 as the weight is, products and
//!   sums in f32, whichever form runs (so a result does not depend on the row count or
//!   the CPU beyond the order of the sums, and beyond subnormal operands, below 2⁻¹²⁶,
//!   which `vdpbf16ps` and `tdpbf16ps` take as zero). A few rows (a decoding step) stream the
//!   weight once, widening each weight to f32 in registers: that path is bound by
//!   memory and reads half the bytes of f32. More rows go through AMX's `tdpbf16ps`
//!   where the CPU and the kernel give it (Intel's Xeons from Sapphire Rapids on:
//!   16×16×32 multiply-adds an instruction, 2–3× the f32 product on 2 threads), else
//!   through AVX512-BF16's `vdpbf16ps` (pairs of products summed in f32) on AMD's Zen 4
//!   and 5, where it does twice the multiply-adds of an f32 FMA, and elsewhere through
//!   the f32 product of the operands widened 256 weight rows at a time (on Intel's
//!   Xeons `vdpbf16ps` ran at half the f32 product's rate: `gemm::preferred`);
//! - [`grad`]: the two products of a linear layer's backward (dx and dW) through the
//!   same forms, for mixed-precision training;
//! - [`reference`](mod@reference): the readable twin the tests hold every form to: both operands
//!   rounded and widened to f32, then the f32 product.

mod amx;
pub mod convert;
mod gemm;
mod gemv;
pub mod grad;
mod job;
pub mod product;
pub mod reference;
mod slab;
pub mod weight;

pub use convert::{bf16_to_f32, f32_to_bf16};

pub use weight::Bf16Weight;

/// Whether this CPU multiplies bf16 natively (AVX512-BF16's `vdpbf16ps`, or AMX tiles):
/// bf16 weights then run their products at twice f32's rate, or more, where elsewhere
/// they are widened to f32 first.
pub fn native() -> bool {
    gemm::available() || super::amx::bf16()
}
