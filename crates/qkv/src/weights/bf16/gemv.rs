//! The few-rows product: y `[R, N]` (+)= bf16(x) `[R, K]`·Wᵀ for R ≤ [`ROWS`]. x is
//! rounded to bf16 (as every bf16 product rounds it, so that a result does not depend
//! on the row count) and kept as f32; each weight word (two bf16) is widened to two f32
//! in registers, a shift and a mask, and multiplied into two sums, the even and the odd
//! K steps. The weight is streamed once from memory, at half the bytes of f32. Threads
//! split the panels.
//!
//! One row (a decoding step) takes four panels a call (64 columns; eight sums in flight
//! on AVX-512, as many as two FMA units need to cover their latency); several rows take
//! one panel a call. On AVX2 a call takes at most two rows, so that its sums (16 columns
//! are two 8-lane vectors) stay within the 16 registers.

use super::convert::round_to_bf16;
use super::job::Job;
use super::weight::{Bf16Weight, PANEL};
use crate::ops::disjoint::Disjoint;
use crate::ops::for_each_task;
use crate::ops::isa::Isa;

/// Most rows of x the few-rows product takes.
pub(super) const ROWS: usize = 4;

/// y `[rows, N]` ← (accumulate ? y : 0) + x `[rows, K]`·Wᵀ, all row-major.
pub(super) fn product(job: Job<'_>, parallel: bool) {
    let Job {
        y,
        x,
        rows,
        w,
        accumulate,
    } = job;
    let (n, k, pairs) = (w.n(), w.k(), w.pairs());
    assert!(rows <= ROWS && x.len() == rows * k && y.len() == rows * n);
    // rows rounded and padded to whole pairs, so the kernels read x two steps at a time
    let mut xs = vec![0.0f32; rows * 2 * pairs];
    for (dst, src) in xs.chunks_exact_mut(2 * pairs).zip(x.chunks_exact(k)) {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = round_to_bf16(v);
        }
    }
    let isa = Isa::detect();
    let group = if rows == 1 { 4 } else { 1 };
    let most_rows = if isa == Isa::Avx2 { 2 } else { ROWS };
    let panels = w.panels();
    let chunk = crate::weights::stored::panels_per_task(panels, group, 4, parallel);
    let out = Disjoint::new(y);
    let run = |j0: usize| {
        let j1 = panels.min(j0 + chunk);
        let mut sums = [[0.0f32; 4 * PANEL]; ROWS];
        for j in (j0..j1).step_by(group) {
            let live = (j1 - j).min(group);
            for r0 in (0..rows).step_by(most_rows) {
                let r_live = (rows - r0).min(most_rows);
                let x_rows: Vec<&[f32]> = (r0..r0 + r_live)
                    .map(|r| &xs[r * 2 * pairs..][..2 * pairs])
                    .collect();
                panels_on(isa, &x_rows, w, j, live, group, &mut sums);
                for (r, row) in sums.iter().enumerate().take(r_live) {
                    let cols = (n - j * PANEL).min(live * PANEL);
                    let at = (r0 + r) * n + j * PANEL;
                    // SAFETY: columns j·PANEL.. of this chunk's panels belong to this
                    // task alone.
                    let dst = unsafe { out.range(at, cols) };
                    for (d, &s) in dst.iter_mut().zip(row) {
                        *d = if accumulate { *d + s } else { s };
                    }
                }
            }
        }
    };
    if parallel {
        for_each_task(panels.div_ceil(chunk), |t| run(t * chunk));
    } else {
        run(0);
    }
}

/// Sums of the rows `x` (each 2·pairs long) against panels `j..j + live` of `w`, into
/// `sums[r][c]` for the panels' columns c; `group` (1 or 4) is the panels a call takes.
fn panels_on(
    isa: Isa,
    x: &[&[f32]],
    w: &Bf16Weight,
    j: usize,
    live: usize,
    group: usize,
    sums: &mut [[f32; 4 * PANEL]; ROWS],
) {
    // missing panels repeat the last live one; their sums are dropped
    let ws: [&[u32]; 4] = std::array::from_fn(|c| w.panel(j + c.min(live - 1)));
    macro_rules! call {
        ($r:literal, $np:literal) => {{
            let xr: [&[f32]; $r] = std::array::from_fn(|i| x[i]);
            let wr: [&[u32]; $np] = std::array::from_fn(|i| ws[i]);
            let mut out = [[[0.0f32; PANEL]; $np]; $r];
            kernel_on::<$r, $np>(isa, &xr, &wr, &mut out);
            for (dst, src) in sums.iter_mut().zip(&out) {
                for (np, cols) in src.iter().enumerate() {
                    dst[np * PANEL..][..PANEL].copy_from_slice(cols);
                }
            }
        }};
    }
    match (x.len(), group) {
        (1, 4) => call!(1, 4),
        (1, _) => call!(1, 1),
        (2, _) => call!(2, 1),
        (3, _) => call!(3, 1),
        _ => call!(4, 1),
    }
}

