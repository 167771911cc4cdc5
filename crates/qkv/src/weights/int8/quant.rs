//! Symmetric 8-bit codes for a group of numbers, the way llama.cpp's Q8_0 makes them:
//! d = max|x| / 127, q = round(x · (1/d)) (halves away from zero, as C's `roundf`),
//! so x ≈ q·d with q in −127..=127. An all-zero group has d = 0 and codes 0. A NaN
//! anywhere makes d NaN, so that the product it enters is NaN, as it would be in f32.
//!
//! Q8_0 stores a block's scale as f16 ([`block_scale`]): the codes are made with the
//! f32 scale's inverse and the product multiplies by the f16 one, for the weights and
//! for the activations llama.cpp quantizes on the fly alike, so that a product of
//! blocks is llama.cpp's.

use crate::ops::isa::Isa;

/// K steps of a block: one scale per 32 weights of a row, as GGUF's Q8_0.
pub const BLOCK: usize = super::q8_0::WEIGHTS;

/// A block's scale as Q8_0 stores it: d rounded to the nearest f16, or d itself
/// where f16 cannot hold it (|d| > 65504: values past 8·10⁶, which Q8_0 would make
/// infinite).
pub fn block_scale(d: f32) -> f32 {
    let rounded = half::f16::from_f32(d).to_f32();
    if rounded.is_finite() || !d.is_finite() {
        rounded
    } else {
        d
    }
}

/// Writes the codes of `x` into `q` (as long) and returns the scale d.
pub fn quantize(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len());
    quantize_body(x, q)
}

/// [`quantize`] for each group of `group` steps of a row (the last one may be
/// shorter): codes into `q` (as long as x), scales and the codes' sums into `scales`
/// and `sums` (one a group). What the products run on their activations, in vector code.
pub fn quantize_groups(
    x: &[f32],
    group: usize,
    q: &mut [i8],
    scales: &mut [f32],
    sums: &mut [i32],
) {
    let groups = x.len().div_ceil(group);
    assert!(group > 0 && q.len() == x.len() && scales.len() == groups && sums.len() == groups);
    match Isa::detect() {
        // SAFETY: the CPU has the instructions the entry points are compiled for.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { groups_avx512(x, group, q, scales, sums) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { groups_avx2(x, group, q, scales, sums) },
        _ => groups_body(x, group, q, scales, sums),
    }
}

/// [`quantize_groups`] compiled for AVX-512, where the compiler makes its loops 16
/// lanes wide.
///
/// # Safety
/// AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn groups_avx512(
    x: &[f32],
    group: usize,
    q: &mut [i8],
    scales: &mut [f32],
    sums: &mut [i32],
) {
    groups_body(x, group, q, scales, sums)
}

/// [`quantize_groups`] compiled for AVX2: 8 lanes.
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn groups_avx2(x: &[f32], group: usize, q: &mut [i8], scales: &mut [f32], sums: &mut [i32]) {
    groups_body(x, group, q, scales, sums)
}

/// The groups one by one; whole blocks of 32 through fixed-length arrays, which the
/// compiler unrolls into a few vector instructions.
#[inline(always)]
fn groups_body(x: &[f32], group: usize, q: &mut [i8], scales: &mut [f32], sums: &mut [i32]) {
    let parts = x.chunks(group).zip(q.chunks_mut(group));
    for ((xs, qs), (d, sum)) in parts.zip(scales.iter_mut().zip(sums.iter_mut())) {
        let block = (
            <&[f32; BLOCK]>::try_from(xs),
            <&mut [i8; BLOCK]>::try_from(&mut *qs),
        );
        *d = match block {
            // a length the compiler knows
            (Ok(xb), Ok(qb)) => quantize_body(xb, qb),
            _ => quantize_body(xs, qs),
        };
        *sum = qs.iter().map(|&c| i32::from(c)).sum();
    }
}

