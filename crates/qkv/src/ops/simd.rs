//! Explicit SIMD for the hot loops, chosen at run time: AVX2 with FMA on x86-64 where
//! the CPU has both, otherwise the portable code beside each use. Only what several
//! kernels share lives here: the feature test and a vectorised `exp` (`erf` on any
//! vector width is in [`super::vmath`]).
//!
//! `exp8` evaluates e^x on 8 lanes the way [`super::fastmath::exp`] does on one, with
//! fused multiply-adds: x = n·ln 2 + r (|r| ≤ ln2/2, ln 2 in two parts so n·ln 2 is
//! exact), e^r by a degree-6 polynomial, 2ⁿ written into the exponent bits. Within
//! 1 ulp of the correctly rounded e^x over the whole normal range (the tests walk the
//! f32 range); e^x is exactly 0 below −87.3 (e^−∞ too, so a masked score gets exactly
//! zero weight) and saturates at e^88 above 88.
//!
//! `exp_nonpositive8` is the softmax's e^x, for x = score − the row's max ≤ 0: as
//! 2^t with t = x·log₂e (FlashAttention's exp2), t = n + f with f = t − n exact, 2^f by a
//! degree-6 polynomial on [−½, ½] (fitted here; within 1 ulp for an exact t), 2ⁿ added to
//! the exponent bits. No upper clamp and no two-part ln 2: 13 operations where `exp8`
//! takes 18. t's rounding (and f32 log₂e's) costs up to |x|·7.3·10⁻⁸ of relative error,
//! which grows only as the weight shrinks (at x = −10, 7·10⁻⁷ of a weight 4.5·10⁻⁵ of
//! the row's largest); exactly 0 below −87.3.

