//! The tile kernel on AVX-512 VNNI: a 512-bit vector holds a panel's quad row (16
//! columns, 4 steps each); `vpdpbusd` multiplies the weight's biased bytes (q + 128,
//! unsigned) by 4 activation bytes broadcast (signed) and adds the 4 products to each
//! column's i32 lane, 64 multiply-adds an instruction. The bias is taken off once a
//! group through the row's offset (128 · Σ q_x).

use super::operands::Tile;
use crate::weights::int8::weight::PANEL;
use std::arch::x86_64::*;

/// # Safety
/// AVX-512 F and VNNI; the tile's lengths as `tile_on` checks them.
// r and np index the sums and the operands alike
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn tile<const R: usize, const NP: usize>(
    t: &Tile<'_, R, NP>,
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    let quads = t.group / 4;
    let groups = t.x[0].scales.len();
    let mut total = [[_mm512_setzero_ps(); NP]; R];
    for g in 0..groups {
        let mut dot = [[_mm512_setzero_si512(); NP]; R];
        for quad in g * quads..(g + 1) * quads {
            let w: [__m512i; NP] = std::array::from_fn(|np| {
                _mm512_loadu_si512(t.codes[np].as_ptr().add(quad * PANEL).cast())
            });
            for r in 0..R {
                let at = t.x[r].codes.as_ptr().add(4 * quad).cast::<i32>();
                let x = _mm512_set1_epi32(at.read_unaligned());
                for np in 0..NP {
                    dot[r][np] = _mm512_dpbusd_epi32(dot[r][np], w[np], x);
                }
            }
        }
        for r in 0..R {
            let offset = _mm512_set1_epi32(*t.x[r].offsets.get_unchecked(g));
            let xs = _mm512_set1_ps(*t.x[r].scales.get_unchecked(g));
            for np in 0..NP {
                let ws = _mm512_loadu_ps(t.scales[np].as_ptr().add(g * PANEL));
                let exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r][np], offset));
                total[r][np] = _mm512_fmadd_ps(exact, _mm512_mul_ps(ws, xs), total[r][np]);
            }
        }
    }
    for r in 0..R {
        for np in 0..NP {
            _mm512_storeu_ps(out[r][np].as_mut_ptr(), total[r][np]);
        }
    }
}
