//! The tile kernel on AVX2: a 256-bit vector holds half a panel's quad row (8 columns,
//! 4 steps each). `vpmaddubsw` multiplies unsigned bytes by signed ones and adds
//! neighbours into i16, saturating: the weight's biased bytes (q + 128, up to 255)
//! times activations up to 127 would overflow. So the bias comes off first (q = byte ^
//! 0x80), |q| is the unsigned side and the activations take q's sign (`vpsignb`):
//! |q|·(x·sgn q) = q·x, a pair at most 2·128·127 < 2¹⁵. `vpmaddwd` by ones adds the
//! pairs into each column's i32 lane. A group's sum is then Σ q_w·q_x exactly, the
//! integer the VNNI kernel reaches through the offsets, and the f32 operations after
//! it are the same: both forms give the plain loops' bits.
//!
//! Each half panel is swept on its own over all groups, its R rows' sums in
//! registers (16 of them on AVX2, too few to hold several panels as the VNNI kernel
//! does); one row sweeps all its panels at once.
//!
//! (An i16 form, the biased bytes zero-extended against widened codes in `vpmaddwd`,
//! needs as many vector operations for 32 multiply-adds, `vpmaddwd` and `vpaddd`
//! twice, and measured no faster on Zen 3: docs/speed.md.)

use super::operands::{Tile, XRow};
use crate::weights::int8::weight::PANEL;
use std::arch::x86_64::*;

/// Columns of a 256-bit vector.
const HALF: usize = PANEL / 2;

/// # Safety
/// AVX2 and FMA; the tile's lengths as `tile_on` checks them.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const R: usize, const NP: usize>(
    t: &Tile<'_, R, NP>,
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    if R == 1 {
        return whole_panels(t.x[0], (&t.codes, &t.scales), t.group, &mut out[0]);
    }
    for np in 0..NP {
        for h in 0..2 {
            let sums = half_panel(t, np, h);
            for (out, sums) in out.iter_mut().zip(&sums) {
                _mm256_storeu_ps(out[np][h * HALF..].as_mut_ptr(), *sums);
            }
        }
    }
}

/// The weight's quad row of 8 columns as `vpmaddubsw` takes it: the codes q (bias
/// off), and |q|, its unsigned side (−128 stays 0x80, which reads as 128).
#[inline(always)]
unsafe fn unbiased(quad_row: *const u32) -> (__m256i, __m256i) {
    let q = _mm256_xor_si256(
        _mm256_loadu_si256(quad_row.cast()),
        _mm256_set1_epi8(i8::MIN),
    );
    (q, _mm256_sign_epi8(q, q))
}

/// `dot` + each column's Σ of its 4 products q·x, exactly: x `[4]` broadcast, as an
/// i32, to every column.
#[inline(always)]
unsafe fn add_quad(dot: __m256i, (q, magnitude): (__m256i, __m256i), x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, q));
    _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// x's codes `4·quad..4·quad + 4` in every i32 lane.
#[inline(always)]
unsafe fn broadcast_quad(codes: &[i8], quad: usize) -> __m256i {
    _mm256_set1_epi32(codes.as_ptr().add(4 * quad).cast::<i32>().read_unaligned())
}

/// One row (a decoding step) against every panel at once, both halves: the weight is
/// read as it lies, one pass over contiguous memory, where half panels would read
/// each cache line twice, half at a time. Its 2·NP sums fill registers, so the
/// running totals live in `out` (each group's operations as [`half_panel`]'s).
// np indexes the sums and the panels alike
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn whole_panels<const NP: usize>(
    x: XRow<'_>,
    (codes, scales): (&[&[u32]; NP], &[&[f32]; NP]),
    group: usize,
    out: &mut [[f32; PANEL]; NP],
) {
    let quads = group / 4;
    for o in out.iter_mut() {
        o.fill(0.0);
    }
    for (g, &xs) in x.scales.iter().enumerate() {
        let mut dot = [[_mm256_setzero_si256(); 2]; NP];
        for quad in g * quads..(g + 1) * quads {
            let xq = broadcast_quad(x.codes, quad);
            for np in 0..NP {
                let quad_row = codes[np].as_ptr().add(quad * PANEL);
                for h in 0..2 {
                    dot[np][h] = add_quad(dot[np][h], unbiased(quad_row.add(HALF * h)), xq);
                }
            }
        }
        let xs = _mm256_set1_ps(xs);
        for np in 0..NP {
            for h in 0..2 {
                let ws = _mm256_loadu_ps(scales[np].as_ptr().add(g * PANEL + HALF * h));
                let total = out[np][HALF * h..].as_mut_ptr();
                let exact = _mm256_cvtepi32_ps(dot[np][h]);
                let sum = _mm256_fmadd_ps(exact, _mm256_mul_ps(ws, xs), _mm256_loadu_ps(total));
                _mm256_storeu_ps(total, sum);
            }
        }
    }
}

/// The sums of columns 8h..8h + 8 of panel `np` for each of the tile's rows.
// r indexes the sums and the activations alike
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn half_panel<const R: usize, const NP: usize>(
    t: &Tile<'_, R, NP>,
    np: usize,
    h: usize,
) -> [__m256; R] {
    let quads = t.group / 4;
    let groups = t.x[0].scales.len();
    let codes = t.codes[np].as_ptr().add(HALF * h);
    let scales = t.scales[np].as_ptr().add(HALF * h);
    let mut total = [_mm256_setzero_ps(); R];
    for g in 0..groups {
        let mut dot = [_mm256_setzero_si256(); R];
        for quad in g * quads..(g + 1) * quads {
            let w = unbiased(codes.add(quad * PANEL));
            for r in 0..R {
                dot[r] = add_quad(dot[r], w, broadcast_quad(t.x[r].codes, quad));
            }
        }
        let ws = _mm256_loadu_ps(scales.add(g * PANEL));
        for r in 0..R {
            let xs = _mm256_set1_ps(*t.x[r].scales.get_unchecked(g));
            let exact = _mm256_cvtepi32_ps(dot[r]);
            total[r] = _mm256_fmadd_ps(exact, _mm256_mul_ps(ws, xs), total[r]);
        }
    }
    total
}
