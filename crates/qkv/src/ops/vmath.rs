//! erf, tanh and σ on a vector of any width ([`Vector`]): one body that the AVX2 (8
//! lanes) and AVX-512 (16 lanes) forms of the activations both instantiate. Every step
//! rounds alike on both widths (and [`Vector::exp`] is bit for bit the same on both),
//! so a value does not depend on which width ran; the tests hold the two equal.
//!
//! Every function is `#[inline(always)]`: it must land inside the `#[target_feature]`
//! entry point that calls it (see [`super::vector`]).
#![allow(clippy::missing_safety_doc)]

use super::vector::Vector;

/// erf x per lane, within 2 ulp of the correctly rounded value over the whole f32 range
/// (the tests walk it). The coefficients are least-squares fits made for qkv (f64,
/// Chebyshev nodes), checked in f32 with fused multiply-adds:
/// - |x| < 0.65: erf x = c₀·x + x·u·A(u), u = x², A of degree 5 (the Taylor series'
///   shape, c₀ = 2/√π kept apart so its rounding is applied once);
/// - 0.65 ≤ |x| < 4: erf x = 1 − e^(B(|x|) − x²), B of degree 9 fitting ln erfc x + x²,
///   which is smooth and small;
/// - |x| ≥ 4: ±1 (erfc 4 ≈ 1.5e-8 is below half an ulp of 1).
///
/// NaN stays NaN; the sign is copied from x, so erf(−0) = −0.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
pub unsafe fn erf<V: Vector>(x: V) -> V {
    const C0: f32 = std::f32::consts::FRAC_2_SQRT_PI;
    const A: [f32; 6] = [
        -0.376_126_38,
        0.112_837_89,
        -0.026_865_756,
        0.005_221_002_3,
        -0.000_843_991_3,
        0.000_100_833_095,
    ];
    const B: [f32; 10] = [
        0.000_182_465_87,
        -1.129_595,
        0.366_908_16,
        -0.108_670_115,
        0.025_446_873,
        -0.004_325_574_3,
        0.000_471_853_07,
        -2.358_770_7e-5,
        -6.584_465_4e-7,
        1.017_258_4e-7,
    ];
    let one = V::splat(1.0);
    let a = x.abs();
    let u = a.times(a);
    let mut q = V::splat(A[5]);
    for &c in A[..5].iter().rev() {
        q = q.mul_add(u, V::splat(c));
    }
    let small = a.mul_add(V::splat(C0), a.times(u.times(q)));
    // the large branch on |x| clamped to 4, so every lane's e^ argument is tame
    let ac = a.min(V::splat(4.0));
    let mut g = V::splat(B[9]);
    for &c in B[..9].iter().rev() {
        g = g.mul_add(ac, V::splat(c));
    }
    // −ac·ac + g in one rounding (ac ≥ 0, so −ac is ac with the sign bit set)
    let erfc = ac.or_sign_of(V::splat(-0.0)).mul_add(ac, g).exp();
    let large = one.minus(erfc);
    let r = a.select_below(V::splat(4.0), large, one);
    let r = a.select_below(V::splat(0.65), small, r);
    r.or_sign_of(x).nan_from(x)
}

/// tanh x per lane as `fastmath::tanh` computes it: 1 − 2 / (e^{2x} + 1).
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
pub unsafe fn tanh<V: Vector>(x: V) -> V {
    let one = V::splat(1.0);
    let e = x.plus(x).exp();
    one.minus(V::splat(2.0).div(e.plus(one)))
}

