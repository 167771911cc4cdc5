//! The kernels' vector bodies, generic over [`Vector`](crate::ops::vector::Vector),
//! and their entry points for AVX2 + FMA and AVX-512: `scores.rs` (S = scale·Q·Kᵀ),
//! `mul_acc.rs` (acc = corr·acc + A·B, B in f32 or bf16), `dots.rs` (query rows against
//! keys in place, f32 or bf16) and `softmax.rs` (the online softmax of rows of scores).
//! `load.rs` is how a body loads B or the keys in either type.

mod dots;
mod load;
mod mul_acc;
mod scores;
mod softmax;

use std::arch::x86_64::{__m256, __m512};

use super::operands::{Dots, MulAcc, Scores, SoftmaxRows};
use dots::{dots, dots_bf16};
use mul_acc::{mul_acc, mul_acc_bf16};
use scores::scores;
use softmax::{exp_shift, softmax_rows};

/// Defines the kernels' entry points, one module per instruction set (`avx2` and
/// `avx512`) with one function per kernel: compiled with that set's target
/// features, it instantiates the generic body for the set's vector type (the body
/// is `#[inline(always)]`, so it is compiled in there) and, where the kernel takes
/// them, for the rows of its register tiles: 6 with AVX2's 16 registers (6 × 2
/// sums, two loads, a broadcast), 8 with AVX-512's 32.
macro_rules! entry_points {
    ($($generic:ident $(<$r2:literal, $r512:literal>)? ($($arg:ident: $ty:ty),*);)*) => {
        pub(super) mod avx2 {
            use super::*;
            $(
                /// # Safety
                /// AVX2 and FMA; the bounds asserted by the `Kernels` method of
                /// this name.
                #[target_feature(enable = "avx2,fma")]
                pub(crate) unsafe fn $generic($($arg: $ty),*) {
                    super::$generic::<__m256 $(, $r2)?>($($arg),*)
                }
            )*
        }

        pub(super) mod avx512 {
            use super::*;
            $(
                /// # Safety
                /// AVX-512 F, AVX2 and FMA; as the AVX2 entry point.
                #[target_feature(enable = "avx512f,avx2,fma")]
                pub(crate) unsafe fn $generic($($arg: $ty),*) {
                    super::$generic::<__m512 $(, $r512)?>($($arg),*)
                }
            )*
        }
    };
}

entry_points! {
    scores<6, 8>(s: Scores);
    mul_acc<6, 8>(t: MulAcc);
    mul_acc_bf16<6, 8>(t: MulAcc<u16>);
    dots(t: Dots);
    dots_bf16(t: Dots<u16>);
    softmax_rows(t: SoftmaxRows);
    exp_shift(row: &mut [f32], l: f32);
}
