//! One kernel body for two vector widths. The hot loops (matrix-product tiles, the
//! attention blocks) are written once, generic over [`Vector`], and instantiated for
//! AVX2 + FMA (`__m256`, 8 lanes) and AVX-512 (`__m512`, 16 lanes) inside functions
//! compiled for that instruction set. [`Isa::detect`] (`ops/isa.rs`) picks one at run time.
//!
//! Every method is `#[inline(always)]` and every generic kernel must be too: the
//! intrinsics inline only into a function compiled with their target feature, so the
//! whole generic body has to land inside the `#[target_feature]` entry point that
//! instantiates it.

pub use super::isa::Isa;

/// The operations the generic kernels use, on `LANES` f32 lanes.
///
/// # Safety
/// Every method needs the instruction set of its implementation; pointers must be
/// valid for `LANES` floats (one for [`Vector::splat_from`]).
#[allow(clippy::missing_safety_doc)]
pub trait Vector: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// One float from memory on every lane.
    unsafe fn splat_from(p: *const f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// self · b + c, rounded once.
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    unsafe fn times(self, b: Self) -> Self;
    unsafe fn plus(self, b: Self) -> Self;
    unsafe fn minus(self, b: Self) -> Self;
    unsafe fn max(self, b: Self) -> Self;
    /// e^x per lane, within 1 ulp (see [`super::simd`]).
    unsafe fn exp(self) -> Self;
    /// e^x per lane for x ≤ 0 (a softmax's score minus its row's max), through 2^(x·log₂e):
    /// fewer operations than [`Vector::exp`], within 1 ulp plus |x|·2⁻²⁴ relative (see
    /// [`super::simd`]); exactly 0 below −87.3.
    unsafe fn exp_nonpositive(self) -> Self;
    /// Sum of the lanes.
    unsafe fn sum(self) -> f32;
    /// Largest lane.
    unsafe fn max_lane(self) -> f32;
    unsafe fn div(self, b: Self) -> Self;
    unsafe fn min(self, b: Self) -> Self;
    /// |self| per lane (the sign bit cleared).
    unsafe fn abs(self) -> Self;
    /// self with x's sign bits or-ed in: a non-negative self takes x's sign.
    unsafe fn or_sign_of(self, x: Self) -> Self;
    /// Per lane: `then` where self < limit (ordered: a NaN lane takes `otherwise`).
    unsafe fn select_below(self, limit: Self, then: Self, otherwise: Self) -> Self;
    /// Per lane: x where x is NaN, else self.
    unsafe fn nan_from(self, x: Self) -> Self;
    /// Each lane's bits read as two bf16 numbers, low half first: the low one as f32.
    unsafe fn bf16_low(self) -> Self;
    /// The high one as f32.
    unsafe fn bf16_high(self) -> Self;
    /// `LANES` bf16 numbers from memory as f32 (each bit pattern shifted up 16: exact);
    /// `p` valid for `LANES` of them.
    unsafe fn load_bf16(p: *const u16) -> Self;
}

/// Lane-wise binary operations, each one intrinsic: `name: intrinsic`.
#[cfg(target_arch = "x86_64")]
macro_rules! lane_wise {
    ($($name:ident: $intrinsic:ident),*) => {
        $(
            #[inline(always)]
            unsafe fn $name(self, b: Self) -> Self {
                $intrinsic(self, b)
            }
        )*
    };
}

