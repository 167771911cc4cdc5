//! The tiled kernels' inner loops on register tiles: scores S = scale·Q·Kᵀ (and
//! dP = dO·Vᵀ), the online softmax of a row of scores, and acc = corr·acc + A·B (P·V,
//! and the backward's Pᵀ·dO, dSᵀ·Q, dS·K). Each has one vector body, generic over
//! [`Vector`](crate::ops::vector::Vector) and compiled for AVX-512 and for AVX2 + FMA
//! (chosen at run time), and a portable form that says what it computes in plain
//! loops; the reference kernel (`reference.rs`) is the readable twin the tests hold
//! them to.
//!
//! Keys are packed once per key block into panels of 16 keys, `[D][16]` each (zero
//! padded to a whole panel), so the scores product reads one AVX-512 vector (or two
//! AVX2 ones) per (d, panel) and broadcasts one query element per (row, d): 6 rows × 2
//! vectors of accumulators, two loads and one broadcast fit either register file. A·B
//! reads B in place (its rows are contiguous), A through strides (so Pᵀ needs no
//! copy), and keeps 6 rows × 2 vectors of output columns in registers.
//!
//! - `operands.rs`: the operands of each kernel, and the panel width;
//! - `kernels.rs`: [`Kernels`], which checks the operands' bounds and runs each
//!   kernel in the form the CPU has;
//! - `portable.rs`: every kernel in plain loops;
//! - `x86/`: the vector bodies (`scores.rs`, `mul_acc.rs`, `dots.rs`, `softmax.rs`)
//!   and their AVX-512 and AVX2 entry points.

mod kernels;
mod operands;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use kernels::Kernels;
pub(crate) use operands::{Dots, MulAcc, Scores, SoftmaxRows, Strided, PANEL};