/// Whether this CPU runs the AVX2 + FMA paths (every AVX-512 CPU does), unless
/// `QKV_ISA=portable` asks for the plain loops (see [`super::isa::Isa`]).
#[inline]
pub fn avx2_fma() -> bool {
    super::isa::Isa::detect() != super::isa::Isa::Portable
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    /// e^x on 8 lanes (see the module docs).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        let log2e = _mm256_set1_ps(std::f32::consts::LOG2_E);
        let ln2_hi = _mm256_set1_ps(0.693_359_4);
        let ln2_lo = _mm256_set1_ps(-2.121_944_4e-4);
        let xc = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
            _mm256_set1_ps(88.0),
        );
        let n = _mm256_round_ps(
            _mm256_mul_ps(xc, log2e),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm256_fnmadd_ps(n, ln2_hi, xc);
        let r = _mm256_fnmadd_ps(n, ln2_lo, r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        let e_r = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        let e = _mm256_mul_ps(e_r, two_n);
        // below −87.3 (and −∞, and NaN's comparison false → kept as computed) → 0
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
        _mm256_andnot_ps(under, e)
    }

    /// 2^f for f in [−½, ½], degree 6 (coefficients of 1, f, …, f⁶; a least-squares
    /// fit on Chebyshev nodes reweighted to minimax, whose f's coefficient came out as ln 2
    /// in f32: 1.9·10⁻⁹ relative in f64).
    pub(crate) const EXP2_POLY: [f32; 7] = [
        1.0,
        std::f32::consts::LN_2,
        0.240_226_46,
        0.055_503_286,
        0.009_618_489,
        0.001_339_993_1,
        0.000_153_458_1,
    ];

    /// e^x on 8 lanes for x ≤ 0 (see the module docs); NaN stays NaN.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_nonpositive8(x: __m256) -> __m256 {
        // max(−126, t) rather than max(t, −126): a NaN t is the operand kept
        let t = _mm256_max_ps(
            _mm256_set1_ps(-126.0),
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        let f = _mm256_sub_ps(t, n);
        let mut p = _mm256_set1_ps(EXP2_POLY[6]);
        for c in EXP2_POLY[..6].iter().rev() {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(*c));
        }
        // p ∈ [0.7, 1.5) and n ≥ −126: adding n to p's exponent is exact, and the
        // lanes where the sum would leave the normal range are zeroed below
        let bits = _mm256_add_epi32(
            _mm256_castps_si256(p),
            _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n)),
        );
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
        _mm256_andnot_ps(under, _mm256_castsi256_ps(bits))
    }

    /// Folds 8 lanes to one: the two halves with `$wide` (4 lanes), then pairs, then the
    /// last two with `$last` (the lowest lane).
    macro_rules! fold8 {
        ($v:expr, $wide:ident, $last:ident) => {{
            let s = $wide(_mm256_castps256_ps128($v), _mm256_extractf128_ps::<1>($v));
            let s = $wide(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32($last(s, _mm_shuffle_ps::<1>(s, s)))
        }};
    }

    /// Horizontal sum of 8 lanes; the CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        fold8!(v, _mm_add_ps, _mm_add_ss)
    }

    /// Horizontal maximum of 8 lanes; the CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn hmax(v: __m256) -> f32 {
        fold8!(v, _mm_max_ps, _mm_max_ss)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::x86::*;
    use super::*;
    use std::arch::x86_64::*;

    fn exp_lanes(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        // SAFETY: only called after `avx2_fma()` said yes.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp8(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }

    /// Distance in units in the last place between `got` and the correctly rounded
    /// value of `want`.
    fn ulps(got: f32, want: f64) -> u32 {
        let rounded = want as f32;
        (got.to_bits() as i64 - rounded.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp8_is_within_1_ulp_over_the_whole_range() {
        if !avx2_fma() {
            eprintln!("no AVX2 + FMA on this CPU: the vector exp is not used here");
            return;
        }
        // Every 97th f32 bit pattern from −87.3 to 88.
        let (lo, hi) = (-87.3f32, 88.0f32);
        let mut worst = (0u32, 0f32);
        let mut batch = [0f32; 8];
        let mut n = 0;
        let check = |batch: &[f32; 8], worst: &mut (u32, f32)| {
            for (x, e) in batch.iter().zip(exp_lanes(*batch)) {
                let u = ulps(e, (*x as f64).exp());
                if u > worst.0 {
                    *worst = (u, *x);
                }
            }
        };
        for bits in (0u32..u32::MAX).step_by(97) {
            let x = f32::from_bits(bits);
            if !(x >= lo && x <= hi) {
                continue;
            }
            batch[n] = x;
            n += 1;
            if n == 8 {
                check(&batch, &mut worst);
                n = 0;
            }
        }
        eprintln!("exp8: worst {} ulp at x = {:e}", worst.0, worst.1);
        assert!(worst.0 <= 1, "worst {} ulp at x = {:e}", worst.0, worst.1);
        let edges = exp_lanes([
            f32::NEG_INFINITY,
            -100.0,
            -87.31,
            0.0,
            1.0,
            88.0,
            100.0,
            -0.0,
        ]);
        assert_eq!(&edges[..4], &[0.0, 0.0, 0.0, 1.0]);
        assert_eq!(ulps(edges[4], std::f64::consts::E), 0);
        assert!(edges[5].is_finite() && edges[6] == edges[5] && edges[7] == 1.0);
    }

    /// Within 2 ulp of e^x (the polynomial, and the rounding of the result) plus what t =
    /// x·log₂e carries in (its rounding, 2⁻²⁴ of |t|, and f32 log₂e's, 1.3·10⁻⁸ of it:
    /// |x|·7.3·10⁻⁸ relative, at most 1.25·|x| ulp) over every 97th f32 of [−87.3, 0];
    /// 0 below, NaN kept.
    #[test]
    fn exp_nonpositive8_is_exp_within_the_rounding_of_its_exponent() {
        if !avx2_fma() {
            eprintln!("no AVX2 + FMA on this CPU: the vector exp is not used here");
            return;
        }
        let lanes = |x: [f32; 8]| {
            let mut out = [0.0f32; 8];
            // SAFETY: AVX2 and FMA checked above.
            unsafe {
                _mm256_storeu_ps(
                    out.as_mut_ptr(),
                    exp_nonpositive8(_mm256_loadu_ps(x.as_ptr())),
                )
            };
            out
        };
        let xs: Vec<f32> = (0u32..u32::MAX)
            .step_by(97)
            .map(f32::from_bits)
            .filter(|x| (-87.3..=0.0).contains(x))
            .collect();
        let mut worst = 0.0f64;
        for chunk in xs.chunks_exact(8) {
            let got = lanes(chunk.try_into().expect("8 lanes"));
            for (&x, &e) in chunk.iter().zip(&got) {
                let want = (x as f64).exp();
                let allowed = 2.0 + 1.25 * x.abs() as f64;
                let u = ulps(e, want) as f64;
                assert!(u <= allowed, "e^{x:e}: {e:e} is {u} ulp from {want:e}");
                worst = worst.max(u / allowed);
            }
        }
        eprintln!("exp_nonpositive8: worst {worst:.2} of the allowance");
        let edges = lanes([
            f32::NEG_INFINITY,
            -100.0,
            -87.31,
            0.0,
            -0.0,
            f32::NAN,
            -1.0,
            -1e-30,
        ]);
        assert_eq!(&edges[..5], &[0.0, 0.0, 0.0, 1.0, 1.0]);
        assert!(edges[5].is_nan());
        assert!(ulps(edges[6], (-1.0f64).exp()) <= 1 && edges[7] == 1.0);
    }

    #[test]
    fn horizontal_sum_and_max() {
        if !avx2_fma() {
            return;
        }
        let x = [1.0f32, -2.0, 3.5, 0.25, 8.0, -9.0, 4.0, 0.5];
        // SAFETY: AVX2 checked above.
        let (s, m) = unsafe {
            let v = _mm256_loadu_ps(x.as_ptr());
            (hsum(v), hmax(v))
        };
        assert_eq!(s, x.iter().sum::<f32>());
        assert_eq!(m, 8.0);
    }
}
