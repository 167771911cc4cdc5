//! The few-rows path: C `[M,N]` ← β·C + α·A·Wᵀ for M ≤ a handful, with A's rows and
//! W's rows (B's columns) contiguous. Each group of weight rows is read from memory
//! once and dotted with every row of A, so a decode step or a short sentence reads
//! each weight exactly once, at memory speed, with nothing packed. Threads split the
//! weight rows.
//!
//! A kernel call dots R ≤ 4 rows of A with W weight rows. With several rows of A,
//! W = 3: 12 accumulators, 3 weight vectors and one row vector fill the 16 AVX2
//! registers exactly (4 × 4 would spill). With one row (a decode step) W = 8: eight
//! weight rows in flight at once keep more of memory's bandwidth busy, and a call's
//! fixed cost (the horizontal sums, the stores) is spread over more of the weight.

use super::view::{MatRef, Update};
use crate::ops::disjoint::Disjoint;
use crate::ops::isa::Isa;
use crate::ops::pool::for_each_task;

/// Most rows of A per kernel call.
const ROWS: usize = 4;
/// Weight rows per kernel call, with several rows of A and with one.
const WROWS: usize = 3;
const WROWS_ONE: usize = 8;

/// As [`super::blocked::product`], for `a.col_stride == 1 && b.row_stride == 1`.
pub(super) fn product(u: Update<'_>, a: MatRef<'_>, b: MatRef<'_>, parallel: bool) {
    if u.c.rows == 1 {
        sweep::<WROWS_ONE>(u, a, b, parallel);
    } else {
        sweep::<WROWS>(u, a, b, parallel);
    }
}

/// [`product`] with W weight rows per kernel call.
fn sweep<const W: usize>(u: Update<'_>, a: MatRef<'_>, b: MatRef<'_>, parallel: bool) {
    let Update { c, alpha, add } = u;
    let (m, n, k) = (c.rows, c.cols, a.cols);
    let (rs, cs) = (c.row_stride, c.col_stride);
    let out = Disjoint::new(c.data);
    let chunk = if parallel {
        n.div_ceil(4 * rayon::current_num_threads())
            .next_multiple_of(W)
    } else {
        n
    };
    let run = |j0: usize| {
        let j1 = n.min(j0 + chunk);
        for j in (j0..j1).step_by(W) {
            let w_live = (j1 - j).min(W);
            // missing rows repeat the last live one; their sums are dropped
            let w: [&[f32]; W] =
                std::array::from_fn(|c| &b.data[(j + c.min(w_live - 1)) * b.col_stride..][..k]);
            // rows in ⌈m/ROWS⌉ groups of near-equal size (13 = 4+3+3+3, not 4+4+4+1):
            // a group of one row has only W independent sums, too few to cover the
            // multiply-add's latency, and would run at half speed
            let groups = m.div_ceil(ROWS);
            for g in 0..groups {
                let i = g * m / groups;
                let a_live = (g + 1) * m / groups - i;
                let row = |r: usize| &a.data[(i + r) * a.row_stride..][..k];
                let sums = match a_live {
                    1 => widen(dots::<1, W>(&[row(0)], &w)),
                    2 => widen(dots::<2, W>(&[row(0), row(1)], &w)),
                    3 => widen(dots::<3, W>(&[row(0), row(1), row(2)], &w)),
                    _ => dots::<ROWS, W>(&[row(0), row(1), row(2), row(3)], &w),
                };
                for (r, row) in sums.iter().enumerate().take(a_live) {
                    for (col, &v) in row.iter().enumerate().take(w_live) {
                        let at = (i + r) * rs + (j + col) * cs;
                        // SAFETY: (i + r, j + col) is inside C, and column j + col
                        // belongs to this chunk alone.
                        let dst = unsafe { &mut *out.ptr(at, at + 1) };
                        *dst = if add { *dst + alpha * v } else { alpha * v };
                    }
                }
            }
        }
    };
    if parallel {
        for_each_task(n.div_ceil(chunk), |t| run(t * chunk));
    } else {
        run(0);
    }
}

/// Sums of the first R rows, in a ROWS-row array (the rest zero).
fn widen<const R: usize, const W: usize>(sums: [[f32; W]; R]) -> [[f32; W]; ROWS] {
    std::array::from_fn(|r| if r < R { sums[r] } else { [0.0; W] })
}

/// The R × W dot products x[r]·w[c] (all slices of one length).
fn dots<const R: usize, const W: usize>(x: &[&[f32]; R], w: &[&[f32]; W]) -> [[f32; W]; R] {
    dots_on(Isa::detect(), x, w)
}

