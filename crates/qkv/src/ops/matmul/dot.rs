//! The few-rows path: C `[M,N]` ← β·C + α·A·Wᵀ for M ≤ a handful, with A's rows and
//! W's rows (B's columns) contiguous. Each group of 4 weight rows is read from memory
//! once and dotted with every row of A (3 at a time, 12 dot products in 12 vector
//! registers), so a decode step or a short sentence reads each weight exactly once, at
//! memory speed, with nothing packed. Threads split the weight rows.
//!
//! A kernel call dots R ≤ 4 rows of A with 3 weight rows: 12 accumulators, 3 weight
//! vectors and one row vector fill the 16 AVX2 registers exactly (4 × 4 would spill).

use super::{MatMut, MatRef};
use crate::ops::disjoint::Disjoint;
use rayon::prelude::*;

/// Most rows of A per kernel call.
const ROWS: usize = 4;
/// Weight rows per kernel call.
const WROWS: usize = 3;

/// As [`super::blocked::product`], for `a.col_stride == 1 && b.row_stride == 1`.
pub(super) fn product(
    c: MatMut<'_>,
    a: MatRef<'_>,
    b: MatRef<'_>,
    alpha: f32,
    add: bool,
    parallel: bool,
) {
    let (m, n, k) = (c.rows, c.cols, a.cols);
    let (rs, cs) = (c.row_stride, c.col_stride);
    let out = Disjoint::new(c.data);
    let chunk = if parallel {
        n.div_ceil(4 * rayon::current_num_threads())
            .next_multiple_of(WROWS)
    } else {
        n
    };
    let run = |j0: usize| {
        let j1 = n.min(j0 + chunk);
        for j in (j0..j1).step_by(WROWS) {
            let w_live = (j1 - j).min(WROWS);
            // missing rows repeat the last live one; their sums are dropped
            let w: [&[f32]; WROWS] =
                std::array::from_fn(|c| &b.data[(j + c.min(w_live - 1)) * b.col_stride..][..k]);
            for i in (0..m).step_by(ROWS) {
                let a_live = (m - i).min(ROWS);
                let row = |r: usize| &a.data[(i + r) * a.row_stride..][..k];
                let sums = match a_live {
                    1 => widen(dots::<1>(&[row(0)], &w)),
                    2 => widen(dots::<2>(&[row(0), row(1)], &w)),
                    3 => widen(dots::<3>(&[row(0), row(1), row(2)], &w)),
                    _ => dots::<ROWS>(&[row(0), row(1), row(2), row(3)], &w),
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
        (0..n).into_par_iter().step_by(chunk).for_each(run);
    } else {
        run(0);
    }
}

/// Sums of the first R rows, in a ROWS-row array (the rest zero).
fn widen<const R: usize>(sums: [[f32; WROWS]; R]) -> [[f32; WROWS]; ROWS] {
    std::array::from_fn(|r| if r < R { sums[r] } else { [0.0; WROWS] })
}

/// The R × WROWS dot products x[r]·w[c] (all slices of one length).
fn dots<const R: usize>(x: &[&[f32]; R], w: &[&[f32]; WROWS]) -> [[f32; WROWS]; R] {
    #[cfg(target_arch = "x86_64")]
    if crate::ops::simd::avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA; the slices have equal lengths.
        return unsafe { x86::dots(x, w) };
    }
    portable_dots(x, w)
}

/// The dot products in plain loops: the twin the vector kernel is tested against.
fn portable_dots<const R: usize>(x: &[&[f32]; R], w: &[&[f32]; WROWS]) -> [[f32; WROWS]; R] {
    std::array::from_fn(|r| {
        std::array::from_fn(|c| x[r].iter().zip(w[c]).map(|(a, b)| a * b).sum())
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::WROWS;
    use crate::ops::simd::x86::hsum;
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 and FMA; every slice has the length of `x[0]`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn dots<const R: usize>(
        x: &[&[f32]; R],
        w: &[&[f32]; WROWS],
    ) -> [[f32; WROWS]; R] {
        let k = x[0].len();
        let mut acc = [[_mm256_setzero_ps(); WROWS]; R];
        let mut wv = [_mm256_setzero_ps(); WROWS];
        let mut p = 0;
        // plain loops, not closures: a closure would not inherit this function's
        // target features and each intrinsic would become a call
        while p + 8 <= k {
            for c in 0..WROWS {
                wv[c] = _mm256_loadu_ps(w[c].as_ptr().add(p));
            }
            for r in 0..R {
                let xv = _mm256_loadu_ps(x[r].as_ptr().add(p));
                for c in 0..WROWS {
                    acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
                }
            }
            p += 8;
        }
        let mut out = [[0.0f32; WROWS]; R];
        for r in 0..R {
            for c in 0..WROWS {
                let tail: f32 = x[r][p..].iter().zip(&w[c][p..]).map(|(a, b)| a * b).sum();
                out[r][c] = hsum(acc[r][c]) + tail;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn vector_and_portable_dots_equal_f64_sums() {
        let mut rng = Rng::new(3);
        for k in [1, 7, 8, 9, 384, 1001] {
            let xs: Vec<Vec<f32>> = (0..ROWS).map(|_| rng.normals(k, 1.0)).collect();
            let ws: Vec<Vec<f32>> = (0..WROWS).map(|_| rng.normals(k, 1.0)).collect();
            let x: [&[f32]; ROWS] = std::array::from_fn(|r| xs[r].as_slice());
            let w: [&[f32]; WROWS] = std::array::from_fn(|c| ws[c].as_slice());
            for got in [dots::<ROWS>(&x, &w), portable_dots::<ROWS>(&x, &w)] {
                for r in 0..ROWS {
                    for c in 0..WROWS {
                        let want: f64 = xs[r]
                            .iter()
                            .zip(&ws[c])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        let err = (got[r][c] as f64 - want).abs();
                        assert!(
                            err < 1e-5 * (k as f64).sqrt() * (1.0 + want.abs()),
                            "k {k} ({r}, {c}): {} vs {want}",
                            got[r][c]
                        );
                    }
                }
            }
        }
    }
}
