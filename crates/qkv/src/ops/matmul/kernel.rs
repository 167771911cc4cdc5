//! The micro-kernel: one [`MR`]×[`NR`] tile of C from a packed A micro-panel
//! `[kc][MR]` and a packed B micro-panel `[kc][NR]`, then C ← β·C + α·tile (β is 0 or
//! 1) for the part of the tile inside the matrix.
//!
//! On AVX2 + FMA the 6×16 tile lives in 12 of the 16 vector registers; each step of the
//! k loop loads two vectors of B, broadcasts six values of A and issues 12 fused
//! multiply-adds, which keeps both FMA units busy. The portable form below computes
//! the same tile in plain loops.

use super::blocked::{MR, NR};

/// Where a tile goes: C's element (r, c) of the tile is at `ptr + r·row_stride +
/// c·col_stride`, for r < rows ≤ MR and c < cols ≤ NR.
pub(super) struct Dst {
    pub ptr: *mut f32,
    pub row_stride: usize,
    pub col_stride: usize,
    pub rows: usize,
    pub cols: usize,
    pub alpha: f32,
    /// Add to C (β = 1) rather than overwrite it.
    pub add: bool,
}

/// C tile ← β·C + α·(Σ_p a[p·MR + r] · b[p·NR + c]).
///
/// `next_b`, when given, is the B micro-panel the following tiles will read: the vector
/// kernel asks for one of its cache lines per step, so a panel streamed from memory
/// (a weight packed once, too large for the caches) arrives before it is needed. Only a
/// panel's first tile passes it; the others find the panel in L1.
///
/// # Safety
/// `a` holds kc·MR and `b` kc·NR floats; `dst` points at a tile the caller may write.
pub(super) unsafe fn tile(kc: usize, a: &[f32], b: &[f32], dst: &Dst, next_b: Option<&[f32]>) {
    debug_assert!(a.len() >= kc * MR && b.len() >= kc * NR);
    #[cfg(target_arch = "x86_64")]
    if crate::ops::simd::avx2_fma() {
        let (a, b) = (a.as_ptr(), b.as_ptr());
        let next = next_b.map_or(std::ptr::null(), <[f32]>::as_ptr);
        // a tile of fewer than MR rows (see `pack::row_tiles`) computes only its live
        // rows: a step costs about max(rows, 4) cycles (two FMA units, four cycles of
        // latency)
        match (dst.rows, next_b.is_some()) {
            (1, false) => x86::tile::<false, 1>(kc, a, b, dst, next),
            (1, true) => x86::tile::<true, 1>(kc, a, b, dst, next),
            (2, false) => x86::tile::<false, 2>(kc, a, b, dst, next),
            (2, true) => x86::tile::<true, 2>(kc, a, b, dst, next),
            (3, false) => x86::tile::<false, 3>(kc, a, b, dst, next),
            (3, true) => x86::tile::<true, 3>(kc, a, b, dst, next),
            (4, false) => x86::tile::<false, 4>(kc, a, b, dst, next),
            (4, true) => x86::tile::<true, 4>(kc, a, b, dst, next),
            (5, false) => x86::tile::<false, 5>(kc, a, b, dst, next),
            (5, true) => x86::tile::<true, 5>(kc, a, b, dst, next),
            (_, false) => x86::tile::<false, MR>(kc, a, b, dst, next),
            (_, true) => x86::tile::<true, MR>(kc, a, b, dst, next),
        }
        return;
    }
    portable_tile(kc, a, b, dst);
}

/// The micro-kernel in plain loops.
///
/// # Safety
/// As [`tile`].
pub(super) unsafe fn portable_tile(kc: usize, a: &[f32], b: &[f32], dst: &Dst) {
    let mut acc = [[0.0f32; NR]; MR];
    for p in 0..kc {
        let (ap, bp) = (&a[p * MR..][..MR], &b[p * NR..][..NR]);
        for (row, &x) in acc.iter_mut().zip(ap) {
            for (v, &y) in row.iter_mut().zip(bp) {
                *v += x * y;
            }
        }
    }
    store(&acc, dst);
}