/// [`dots`] in a given form (one this CPU has).
fn dots_on<const R: usize, const W: usize>(
    isa: Isa,
    x: &[&[f32]; R],
    w: &[&[f32]; W],
) -> [[f32; W]; R] {
    let k = x[0].len();
    assert!(x.iter().all(|r| r.len() == k) && w.iter().all(|r| r.len() == k));
    match isa {
        // SAFETY: the CPU has the form (the caller's `Isa`); the slices have equal
        // lengths (checked above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::dots_avx512(x, w) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dots_avx2(x, w) },
        _ => portable_dots(x, w),
    }
}

/// The dot products in plain loops: the twin the vector kernel is tested against.
fn portable_dots<const R: usize, const W: usize>(
    x: &[&[f32]; R],
    w: &[&[f32]; W],
) -> [[f32; W]; R] {
    std::array::from_fn(|r| {
        std::array::from_fn(|c| x[r].iter().zip(w[c]).map(|(a, b)| a * b).sum())
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::ops::vector::Vector;
    use std::arch::x86_64::{__m256, __m512};

    /// The entry point of one instruction set, compiled for it, around the one body.
    macro_rules! entry_point {
        ($name:ident, $vector:ty, $features:literal, $needs:literal) => {
            #[doc = concat!("# Safety\n", $needs, "; every slice has the length of `x[0]`.")]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const R: usize, const W: usize>(
                x: &[&[f32]; R],
                w: &[&[f32]; W],
            ) -> [[f32; W]; R] {
                dots::<$vector, R, W>(x, w)
            }
        };
    }
    entry_point!(dots_avx2, __m256, "avx2,fma", "AVX2 and FMA");
    entry_point!(dots_avx512, __m512, "avx512f,avx2,fma", "AVX-512 F");

    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn dots<V: Vector, const R: usize, const W: usize>(
        x: &[&[f32]; R],
        w: &[&[f32]; W],
    ) -> [[f32; W]; R] {
        let lanes = V::LANES;
        let k = x[0].len();
        let mut acc = [[V::zero(); W]; R];
        let mut wv = [V::zero(); W];
        let mut p = 0;
        // plain loops, not closures: a closure would not inherit the entry point's
        // target features and each intrinsic would become a call
        while p + lanes <= k {
            for c in 0..W {
                wv[c] = V::load(w[c].as_ptr().add(p));
            }
            for r in 0..R {
                let xv = V::load(x[r].as_ptr().add(p));
                for c in 0..W {
                    acc[r][c] = xv.mul_add(wv[c], acc[r][c]);
                }
            }
            p += lanes;
        }
        let mut out = [[0.0f32; W]; R];
        for r in 0..R {
            for c in 0..W {
                let tail: f32 = x[r][p..].iter().zip(&w[c][p..]).map(|(a, b)| a * b).sum();
                out[r][c] = acc[r][c].sum() + tail;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Both kernel shapes, in every form this CPU has, against f64 sums.
    #[test]
    fn every_form_of_the_dots_equals_f64_sums() {
        let mut rng = Rng::new(3);
        for k in [1, 7, 8, 9, 15, 16, 17, 384, 1001] {
            check::<ROWS, WROWS>(&mut rng, k);
            check::<1, WROWS_ONE>(&mut rng, k);
        }
    }

    fn check<const R: usize, const W: usize>(rng: &mut Rng, k: usize) {
        let xs: Vec<Vec<f32>> = (0..R).map(|_| rng.normals(k, 1.0)).collect();
        let ws: Vec<Vec<f32>> = (0..W).map(|_| rng.normals(k, 1.0)).collect();
        let x: [&[f32]; R] = std::array::from_fn(|r| xs[r].as_slice());
        let w: [&[f32]; W] = std::array::from_fn(|c| ws[c].as_slice());
        for isa in Isa::available() {
            let got = dots_on::<R, W>(isa, &x, &w);
            for r in 0..R {
                for c in 0..W {
                    let want: f64 = xs[r]
                        .iter()
                        .zip(&ws[c])
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum();
                    let err = (got[r][c] as f64 - want).abs();
                    assert!(
                        err < 1e-5 * (k as f64).sqrt() * (1.0 + want.abs()),
                        "{isa:?} {R}x{W} k {k} ({r}, {c}): {} vs {want}",
                        got[r][c]
                    );
                }
            }
        }
    }
}
