//! The tile kernel: sums of R rows of quantized x against NP panels of an int8 weight,
//! `out[r][np][c]` = Σ_g d_x[r, g]·d_w[16·np + c, g] · Σ_{k in g} q_x[r, k]·q_w[.., k].
//!
//! Each group's sum is exact in i32: `vpdpbusd` multiplies 4 unsigned weight bytes
//! (q_w + 128) by 4 signed activation bytes and adds the 4 products to a lane, 64
//! multiply-adds an instruction; the bias is taken off once a group (the rows'
//! offsets). Only the sum over groups is in f32, in the same order in both forms, so
//! the two give the same bits.

use super::weight::PANEL;

/// One tile's operands: R rows of x (codes, scales, offsets: see
/// [`super::rows::QuantizedRows`]), and NP panels (codes, scales) of the weight.
pub(super) struct Tile<'a, const R: usize, const NP: usize> {
    pub x: [(&'a [i8], &'a [f32], &'a [i32]); R],
    pub codes: [&'a [u32]; NP],
    pub scales: [&'a [f32]; NP],
    /// K steps per scale, a multiple of 4
    pub group: usize,
}

/// Which form of the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    /// AVX-512 VNNI's `vpdpbusd`.
    Vnni,
    /// Plain loops: the twin, which the tests run, and the tiles' form on any CPU.
    Plain,
}

/// Whether this CPU has `vpdpbusd` on 512-bit vectors and the width is not capped
/// below AVX-512 (`QKV_ISA`).
pub(super) fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::ops::isa::Isa::detect() == crate::ops::isa::Isa::Avx512
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The forms this CPU runs: the plain loops, and VNNI where it has it.
#[cfg(test)]
pub(super) fn kernels_here() -> Vec<Kernel> {
    let mut kernels = vec![Kernel::Plain];
    if vnni() {
        kernels.push(Kernel::Vnni);
    }
    kernels
}

/// The tile's sums in the given form (Vnni only where [`vnni`] says yes).
pub(super) fn tile_on<const R: usize, const NP: usize>(
    kernel: Kernel,
    t: &Tile<'_, R, NP>,
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    let width = t.x[0].0.len();
    let groups = width / t.group;
    assert!(t.group.is_multiple_of(4) && groups * t.group == width);
    assert!(t
        .x
        .iter()
        .all(|(q, s, o)| q.len() == width && s.len() == groups && o.len() == groups));
    assert!(t.codes.iter().all(|c| c.len() == width / 4 * PANEL));
    assert!(t.scales.iter().all(|s| s.len() == groups * PANEL));
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => {
            assert!(vnni(), "vpdpbusd needs AVX-512 VNNI");
            // SAFETY: the CPU has the instructions; the lengths were checked above.
            unsafe { x86::tile(t, out) }
        }
        _ => plain(t, out),
    }
}

/// The kernel in plain loops, in the vector form's order of sums.
fn plain<const R: usize, const NP: usize>(t: &Tile<'_, R, NP>, out: &mut [[[f32; PANEL]; NP]; R]) {
    let quads = t.group / 4;
    for (&(q, xs, offsets), out) in t.x.iter().zip(out.iter_mut()) {
        for ((codes, scales), out) in t.codes.iter().zip(&t.scales).zip(out.iter_mut()) {
            for (c, total) in out.iter_mut().enumerate() {
                *total = 0.0;
                for g in 0..xs.len() {
                    let mut dot = 0i32;
                    for quad in g * quads..(g + 1) * quads {
                        let word = codes[quad * PANEL + c];
                        for i in 0..4 {
                            let w = (word >> (8 * i)) & 0xff;
                            dot += w as i32 * i32::from(q[4 * quad + i]);
                        }
                    }
                    let scale = scales[g * PANEL + c] * xs[g];
                    *total = ((dot - offsets[g]) as f32).mul_add(scale, *total);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Tile, PANEL};
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
        let groups = t.x[0].1.len();
        let mut total = [[_mm512_setzero_ps(); NP]; R];
        for g in 0..groups {
            let mut dot = [[_mm512_setzero_si512(); NP]; R];
            for quad in g * quads..(g + 1) * quads {
                let w: [__m512i; NP] = std::array::from_fn(|np| {
                    _mm512_loadu_si512(t.codes[np].as_ptr().add(quad * PANEL).cast())
                });
                for r in 0..R {
                    let at = t.x[r].0.as_ptr().add(4 * quad).cast::<i32>();
                    let x = _mm512_set1_epi32(at.read_unaligned());
                    for np in 0..NP {
                        dot[r][np] = _mm512_dpbusd_epi32(dot[r][np], w[np], x);
                    }
                }
            }
            for r in 0..R {
                let offset = _mm512_set1_epi32(*t.x[r].2.get_unchecked(g));
                let xs = _mm512_set1_ps(*t.x[r].1.get_unchecked(g));
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
}

#[cfg(test)]
mod tests {
    use super::super::rows::QuantizedRows;
    use super::super::weight::{Int8Weight, ScaleLayout};
    use super::*;
    use crate::rng::Rng;

    /// Every form this CPU has gives the plain loops' bits, in both layouts.
    #[test]
    fn every_form_equals_the_plain_loops_to_the_bit() {
        let mut rng = Rng::new(5);
        let (rows, k, n) = (3, 200, 2 * PANEL);
        let x = rng.normals(rows * k, 1.0);
        let wf = rng.normals(n * k, 1.0);
        for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
            let w = Int8Weight::new(&wf, n, k, layout).unwrap();
            let xq = QuantizedRows::new(&x, rows, &w, false);
            let t = Tile::<3, 2> {
                x: std::array::from_fn(|r| xq.row(r)),
                codes: std::array::from_fn(|j| w.panel_codes(j)),
                scales: std::array::from_fn(|j| w.panel_scales(j)),
                group: w.group(),
            };
            let mut want = [[[0.0; PANEL]; 2]; 3];
            tile_on(Kernel::Plain, &t, &mut want);
            for kernel in kernels_here() {
                let mut got = [[[1.0; PANEL]; 2]; 3];
                tile_on(kernel, &t, &mut got);
                assert_eq!(got, want, "{kernel:?} {layout:?}");
            }
        }
    }
}