/// σ(x) = 1 / (1 + e^−x) per lane.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
pub unsafe fn sigmoid<V: Vector>(x: V) -> V {
    let one = V::splat(1.0);
    one.div(one.plus(V::zero().minus(x).exp()))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::ops::isa::Isa;
    use std::arch::x86_64::*;

    /// erf, tanh and σ of 16 values on 8 lanes (twice) and on 16.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn on_8(x: &[f32; 16]) -> [[f32; 16]; 3] {
        let mut out = [[0.0; 16]; 3];
        for h in [0, 8] {
            let v = __m256::load(x.as_ptr().add(h));
            erf(v).store(out[0].as_mut_ptr().add(h));
            tanh(v).store(out[1].as_mut_ptr().add(h));
            sigmoid(v).store(out[2].as_mut_ptr().add(h));
        }
        out
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn on_16(x: &[f32; 16]) -> [[f32; 16]; 3] {
        let mut out = [[0.0; 16]; 3];
        let v = __m512::load(x.as_ptr());
        erf(v).store(out[0].as_mut_ptr());
        tanh(v).store(out[1].as_mut_ptr());
        sigmoid(v).store(out[2].as_mut_ptr());
        out
    }

    fn erf_lanes(x: [f32; 8]) -> [f32; 8] {
        let mut wide = [0.0; 16];
        wide[..8].copy_from_slice(&x);
        // SAFETY: only called after Isa::detect() said AVX2 + FMA or wider.
        let out = unsafe { on_8(&wide) };
        out[0][..8].try_into().expect("8 lanes")
    }

    /// Distance in units in the last place between `got` and the correctly rounded
    /// value of `want`.
    fn ulps(got: f32, want: f64) -> u32 {
        let rounded = want as f32;
        (got.to_bits() as i64 - rounded.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn erf_is_within_2_ulp_over_the_whole_range() {
        if Isa::detect() == Isa::Portable {
            eprintln!("no AVX2 + FMA on this CPU: the vector erf is not used here");
            return;
        }
        // Every 61st f32 bit pattern, both signs, every magnitude (tiny, normal, huge, ∞).
        let mut worst = (0u32, 0f32);
        let xs: Vec<f32> = (0u32..u32::MAX)
            .step_by(61)
            .map(f32::from_bits)
            .filter(|x| !x.is_nan())
            .collect();
        for batch in xs.chunks_exact(8) {
            let batch: [f32; 8] = batch.try_into().expect("8 lanes");
            for (x, e) in batch.iter().zip(erf_lanes(batch)) {
                let u = ulps(e, libm::erf(*x as f64));
                if u > worst.0 {
                    worst = (u, *x);
                }
            }
        }
        assert!(
            worst.0 <= 2,
            "erf is {} ulp off at x = {:e}",
            worst.0,
            worst.1
        );
        let special = erf_lanes([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            4.0,
            -3.99,
            1e-30,
        ]);
        assert_eq!(special[0].to_bits(), 0.0f32.to_bits());
        assert_eq!(special[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!((special[2], special[3]), (1.0, -1.0));
        assert!(special[4].is_nan());
        assert_eq!(special[5], 1.0);
        assert_eq!(special[6], libm::erf(-3.99f64) as f32);
        assert_eq!(special[7], 1e-30 * std::f32::consts::FRAC_2_SQRT_PI);
    }

    /// The 16-lane forms give the 8-lane ones' bits over every 89th f32 of
    /// [−20, 20] and the edges ±0, ±∞, NaN, −87.3 and 88.
    #[test]
    fn sixteen_lanes_equal_eight_bit_for_bit() {
        if Isa::detect() != Isa::Avx512 {
            eprintln!("no AVX-512 on this CPU: the 16-lane forms are not used here");
            return;
        }
        let edges = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -87.3,
            88.0,
        ];
        let xs: Vec<f32> = (0u32..u32::MAX)
            .step_by(89)
            .map(f32::from_bits)
            .filter(|x| x.abs() <= 20.0)
            .chain(edges)
            .collect();
        for chunk in xs.chunks(16) {
            let mut x = [0.5f32; 16];
            x[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the CPU has AVX-512 (and so AVX2 and FMA).
            let (eight, sixteen) = unsafe { (on_8(&x), on_16(&x)) };
            // any NaN is NaN: the payload may differ between the widths' last steps
            let bits = |v: &[[f32; 16]; 3]| {
                v.map(|f| f.map(|y| if y.is_nan() { u32::MAX } else { y.to_bits() }))
            };
            assert_eq!(bits(&eight), bits(&sixteen), "{x:?}");
        }
    }
}
