//! The tile kernel on AVX-512 VNNI: one `vpdpbusd` multiplies 4 steps of a panel's 16
//! rows (its 64-byte vector of codes, unpacked from nibbles and high bits in
//! registers) by the same 4 activation bytes broadcast; the mins through `vpdpwssd`.

use super::operands::Tile;
use crate::weights::ggml::layout::BlockType;
use crate::weights::ggml::panels::{Parts, PANEL, VECTOR};
use std::arch::x86_64::*;

/// The 4 activation bytes at `step` of `q`, on every lane.
#[inline(always)]
unsafe fn quad(q: &[i8], step: usize) -> __m512i {
    _mm512_set1_epi32(q.as_ptr().add(step).cast::<i32>().read_unaligned())
}

/// A panel's 16 signed bytes at `p`, widened to i32 lanes.
#[inline(always)]
unsafe fn bytes16(p: *const u8) -> __m512i {
    _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))
}

/// Vector `v` of a unit's nibbles: the codes of its low half (step 4v + i) and
/// high half (16 + 4v + i), with their high bits for Q5_K and Q6_K.
#[inline(always)]
unsafe fn codes(
    ty: BlockType,
    pb: *const u8,
    p: &Parts,
    unit: usize,
    v: usize,
) -> (__m512i, __m512i) {
    let low4 = _mm512_set1_epi8(0x0F);
    let n = _mm512_loadu_si512(pb.add((unit * 4 + v) * VECTOR).cast());
    let mut lo = _mm512_and_si512(n, low4);
    let mut hi = _mm512_and_si512(_mm512_srli_epi16(n, 4), low4);
    match ty {
        BlockType::Q5K => {
            let h = _mm512_loadu_si512(pb.add(p.high + unit * VECTOR).cast());
            lo = _mm512_or_si512(lo, shift(h, v, 1));
            hi = _mm512_or_si512(hi, shift(h, v + 4, 1));
        }
        BlockType::Q6K => {
            let h0 = _mm512_loadu_si512(pb.add(p.high + 2 * unit * VECTOR).cast());
            let h1 = _mm512_loadu_si512(pb.add(p.high + (2 * unit + 1) * VECTOR).cast());
            lo = _mm512_or_si512(lo, shift(h0, 2 * v, 3));
            hi = _mm512_or_si512(hi, shift(h1, 2 * v, 3));
        }
        _ => {}
    }
    (lo, hi)
}

