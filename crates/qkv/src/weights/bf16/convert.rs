//! f32 ↔ bf16. A bf16 is an f32's top 16 bits, so widening is a shift; narrowing
//! rounds the dropped 16 bits to nearest, ties to even, as PyTorch does (its
//! `round_to_nearest_even`), and keeps a NaN a (quiet) NaN.

use crate::ops::isa::Isa;

/// The bf16 nearest to `x` (ties to the even one); NaN stays NaN. Both results are
/// computed and one chosen, without a branch, so that loops over it vectorize.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    // the sign and a quiet-NaN payload, as PyTorch writes it
    let nan = ((bits >> 16) as u16) | 0x0040;
    let rounding = 0x7fff + ((bits >> 16) & 1);
    let rounded = (bits.wrapping_add(rounding) >> 16) as u16;
    if x.is_nan() {
        nan
    } else {
        rounded
    }
}

/// The f32 that `b` is the top half of.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x` rounded to the nearest bf16 and widened back: what a bf16 copy of it holds.
pub fn round_to_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

/// Two bf16 in one 32-bit word, `low` in the low half: the pair layout of
/// [`super::Bf16Weight`] and of `vdpbf16ps`'s operands.
#[inline(always)]
pub(crate) fn pair(low: f32, high: f32) -> u32 {
    u32::from(f32_to_bf16(low)) | (u32::from(f32_to_bf16(high)) << 16)
}

/// `src` rounded to bf16 in pairs into `dst` (`⌈src.len()/2⌉` words; an odd length's
/// last word has a zero high half), exactly as [`f32_to_bf16`] rounds: the operand
/// rows of every bf16 product, one rounding for all of its forms. Compiled per ISA so
/// that it runs a vector wide. (AVX512-BF16's `vcvtne2ps2bf16` rounds 32 values an
/// instruction but, measured, flushes subnormals to zero and drops NaN payloads.)
pub fn round_pairs(src: &[f32], dst: &mut [u32]) {
    assert_eq!(dst.len(), src.len().div_ceil(2));
    match Isa::detect() {
        // SAFETY: the CPU has the instructions the entry points are compiled for.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { pairs_avx512(src, dst) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { pairs_avx2(src, dst) },
        _ => pairs_body(src, dst),
    }
}

/// [`round_pairs`] compiled for AVX-512.
///
/// # Safety
/// AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn pairs_avx512(src: &[f32], dst: &mut [u32]) {
    pairs_body(src, dst)
}

/// [`round_pairs`] compiled for AVX2.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pairs_avx2(src: &[f32], dst: &mut [u32]) {
    pairs_body(src, dst)
}

#[inline(always)]
fn pairs_body(src: &[f32], dst: &mut [u32]) {
    let two = src.chunks_exact(2);
    if let [last] = two.remainder() {
        dst[src.len() / 2] = pair(*last, 0.0);
    }
    for (word, two) in dst.iter_mut().zip(two) {
        *word = pair(two[0], two[1]);
    }
}

/// Widens rows of bf16 into f32: row r of `dst` (`dst.len() / dim` rows of `dim`) is
/// `src[r·stride..][..dim]`. A bf16 KV cache widened for a call that is not a decode
/// step (a prompt's chunk over the cache, weights asked for): compiled per ISA so that
/// the shifts run 16 or 8 lanes wide (the plain loop runs at a few elements a cycle).
pub fn widen_rows(src: &[u16], stride: usize, dim: usize, dst: &mut [f32]) {
    assert!(dim > 0 && dst.len().is_multiple_of(dim));
    let rows = dst.len() / dim;
    assert!(rows == 0 || (rows - 1) * stride + dim <= src.len());
    match Isa::detect() {
        // SAFETY: the CPU has the instructions the entry points are compiled for.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { widen_avx512(src, stride, dim, dst) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { widen_avx2(src, stride, dim, dst) },
        _ => widen_body(src, stride, dim, dst),
    }
}