/// The R × NP-panel kernel in a given form (one this CPU has).
fn kernel_on<const R: usize, const NP: usize>(
    isa: Isa,
    x: &[&[f32]; R],
    w: &[&[u32]; NP],
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    let len = x[0].len();
    assert!(len.is_multiple_of(2) && x.iter().all(|r| r.len() == len));
    assert!(w.iter().all(|p| p.len() == len / 2 * PANEL));
    match isa {
        // SAFETY: the CPU has the form; the slices' lengths were checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::kernel_avx512(x, w, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::kernel_avx2(x, w, out) },
        _ => portable_kernel(x, w, out),
    }
}

/// The kernel in plain loops, in the vector forms' order of sums (even and odd steps
/// apart, added at the end): what runs without AVX2.
fn portable_kernel<const R: usize, const NP: usize>(
    x: &[&[f32]; R],
    w: &[&[u32]; NP],
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    let pairs = x[0].len() / 2;
    for r in 0..R {
        for np in 0..NP {
            for c in 0..PANEL {
                let (mut even, mut odd) = (0.0f32, 0.0f32);
                for p in 0..pairs {
                    let word = w[np][p * PANEL + c];
                    even = x[r][2 * p].mul_add(f32::from_bits(word << 16), even);
                    odd = x[r][2 * p + 1].mul_add(f32::from_bits(word & 0xffff_0000), odd);
                }
                out[r][np][c] = even + odd;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PANEL;
    use crate::ops::vector::Vector;
    use std::arch::x86_64::{__m256, __m512};

    /// The entry point of one instruction set, compiled for it, around the one body.
    macro_rules! entry_point {
        ($name:ident, $vector:ty, $features:literal, $needs:literal) => {
            #[doc = concat!("# Safety\n", $needs, "; the slices as `kernel_on` checks them.")]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const R: usize, const NP: usize>(
                x: &[&[f32]; R],
                w: &[&[u32]; NP],
                out: &mut [[[f32; PANEL]; NP]; R],
            ) {
                kernel::<$vector, R, NP>(x, w, out)
            }
        };
    }
    entry_point!(kernel_avx2, __m256, "avx2,fma", "AVX2 and FMA");
    entry_point!(kernel_avx512, __m512, "avx512f,avx2,fma", "AVX-512 F");

    #[inline(always)]
    unsafe fn kernel<V: Vector, const R: usize, const NP: usize>(
        x: &[&[f32]; R],
        w: &[&[u32]; NP],
        out: &mut [[[f32; PANEL]; NP]; R],
    ) {
        let lanes = V::LANES;
        let per_panel = PANEL / lanes;
        let pairs = x[0].len() / 2;
        // [R][NP][two vectors at most]: sums of the even and of the odd K steps
        let mut even = [[[V::zero(); 2]; NP]; R];
        let mut odd = [[[V::zero(); 2]; NP]; R];
        for p in 0..pairs {
            let mut xe = [V::zero(); R];
            let mut xo = [V::zero(); R];
            for r in 0..R {
                xe[r] = V::splat_from(x[r].as_ptr().add(2 * p));
                xo[r] = V::splat_from(x[r].as_ptr().add(2 * p + 1));
            }
            for np in 0..NP {
                for u in 0..per_panel {
                    let words = V::load(w[np].as_ptr().add(p * PANEL + u * lanes).cast());
                    let (we, wo) = (words.bf16_low(), words.bf16_high());
                    for r in 0..R {
                        even[r][np][u] = xe[r].mul_add(we, even[r][np][u]);
                        odd[r][np][u] = xo[r].mul_add(wo, odd[r][np][u]);
                    }
                }
            }
        }
        for r in 0..R {
            for np in 0..NP {
                for u in 0..per_panel {
                    let sum = even[r][np][u].plus(odd[r][np][u]);
                    sum.store(out[r][np][u * lanes..].as_mut_ptr());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Every form the CPU has gives the portable form's sums to the bit or within f32
    /// rounding (the vector forms sum the same terms in the same order per lane).
    #[test]
    fn every_form_equals_the_plain_loops() {
        let mut rng = Rng::new(3);
        let pairs = 37;
        let x: Vec<Vec<f32>> = (0..4).map(|_| rng.normals(2 * pairs, 1.0)).collect();
        let wf = rng.normals(4 * PANEL * 2 * pairs, 1.0);
        let w = Bf16Weight::new(&wf, 4 * PANEL, 2 * pairs).unwrap();
        let xr: [&[f32]; 4] = std::array::from_fn(|r| x[r].as_slice());
        let wr: [&[u32]; 1] = [w.panel(2)];
        let mut want = [[[0.0; PANEL]; 1]; 4];
        portable_kernel(&xr, &wr, &mut want);
        for isa in Isa::available() {
            let mut got = [[[0.0; PANEL]; 1]; 4];
            kernel_on(isa, &xr, &wr, &mut got);
            assert_eq!(got, want, "{isa:?}");
        }
    }
}