/// Each byte's bits `by..` of `h` under `mask`, moved up to bit 4.
#[inline(always)]
unsafe fn shift(h: __m512i, by: usize, mask: i8) -> __m512i {
    let bits = _mm512_and_si512(
        _mm512_srl_epi16(h, _mm_cvtsi32_si128(by as i32)),
        _mm512_set1_epi8(mask),
    );
    _mm512_slli_epi16(bits, 4)
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
/// AVX-512 F, BW and VNNI; the tile's lengths as `tile_on` checks them.
// r and np index the sums and the operands alike
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn tile<const R: usize, const NP: usize>(
    t: &Tile<'_, R, NP>,
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    let (ty, p) = (t.ty, Parts::of(t.ty));
    let per = ty.weights();
    let blocks = t.x[0].0.len() / per;
    let mut acc = [[_mm512_setzero_ps(); NP]; R];
    for b in 0..blocks {
        let mut pb = [std::ptr::null::<u8>(); NP];
        for np in 0..NP {
            pb[np] = t.panels[np].as_ptr().add(b * p.bytes);
        }
        let step0 = b * per;
        let mut isum = [[_mm512_setzero_si512(); NP]; R];
        for unit in 0..p.units {
            let at = step0 + 32 * unit;
            if ty == BlockType::Q6K {
                // the unit's two groups of 16, each with its own scale
                for half in 0..2 {
                    let mut dot = [[_mm512_setzero_si512(); NP]; R];
                    for v in 0..4 {
                        let mut w = [_mm512_setzero_si512(); NP];
                        for np in 0..NP {
                            let (lo, hi) = codes(ty, pb[np], &p, unit, v);
                            w[np] = if half == 0 { lo } else { hi };
                        }
                        for r in 0..R {
                            let x = quad(t.x[r].0, at + 16 * half + 4 * v);
                            for np in 0..NP {
                                dot[r][np] = _mm512_dpbusd_epi32(dot[r][np], w[np], x);
                            }
                        }
                    }
                    let g = 2 * unit + half;
                    for r in 0..R {
                        let offset = _mm512_set1_epi32(32 * sum(t, r, b, g));
                        for np in 0..NP {
                            let scale = bytes16(pb[np].add(p.scales + g * PANEL));
                            let exact = _mm512_sub_epi32(dot[r][np], offset);
                            isum[r][np] =
                                _mm512_add_epi32(isum[r][np], _mm512_mullo_epi32(exact, scale));
                        }
                    }
                }
                continue;
            }
            let mut dot = [[_mm512_setzero_si512(); NP]; R];
            for v in 0..4 {
                let mut w = [(_mm512_setzero_si512(), _mm512_setzero_si512()); NP];
                for np in 0..NP {
                    w[np] = codes(ty, pb[np], &p, unit, v);
                }
                for r in 0..R {
                    let (xa, xb) = (quad(t.x[r].0, at + 4 * v), quad(t.x[r].0, at + 16 + 4 * v));
                    for np in 0..NP {
                        dot[r][np] = _mm512_dpbusd_epi32(dot[r][np], w[np].0, xa);
                        dot[r][np] = _mm512_dpbusd_epi32(dot[r][np], w[np].1, xb);
                    }
                }
            }
            for r in 0..R {
                for np in 0..NP {
                    isum[r][np] = if ty == BlockType::Q4_0 {
                        let offset = _mm512_set1_epi32(8 * (sum(t, r, b, 0) + sum(t, r, b, 1)));
                        _mm512_sub_epi32(dot[r][np], offset)
                    } else {
                        let scale = bytes16(pb[np].add(p.scales + unit * PANEL));
                        _mm512_add_epi32(isum[r][np], _mm512_mullo_epi32(dot[r][np], scale))
                    };
                }
            }
        }
        for r in 0..R {
            let dx = _mm512_set1_ps(*t.x[r].1.get_unchecked(b));
            // the activation sums of sub-blocks 2m and 2m + 1 as two i16 on every lane
            let mut pairs = [_mm512_setzero_si512(); 4];
            if p.has_mins {
                for (m, pair) in pairs.iter_mut().enumerate() {
                    let s32 = |s: usize| sum(t, r, b, 2 * s) + sum(t, r, b, 2 * s + 1);
                    let (lo, hi) = (s32(2 * m) as u16 as u32, s32(2 * m + 1) as u16 as u32);
                    *pair = _mm512_set1_epi32((lo | hi << 16) as i32);
                }
            }
            for np in 0..NP {
                let d = _mm512_mul_ps(_mm512_loadu_ps(pb[np].add(p.d).cast()), dx);
                acc[r][np] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][np]), d, acc[r][np]);
                if p.has_mins {
                    let mut msum = _mm512_setzero_si512();
                    for (m, &pair) in pairs.iter().enumerate() {
                        let mins = _mm512_loadu_si512(pb[np].add(p.mins + m * VECTOR).cast());
                        msum = _mm512_dpwssd_epi32(msum, mins, pair);
                    }
                    let dmin = _mm512_mul_ps(_mm512_loadu_ps(pb[np].add(p.dmin).cast()), dx);
                    acc[r][np] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), dmin, acc[r][np]);
                }
            }
        }
    }
    for r in 0..R {
        for np in 0..NP {
            _mm512_storeu_ps(out[r][np].as_mut_ptr(), acc[r][np]);
        }
    }
}