/// The [`Vector`] methods that are one intrinsic each, given in the trait's order for
/// one vector type: zero, splat, load, store, mul_add, times, plus, minus, max, sum,
/// max_lane.
#[cfg(target_arch = "x86_64")]
macro_rules! one_intrinsic_each {
    ($zero:ident, $splat:ident, $load:ident, $store:ident, $fma:ident, $mul:ident, $add:ident, $sub:ident, $max:ident, $sum:ident, $max_lane:ident) => {
        #[inline(always)]
        unsafe fn zero() -> Self {
            $zero()
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            $splat(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            $load(p)
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            $store(p, self)
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            $fma(self, b, c)
        }
        lane_wise! { times: $mul, plus: $add, minus: $sub, max: $max }
        #[inline(always)]
        unsafe fn sum(self) -> f32 {
            $sum(self)
        }
        #[inline(always)]
        unsafe fn max_lane(self) -> f32 {
            $max_lane(self)
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Vector;
    use crate::ops::simd::x86::{exp8, exp_nonpositive8, hmax, hsum, EXP2_POLY};
    use std::arch::x86_64::*;

    /// The bits of a lane's high bf16 half.
    const BF16_HIGH: i32 = 0xffff_0000_u32 as i32;

    impl Vector for __m256 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn bf16_low(self) -> Self {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_castps_si256(self)))
        }
        #[inline(always)]
        unsafe fn bf16_high(self) -> Self {
            _mm256_and_ps(self, _mm256_castsi256_ps(_mm256_set1_epi32(BF16_HIGH)))
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self {
            let words = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(words))
        }
        one_intrinsic_each! { _mm256_setzero_ps, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmadd_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_sub_ps, _mm256_max_ps, hsum, hmax }
        lane_wise! { div: _mm256_div_ps, min: _mm256_min_ps }
        #[inline(always)]
        unsafe fn abs(self) -> Self {
            _mm256_andnot_ps(_mm256_set1_ps(-0.0), self)
        }
        #[inline(always)]
        unsafe fn or_sign_of(self, x: Self) -> Self {
            _mm256_or_ps(self, _mm256_and_ps(_mm256_set1_ps(-0.0), x))
        }
        #[inline(always)]
        unsafe fn select_below(self, limit: Self, then: Self, otherwise: Self) -> Self {
            _mm256_blendv_ps(otherwise, then, _mm256_cmp_ps::<_CMP_LT_OQ>(self, limit))
        }
        #[inline(always)]
        unsafe fn nan_from(self, x: Self) -> Self {
            _mm256_blendv_ps(self, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
        }
        #[inline(always)]
        unsafe fn splat_from(p: *const f32) -> Self {
            _mm256_broadcast_ss(&*p)
        }
        #[inline(always)]
        unsafe fn exp(self) -> Self {
            exp8(self)
        }
        #[inline(always)]
        unsafe fn exp_nonpositive(self) -> Self {
            exp_nonpositive8(self)
        }
    }

    impl Vector for __m512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn bf16_low(self) -> Self {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_castps_si512(self)))
        }
        #[inline(always)]
        unsafe fn bf16_high(self) -> Self {
            let bits = _mm512_and_si512(_mm512_castps_si512(self), _mm512_set1_epi32(BF16_HIGH));
            _mm512_castsi512_ps(bits)
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self {
            let words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(words))
        }
        one_intrinsic_each! { _mm512_setzero_ps, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_fmadd_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps, _mm512_max_ps, _mm512_reduce_add_ps, _mm512_reduce_max_ps }
        lane_wise! { div: _mm512_div_ps, min: _mm512_min_ps }
        #[inline(always)]
        unsafe fn abs(self) -> Self {
            _mm512_abs_ps(self)
        }
        #[inline(always)]
        unsafe fn or_sign_of(self, x: Self) -> Self {
            // integer forms: the f32 `or` and `and` need AVX-512 DQ
            let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(self), sign))
        }
        #[inline(always)]
        unsafe fn select_below(self, limit: Self, then: Self, otherwise: Self) -> Self {
            _mm512_mask_blend_ps(
                _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self, limit),
                otherwise,
                then,
            )
        }
        #[inline(always)]
        unsafe fn nan_from(self, x: Self) -> Self {
            _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), self, x)
        }
        #[inline(always)]
        unsafe fn splat_from(p: *const f32) -> Self {
            _mm512_set1_ps(*p)
        }
        /// The same steps as [`exp8`], on 16 lanes, with the same polynomial and the
        /// same rounding of each step; only the last, e^r·2ⁿ, is one `vscalefps` (zeroing
        /// the lanes below −87.3 as it goes) in place of building 2ⁿ's bits, five
        /// operations fewer. The product is exact in both (the results are normal
        /// floats over [−87.3, 88]), so both widths give identical values.
        #[inline(always)]
        unsafe fn exp(self) -> Self {
            let x = self;
            let xc = _mm512_min_ps(
                _mm512_max_ps(x, _mm512_set1_ps(-87.3)),
                _mm512_set1_ps(88.0),
            );
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), xc);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm512_set1_ps(1.987_569_1e-4);
            for c in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                1.666_666_5e-1,
                0.5,
            ] {
                p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
            }
            let e_r = _mm512_add_ps(
                _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
                _mm512_set1_ps(1.0),
            );
            // below −87.3 (and −∞; NaN compares false and keeps its computed lane) → 0
            let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-87.3));
            _mm512_maskz_scalef_ps(kept, e_r, n)
        }
        /// [`exp_nonpositive8`]'s steps on 16 lanes, 2ⁿ applied by `vscalefps` (exact on
        /// the normal results both keep), so both widths give identical values.
        #[inline(always)]
        unsafe fn exp_nonpositive(self) -> Self {
            let t = _mm512_max_ps(
                _mm512_set1_ps(-126.0),
                _mm512_mul_ps(self, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            );
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let f = _mm512_sub_ps(t, n);
            let mut p = _mm512_set1_ps(EXP2_POLY[6]);
            for c in EXP2_POLY[..6].iter().rev() {
                p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(*c));
            }
            let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(self, _mm512_set1_ps(-87.3));
            _mm512_maskz_scalef_ps(kept, p, n)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::{Isa, Vector};
        use std::arch::x86_64::*;

        /// One of the trait's exps at both widths.
        type Pair = (unsafe fn(__m512) -> __m512, unsafe fn(__m256) -> __m256);

        /// `f` on 16 lanes, and on two halves of 8.
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn both_widths(x: &[f32; 16], f: Pair) -> ([f32; 16], [f32; 16]) {
            let (mut wide, mut halves) = ([0.0; 16], [0.0; 16]);
            f.0(__m512::load(x.as_ptr())).store(wide.as_mut_ptr());
            for h in 0..2 {
                f.1(__m256::load(x.as_ptr().add(8 * h))).store(halves.as_mut_ptr().add(8 * h));
            }
            (wide, halves)
        }

        /// The 16-lane exps give bit for bit the 8-lane ones (which the tests in
        /// `simd` hold to e^x) over every 97th f32 of [−100, 100], and the edges −∞,
        /// NaN and ±0.
        #[test]
        fn exp16_equals_exp8_bit_for_bit() {
            if Isa::detect() != Isa::Avx512 {
                eprintln!("no AVX-512 on this CPU: the 16-lane exp is not used here");
                return;
            }
            let mut xs: Vec<f32> = (0u32..u32::MAX)
                .step_by(97)
                .map(f32::from_bits)
                .filter(|x| x.abs() <= 100.0)
                .collect();
            xs.extend([f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, -87.3, 88.0]);
            xs.resize(xs.len().next_multiple_of(16), 1.0);
            let exps: [(&str, Pair, f32); 2] = [
                (
                    "exp",
                    (<__m512 as Vector>::exp, <__m256 as Vector>::exp),
                    100.0,
                ),
                // defined for x ≤ 0 only
                (
                    "exp_nonpositive",
                    (
                        <__m512 as Vector>::exp_nonpositive,
                        <__m256 as Vector>::exp_nonpositive,
                    ),
                    0.0,
                ),
            ];
            for (name, f, top) in exps {
                for chunk in xs.chunks_exact(16) {
                    let wide: [f32; 16] = chunk.try_into().expect("16 lanes");
                    let wide = wide.map(|x| if x > top { top } else { x });
                    // SAFETY: AVX-512 detected above (and with it AVX2 and FMA).
                    let (got, want) = unsafe { both_widths(&wide, f) };
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                            "{name}({:e}): {g:e} against {w:e}",
                            wide[i]
                        );
                    }
                }
            }
        }
    }
}
