//! The tile kernel on AVX2: a 256-bit vector holds half a panel (8 rows, 4 steps
//! each). `vpmaddubsw` multiplies its code bytes by 4 activation bytes broadcast and
//! adds neighbours into i16 (at most 2·63·127, so never saturated), and `vpmaddwd`
//! multiplies those pairs by the group's scale (an i16 pair a row) into i32: the scale
//! is folded into the sum rather than multiplied after it, which integers allow.
//!
//! Each half panel is swept on its own over all super-blocks, its R rows' sums in
//! registers (16 of them on AVX2, too few to hold several panels as the VNNI kernel
//! does).

use super::operands::Tile;
use crate::weights::ggml::layout::BlockType;
use crate::weights::ggml::panels::{Parts, PANEL, VECTOR};
use std::arch::x86_64::*;

/// Rows of a 256-bit vector.
const HALF: usize = PANEL / 2;

/// The 4 activation bytes at `step` of `q`, on every lane.
#[inline(always)]
unsafe fn quad(q: &[i8], step: usize) -> __m256i {
    _mm256_set1_epi32(q.as_ptr().add(step).cast::<i32>().read_unaligned())
}

/// Half a panel's 8 signed bytes at `p` (one a row), as i32 lanes.
#[inline(always)]
unsafe fn bytes8(p: *const u8) -> __m256i {
    _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))
}

/// Group g's scales of half h of the panel block at `pb`, as i32 lanes.
#[inline(always)]
unsafe fn scales(pb: *const u8, p: &Parts, g: usize, h: usize) -> __m256i {
    bytes8(pb.add(p.scales + g * PANEL + HALF * h))
}

/// i32 lanes `lo` and `hi` (each within i16) as one i16 pair a lane, `lo` first.
#[inline(always)]
unsafe fn pair(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)),
        _mm256_slli_epi32(hi, 16),
    )
}

/// Each byte's bits `by..` of `h` under `mask`, moved up to bit 4.
#[inline(always)]
unsafe fn shift(h: __m256i, by: usize, mask: i8) -> __m256i {
    let bits = _mm256_and_si256(
        _mm256_srl_epi16(h, _mm_cvtsi32_si128(by as i32)),
        _mm256_set1_epi8(mask),
    );
    _mm256_slli_epi16(bits, 4)
}

/// Vector `v` of a unit's codes in half `h` of the panel block at `pb`: its low half
/// (steps 4v + i) and high half (16 + 4v + i), with the high bits of Q5_K and Q6_K.
#[inline(always)]
unsafe fn codes(
    ty: BlockType,
    pb: *const u8,
    p: &Parts,
    unit: usize,
    v: usize,
    h: usize,
) -> (__m256i, __m256i) {
    let at = |offset: usize| pb.add(offset + 32 * h).cast::<__m256i>();
    let low4 = _mm256_set1_epi8(0x0F);
    let n = _mm256_loadu_si256(at((unit * 4 + v) * VECTOR));
    let mut lo = _mm256_and_si256(n, low4);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16(n, 4), low4);
    match ty {
        BlockType::Q5K => {
            let bits = _mm256_loadu_si256(at(p.high + unit * VECTOR));
            lo = _mm256_or_si256(lo, shift(bits, v, 1));
            hi = _mm256_or_si256(hi, shift(bits, v + 4, 1));
        }
        BlockType::Q6K => {
            let h0 = _mm256_loadu_si256(at(p.high + 2 * unit * VECTOR));
            let h1 = _mm256_loadu_si256(at(p.high + (2 * unit + 1) * VECTOR));
            lo = _mm256_or_si256(lo, shift(h0, 2 * v, 3));
            hi = _mm256_or_si256(hi, shift(h1, 2 * v, 3));
        }
        _ => {}
    }
    (lo, hi)
}

/// Row r's activation sum of group g (16 steps) of super-block b.
#[inline(always)]
unsafe fn sum<const R: usize, const NP: usize>(
    t: &Tile<'_, R, NP>,
    r: usize,
    b: usize,
    g: usize,
) -> i32 {
    i32::from(*t.x[r].2.get_unchecked(b * t.ty.weights() / 16 + g))
}

