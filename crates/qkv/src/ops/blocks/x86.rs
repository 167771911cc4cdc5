//! The dot products on AVX-512 VNNI: one weight row's blocks against R rows of x
//! (a decoding step's one, or a few), the codes unpacked to bytes in registers and
//! multiplied by `vpdpbusd` (unsigned codes × signed activations, 4 products a lane,
//! exact in i32). Each block's sums stay integer until they are scaled; the sum over
//! blocks is f32 in vector lanes, summed at the end of the row.
//!
//! Lane i of a `vpdpbusd` holds steps 4i..4i + 4 of its 64, so a sub-block of 32 is 8
//! lanes and a group of 16 is 4: the sub-blocks' scales are spread over the lanes they
//! multiply by byte shuffles.

use super::activations::XRow;
use super::layout::QK_K;
use std::arch::x86_64::*;

/// Whether this CPU runs these forms (and the width is not capped below AVX-512).
pub(super) fn available() -> bool {
    crate::ops::isa::Isa::detect() == crate::ops::isa::Isa::Avx512
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("f16c")
}

/// The f16 at `p`, widened by F16C's `vcvtph2ps`.
///
/// # Safety
/// F16C; `p` points at 2 readable bytes.
#[inline(always)]
unsafe fn half(p: *const u8) -> f32 {
    let bits = p.cast::<u16>().read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The 16 bytes `[a ×8, b ×8]`, as a shuffle's index.
fn pair_index(a: u8, b: u8) -> __m128i {
    let mut idx = [a; 16];
    idx[8..].fill(b);
    // SAFETY: SSE2 is part of x86_64
    unsafe { _mm_loadu_si128(idx.as_ptr().cast()) }
}

/// The 16 bytes `[g ×4, g + 1 ×4, g + 2 ×4, g + 3 ×4]`.
fn quad_index(g: u8) -> __m128i {
    let idx: [u8; 16] = std::array::from_fn(|i| g + (i / 4) as u8);
    // SAFETY: as above
    unsafe { _mm_loadu_si128(idx.as_ptr().cast()) }
}

/// Q4_K (`five` false) or Q5_K: Σ over blocks of d·dx·Σ_s scale_s·Σ c·x −
/// dmin·dx·Σ_s min_s·Σ x.
///
/// # Safety
/// [`available`]; `w` whole blocks of the type, each x row as long.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn dot_k45<const R: usize>(w: &[u8], x: [XRow; R], five: bool) -> [f32; R] {
    let bytes = if five { 176 } else { 144 };
    let low4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let pairs: [__m128i; 4] = std::array::from_fn(|p| pair_index(2 * p as u8, 2 * p as u8 + 1));
    let min_pairs = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_min = [_mm256_setzero_ps(); R];
    for (b, block) in w.chunks_exact(bytes).enumerate() {
        let p0 = block.as_ptr();
        let (d, dmin) = (half(p0), half(p0.add(2)));
        let sm = scales_then_mins(&block[4..16]);
        let high = if five {
            _mm256_loadu_si256(p0.add(16).cast())
        } else {
            _mm256_setzero_si256()
        };
        let codes = p0.add(if five { 48 } else { 16 });
        let mut isum = [_mm512_setzero_si512(); R];
        for (p, pair) in pairs.iter().enumerate() {
            let q = _mm256_loadu_si256(codes.add(32 * p).cast());
            let mut lo = _mm256_and_si256(q, low4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if five {
                let bit = |s: i32| {
                    let h = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(s)), one);
                    _mm256_slli_epi16(h, 4)
                };
                lo = _mm256_or_si256(lo, bit(2 * p as i32));
                hi = _mm256_or_si256(hi, bit(2 * p as i32 + 1));
            }
            let codes = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            let scale = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(sm, *pair));
            for r in 0..R {
                let xq = _mm512_loadu_si512(x[r].0.as_ptr().add(b * QK_K + 64 * p).cast());
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xq);
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot, scale));
            }
        }
        let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, min_pairs));
        for r in 0..R {
            let dx = *x[r].1.get_unchecked(b);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_set1_ps(d * dx), acc[r]);
            let sums = _mm256_loadu_si256(x[r].2.as_ptr().add(16 * b).cast());
            let m = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, mins));
            acc_min[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(dmin * dx), acc_min[r]);
        }
    }
    std::array::from_fn(|r| _mm512_reduce_add_ps(acc[r]) - sum8(acc_min[r]))
}

/// The 8 six-bit scales, then the 8 mins, of a Q4_K or Q5_K block's 12 bytes
/// ([`super::layout::scales_mins`], four bytes at a time).
#[inline(always)]
fn scales_then_mins(s: &[u8]) -> __m128i {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    let scales_0_4 = a & LOW6;
    let scales_4_8 = (c & LOW4) | (((a >> 6) & LOW2) << 4);
    let mins_0_4 = b & LOW6;
    let mins_4_8 = ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4);
    // SAFETY: SSE2 is part of x86_64
    unsafe {
        _mm_setr_epi32(
            scales_0_4 as i32,
            scales_4_8 as i32,
            mins_0_4 as i32,
            mins_4_8 as i32,
        )
    }
}