/// The one body, in loops the compiler turns into vector code.
#[inline(always)]
fn quantize_body(x: &[f32], q: &mut [i8]) -> f32 {
    // |v|'s bits order as |v| does, and every NaN's lie above infinity's: one integer
    // maximum finds both the largest magnitude and any NaN
    let top = x
        .iter()
        .fold(0u32, |m, &v| m.max(v.to_bits() & 0x7fff_ffff));
    let d = f32::from_bits(top) / 127.0;
    if !d.is_finite() {
        // a NaN or an infinity: the product is NaN whatever the codes
        q.fill(0);
        return d;
    }
    let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (c, &v) in q.iter_mut().zip(x) {
        // SAFETY: v and the inverse are finite and |v · inverse| ≤ 127 up to rounding
        *c = unsafe { round_away(v * inverse) } as i8;
    }
    d
}

/// `v` rounded to the nearest integer, halves away from zero (C's `roundf`). The
/// truncation and `v − t` are exact, so the tie test is too.
///
/// # Safety
/// v is finite and |v| < 2³¹ (the truncation is the plain instruction, which the
/// compiler vectorizes, not Rust's saturating `as`).
#[inline(always)]
unsafe fn round_away(v: f32) -> i32 {
    let t = v.to_int_unchecked::<i32>();
    let frac = v - t as f32;
    t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_span_the_range_and_round_halves_away_from_zero() {
        // d = 1 exactly, so the halves are exact ties
        let x = [127.0, -127.0, 0.5, -0.5, 1.5, 0.0];
        let mut q = [0i8; 6];
        assert_eq!(quantize(&x, &mut q), 1.0);
        assert_eq!(q, [127, -127, 1, -1, 2, 0]);
        let mut z = [5i8; 3];
        assert_eq!(quantize(&[0.0; 3], &mut z), 0.0);
        assert_eq!(z, [0; 3]);
        assert!(quantize(&[1.0, f32::NAN, 2.0], &mut z).is_nan());
        assert!(quantize_body(&[1.0, -f32::NAN, 2.0], &mut z).is_nan());
        assert!(quantize(&[1.0, f32::INFINITY, 2.0], &mut z).is_infinite());
    }

    /// A row's groups, whole blocks and a shorter last one, are what [`quantize`] gives
    /// each, in every form the CPU has.
    #[test]
    fn groups_are_quantized_one_by_one() {
        let x: Vec<f32> = (0..75)
            .map(|i| (i as f32 * 0.91).sin() * (1 + i % 7) as f32)
            .collect();
        for group in [BLOCK, 75, 8] {
            let groups = x.len().div_ceil(group);
            let mut q = vec![0i8; 75];
            let (mut scales, mut sums) = (vec![0.0; groups], vec![0; groups]);
            quantize_groups(&x, group, &mut q, &mut scales, &mut sums);
            let (mut q2, mut scales2, mut sums2) = (q.clone(), scales.clone(), sums.clone());
            groups_body(&x, group, &mut q2, &mut scales2, &mut sums2);
            assert_eq!(
                (&q, &scales, &sums),
                (&q2, &scales2, &sums2),
                "group {group}"
            );
            for (g, xs) in x.chunks(group).enumerate() {
                let mut want = vec![0i8; xs.len()];
                assert_eq!(quantize(xs, &mut want), scales[g]);
                assert_eq!(&q[g * group..][..xs.len()], &want[..]);
                assert_eq!(sums[g], want.iter().map(|&c| i32::from(c)).sum::<i32>());
            }
        }
        assert_eq!(block_scale(0.1), half::f16::from_f32(0.1).to_f32());
        assert_ne!(block_scale(0.1), 0.1);
        assert_eq!(block_scale(1e6), 1e6);
        assert!(block_scale(f32::NAN).is_nan());
        for v in [0.49999997f32, 0.5, -0.5, 1.5, -2.5, 126.5, -0.0, 3.7, -3.7] {
            // SAFETY: finite and small
            assert_eq!(unsafe { round_away(v) } as f32, v.round(), "{v}");
        }
    }
}