/// # Safety
/// AVX2 and FMA; the tile's lengths as `tile_on` checks them.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const R: usize, const NP: usize>(
    t: &Tile<'_, R, NP>,
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    for np in 0..NP {
        for h in 0..2 {
            let sums = half_panel(t, t.panels[np].as_ptr(), h);
            for (out, sums) in out.iter_mut().zip(&sums) {
                _mm256_storeu_ps(out[np][h * HALF..].as_mut_ptr(), *sums);
            }
        }
    }
}

/// The sums of rows 8h..8h + 8 of the panel at `panel` for each of the tile's rows.
// r indexes the sums and the activations alike
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn half_panel<const R: usize, const NP: usize>(
    t: &Tile<'_, R, NP>,
    panel: *const u8,
    h: usize,
) -> [__m256; R] {
    let (ty, p) = (t.ty, Parts::of(t.ty));
    let per = ty.weights();
    let blocks = t.x[0].0.len() / per;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..blocks {
        let pb = panel.add(b * p.bytes);
        let mut isum = [_mm256_setzero_si256(); R];
        for unit in 0..p.units {
            let at = b * per + 32 * unit;
            // the scales of the unit's low and high 16 steps, as i16 pairs
            let (s_lo, s_hi) = match ty {
                BlockType::Q4_0 => (ones, ones),
                BlockType::Q6K => {
                    let (lo, hi) = (scales(pb, &p, 2 * unit, h), scales(pb, &p, 2 * unit + 1, h));
                    (pair(lo, lo), pair(hi, hi))
                }
                _ => {
                    let s = scales(pb, &p, unit, h);
                    (pair(s, s), pair(s, s))
                }
            };
            for v in 0..4 {
                let (lo, hi) = codes(ty, pb, &p, unit, v, h);
                for r in 0..R {
                    let (xa, xb) = (quad(t.x[r].0, at + 4 * v), quad(t.x[r].0, at + 16 + 4 * v));
                    let a = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xa), s_lo);
                    let c = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xb), s_hi);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(a, c));
                }
            }
            if ty == BlockType::Q6K {
                // minus 32 × each group's activation sum × its scale
                let scale_pair = pair(scales(pb, &p, 2 * unit, h), scales(pb, &p, 2 * unit + 1, h));
                for r in 0..R {
                    let (lo, hi) = (sum(t, r, b, 2 * unit), sum(t, r, b, 2 * unit + 1));
                    let sums =
                        _mm256_set1_epi32((lo as u16 as u32 | (hi as u16 as u32) << 16) as i32);
                    let offset = _mm256_slli_epi32(_mm256_madd_epi16(scale_pair, sums), 5);
                    isum[r] = _mm256_sub_epi32(isum[r], offset);
                }
            }
        }
        let d = _mm256_loadu_ps(pb.add(p.d + 4 * HALF * h).cast());
        for r in 0..R {
            if ty == BlockType::Q4_0 {
                let offset = _mm256_set1_epi32(8 * (sum(t, r, b, 0) + sum(t, r, b, 1)));
                isum[r] = _mm256_sub_epi32(isum[r], offset);
            }
            let dx = _mm256_set1_ps(*t.x[r].1.get_unchecked(b));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, dx), acc[r]);
            if p.has_mins {
                let mut msum = _mm256_setzero_si256();
                for m in 0..4 {
                    let s32 = |s: usize| sum(t, r, b, 2 * s) + sum(t, r, b, 2 * s + 1);
                    let (lo, hi) = (s32(2 * m) as u16 as u32, s32(2 * m + 1) as u16 as u32);
                    let sums = _mm256_set1_epi32((lo | hi << 16) as i32);
                    let mins = _mm256_loadu_si256(pb.add(p.mins + m * VECTOR + 32 * h).cast());
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins, sums));
                }
                let dmin = _mm256_mul_ps(_mm256_loadu_ps(pb.add(p.dmin + 4 * HALF * h).cast()), dx);
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), dmin, acc[r]);
            }
        }
    }
    acc
}