/// Q6_K: Σ over blocks of d·dx·Σ_g scale_g·(Σ c·x − 32·Σ x), groups g of 16.
///
/// # Safety
/// As [`dot_k45`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn dot_q6_k<const R: usize>(w: &[u8], x: [XRow; R]) -> [f32; R] {
    let low4 = _mm512_set1_epi8(0x0F);
    let top2 = _mm256_set1_epi8(0x30);
    let quads: [__m128i; 4] = std::array::from_fn(|c| quad_index(4 * c as u8));
    let mut acc = [_mm512_setzero_ps(); R];
    for (b, block) in w.chunks_exact(210).enumerate() {
        let p0 = block.as_ptr();
        let d = half(p0.add(208));
        let scales = _mm_loadu_si128(p0.add(192).cast());
        let mut isum = [_mm512_setzero_si512(); R];
        for h in 0..2 {
            let low = _mm512_loadu_si512(p0.add(64 * h).cast());
            let high = _mm256_loadu_si256(p0.add(128 + 32 * h).cast());
            // the 2 high bits of quarter k of the half, moved to bits 4..6
            let k0 = _mm256_and_si256(_mm256_slli_epi16(high, 4), top2);
            let k1 = _mm256_and_si256(_mm256_slli_epi16(high, 2), top2);
            let k2 = _mm256_and_si256(high, top2);
            let k3 = _mm256_and_si256(_mm256_srli_epi16(high, 2), top2);
            let join = |a: __m256i, b: __m256i| _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
            let chunks = [
                _mm512_or_si512(_mm512_and_si512(low, low4), join(k0, k1)),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(low, 4), low4),
                    join(k2, k3),
                ),
            ];
            for (i, codes) in chunks.into_iter().enumerate() {
                let c = 2 * h + i;
                let scale = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, quads[c]));
                for r in 0..R {
                    let xq = _mm512_loadu_si512(x[r].0.as_ptr().add(b * QK_K + 64 * c).cast());
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xq);
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot, scale));
                }
            }
        }
        let wide_scales = _mm256_cvtepi8_epi16(scales);
        for r in 0..R {
            let sums = _mm256_loadu_si256(x[r].2.as_ptr().add(16 * b).cast());
            // 32·Σ_g scale_g·Σ x, in the low 8 lanes: subtracted before any rounding
            let offset = _mm256_slli_epi32(_mm256_madd_epi16(sums, wide_scales), 5);
            let exact = _mm512_sub_epi32(isum[r], _mm512_zextsi256_si512(offset));
            let dx = *x[r].1.get_unchecked(b);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(d * dx), acc[r]);
        }
    }
    std::array::from_fn(|r| _mm512_reduce_add_ps(acc[r]))
}

/// Q4_0 against Q8_0: Σ over blocks of d·dx·(Σ c·x − 8·Σ x), two blocks of 32 a
/// `vpdpbusd`; an odd last block is left to the caller (returned: how many blocks
/// were summed).
///
/// # Safety
/// As [`dot_k45`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_0<const R: usize>(w: &[u8], x: [XRow; R]) -> ([f32; R], usize) {
    let low4 = _mm_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    let pairs = w.len() / 18 / 2;
    for pair in 0..pairs {
        let (pa, pb) = (w.as_ptr().add(36 * pair), w.as_ptr().add(36 * pair + 18));
        let unpack = |p: *const u8| {
            let q = _mm_loadu_si128(p.add(2).cast());
            let lo = _mm_and_si128(q, low4);
            let hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
            _mm256_set_m128i(hi, lo)
        };
        let codes = _mm512_inserti64x4(_mm512_castsi256_si512(unpack(pa)), unpack(pb), 1);
        let (da, db) = (half(pa), half(pb));
        for r in 0..R {
            let (b0, b1) = (2 * pair, 2 * pair + 1);
            let xq = _mm512_loadu_si512(x[r].0.as_ptr().add(32 * b0).cast());
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xq);
            let s = x[r].2;
            let sum = |b: usize| 8 * (i32::from(s[2 * b]) + i32::from(s[2 * b + 1]));
            // 8·Σ x of each block, taken off one lane of its eight
            let offset =
                _mm512_mask_set1_epi32(_mm512_maskz_set1_epi32(1, sum(b0)), 1 << 8, sum(b1));
            let exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot, offset));
            let (xa, xb) = (x[r].1[b0], x[r].1[b1]);
            let scale =
                _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(da * xa), _mm512_set1_ps(db * xb));
            acc[r] = _mm512_fmadd_ps(exact, scale, acc[r]);
        }
    }
    (
        std::array::from_fn(|r| _mm512_reduce_add_ps(acc[r])),
        2 * pairs,
    )
}

/// The sum of 8 lanes.
#[inline(always)]
fn sum8(v: __m256) -> f32 {
    let mut lanes = [0.0f32; 8];
    // SAFETY: 8 floats
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    lanes.iter().sum()
}