/// Writes the live part of a finished tile.
///
/// # Safety
/// As [`tile`].
unsafe fn store(acc: &[[f32; NR]; MR], dst: &Dst) {
    for (r, row) in acc.iter().enumerate().take(dst.rows) {
        for (c, &v) in row.iter().enumerate().take(dst.cols) {
            let p = dst.ptr.add(r * dst.row_stride + c * dst.col_stride);
            *p = if dst.add {
                *p + dst.alpha * v
            } else {
                dst.alpha * v
            };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{store, Dst, MR, NR};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 and FMA; as [`super::tile`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const PREFETCH: bool, const R: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        dst: &Dst,
        next_b: *const f32,
    ) {
        // C's rows are touched only after the k loop; asking for them now hides
        // their miss (C is megabytes in a training step, out of every cache) behind
        // the loop's arithmetic. A prefetch never faults, even past C's end.
        for r in 0..dst.rows {
            let row = dst.ptr.wrapping_add(r * dst.row_stride) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(NR * 4 - 1));
        }
        // only the first R rows of the A panel are read (R ≥ the tile's live rows, as
        // the dispatch in `super::tile` guarantees); the others' sums would be dropped
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for p in 0..kc {
            if PREFETCH {
                // one 64-byte line of the next panel per step: kc·NR floats in kc steps
                _mm_prefetch::<_MM_HINT_T0>(next_b.wrapping_add(p * NR) as *const i8);
            }
            let b0 = _mm256_loadu_ps(b.add(p * NR));
            let b1 = _mm256_loadu_ps(b.add(p * NR + 8));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*a.add(p * MR + r));
                row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                row[1] = _mm256_fmadd_ps(x, b1, row[1]);
            }
        }
        let alpha = _mm256_set1_ps(dst.alpha);
        if dst.rows == R && dst.cols == NR && dst.col_stride == 1 {
            for (r, row) in acc.iter().enumerate() {
                for (half, v) in row.iter().enumerate() {
                    let p = dst.ptr.add(r * dst.row_stride + half * 8);
                    let out = if dst.add {
                        _mm256_fmadd_ps(alpha, *v, _mm256_loadu_ps(p))
                    } else {
                        _mm256_mul_ps(alpha, *v)
                    };
                    _mm256_storeu_ps(p, out);
                }
            }
            return;
        }
        let mut tmp = [[0.0f32; NR]; MR];
        for (t, row) in tmp.iter_mut().zip(&acc) {
            _mm256_storeu_ps(t.as_mut_ptr(), row[0]);
            _mm256_storeu_ps(t.as_mut_ptr().add(8), row[1]);
        }
        store(&tmp, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// One tile into `c` (MR rows of NR + 3), by the portable kernel (`None`) or the
    /// vector one, with or without a next panel to prefetch (`Some(prefetch)`).
    fn run(
        vector: Option<bool>,
        (kc, a, b): (usize, &[f32], &[f32]),
        c: &mut [f32],
        (rows, cols): (usize, usize),
        add: bool,
    ) {
        let dst = Dst {
            ptr: c.as_mut_ptr(),
            row_stride: NR + 3,
            col_stride: 1,
            rows,
            cols,
            alpha: 0.5,
            add,
        };
        // SAFETY: `c` holds MR rows of NR + 3; the operands hold kc steps.
        unsafe {
            match vector {
                Some(prefetch) => tile(kc, a, b, &dst, prefetch.then_some(b)),
                None => portable_tile(kc, a, b, &dst),
            }
        }
    }

    #[test]
    fn vector_and_portable_tiles_equal_f64_sums_and_keep_outside_elements() {
        let mut rng = Rng::new(7);
        for kc in [1, 5, 64] {
            let a = rng.normals(kc * MR, 1.0);
            let b = rng.normals(kc * NR, 1.0);
            let c0 = rng.normals(MR * (NR + 3), 1.0);
            for (rows, cols) in [
                (MR, NR),
                (5, NR),
                (4, NR),
                (3, 7),
                (2, NR),
                (MR, 9),
                (1, 1),
                (1, NR),
            ] {
                for add in [false, true] {
                    for vector in [None, Some(false), Some(true)] {
                        let mut c = c0.clone();
                        run(vector, (kc, &a, &b), &mut c, (rows, cols), add);
                        for r in 0..MR {
                            for col in 0..NR + 3 {
                                let i = r * (NR + 3) + col;
                                if r >= rows || col >= cols {
                                    assert_eq!(c[i], c0[i], "outside the tile at ({r}, {col})");
                                    continue;
                                }
                                let dot: f64 = (0..kc)
                                    .map(|p| a[p * MR + r] as f64 * b[p * NR + col] as f64)
                                    .sum();
                                let want = 0.5 * dot + if add { c0[i] as f64 } else { 0.0 };
                                assert!(
                                    (c[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                                    "kc {kc} ({r}, {col}): {} vs {want}",
                                    c[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