/// [`widen_rows`] compiled for AVX-512.
///
/// # Safety
/// AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn widen_avx512(src: &[u16], stride: usize, dim: usize, dst: &mut [f32]) {
    widen_body(src, stride, dim, dst)
}

/// [`widen_rows`] compiled for AVX2.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_avx2(src: &[u16], stride: usize, dim: usize, dst: &mut [f32]) {
    widen_body(src, stride, dim, dst)
}

#[inline(always)]
fn widen_body(src: &[u16], stride: usize, dim: usize, dst: &mut [f32]) {
    for (r, row) in dst.chunks_exact_mut(dim).enumerate() {
        for (x, &bits) in row.iter_mut().zip(&src[r * stride..][..dim]) {
            *x = bf16_to_f32(bits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widened_rows_are_the_elements_shifted_on_every_form() {
        // 3 rows of 20 (a 16-lane body and a tail) at a stride of 23
        let src: Vec<u16> = (0..3 * 23).map(|i| (i * 977 % 65536) as u16).collect();
        let mut want = vec![0.0; 60];
        for r in 0..3 {
            for c in 0..20 {
                want[r * 20 + c] = bf16_to_f32(src[r * 23 + c]);
            }
        }
        let mut got = vec![0.0; 60];
        widen_rows(&src, 23, 20, &mut got);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        #[cfg(target_arch = "x86_64")]
        for isa in Isa::available() {
            got.fill(0.0);
            match isa {
                // SAFETY: `available` lists only forms this CPU runs.
                Isa::Avx512 => unsafe { widen_avx512(&src, 23, 20, &mut got) },
                // SAFETY: as above.
                Isa::Avx2 => unsafe { widen_avx2(&src, 23, 20, &mut got) },
                Isa::Portable => widen_body(&src, 23, 20, &mut got),
            }
            assert_eq!(bits(&got), bits(&want), "{isa:?}");
        }
    }

    /// Every form pairs as `pair` does: subnormals kept, NaN quiet, an odd length
    /// padded with zero.
    #[test]
    fn round_pairs_equals_the_scalar_rounding_on_every_form() {
        let mut src: Vec<f32> = (0..37).map(|i| (i as f32 * 0.73).sin() * 1e3).collect();
        src[3] = 1e-40;
        src[4] = -3e-39;
        src[5] = f32::NAN;
        src[6] = f32::from_bits(0x3f80_8000);
        let want: Vec<u32> = (0..19)
            .map(|p| pair(src[2 * p], src.get(2 * p + 1).copied().unwrap_or(0.0)))
            .collect();
        assert_ne!(want[1] >> 16, 0, "1e-40 rounds to a subnormal bf16");
        let mut got = vec![u32::MAX; 19];
        round_pairs(&src, &mut got);
        assert_eq!(got, want);
        #[cfg(target_arch = "x86_64")]
        for isa in Isa::available() {
            got.fill(u32::MAX);
            match isa {
                // SAFETY: `available` lists only forms this CPU runs.
                Isa::Avx512 => unsafe { pairs_avx512(&src, &mut got) },
                // SAFETY: as above.
                Isa::Avx2 => unsafe { pairs_avx2(&src, &mut got) },
                Isa::Portable => pairs_body(&src, &mut got),
            }
            assert_eq!(got, want, "{isa:?}");
        }
    }

    #[test]
    fn rounds_to_nearest_even_and_keeps_specials() {
        // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: ties go to the even one (1)
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        // 1 + 3·2⁻⁸ lies halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: even is 1 + 2⁻⁶
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        // just above halfway rounds up
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(-2.0), 0xc000);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xff80);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        // the largest f32 rounds to infinity, as in PyTorch
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(round_to_bf16(3.140625), 3.140625);
        assert_eq!(pair(1.0, -2.0), 0xc000_3f80);
    }
}
