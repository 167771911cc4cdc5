//! The micro-kernel: one tile of C, [`MR`] rows × one or two [`NR`]-column panels, from
//! a packed A micro-panel `[kc][MR]` and consecutive packed B micro-panels `[kc][NR]`,
//! then C ← β·C + α·tile (β is 0 or 1) for the part of the tile inside the matrix.
//!
//! One vector body, generic over [`Vector`], runs on both instruction sets. On AVX2 +
//! FMA a tile is 6 rows × one panel (two 8-lane vectors): 12 of the 16 registers hold
//! it, and each step of the k loop loads two vectors of B, broadcasts six values of A
//! and issues 12 fused multiply-adds, which keeps both FMA units busy. On AVX-512 a tile
//! is 6 rows × two panels (two 16-lane vectors), the same 12 sums at twice the width.
//! The portable form below computes the same tile in plain loops.

use super::tile::{panels_per_tile_on, MAX_PANELS, MR, NR};
use crate::ops::isa::Isa;
use crate::ops::vector::Vector;

/// Where a tile goes: C's element (r, c) of the tile is at `ptr + r·row_stride +
/// c·col_stride`, for r < rows ≤ MR and c < cols ≤ panels·NR.
pub(super) struct Dst {
    pub ptr: *mut f32,
    pub row_stride: usize,
    pub col_stride: usize,
    pub rows: usize,
    pub cols: usize,
    pub alpha: f32,
    /// Add to C (β = 1) rather than overwrite it.
    pub add: bool,
    /// Where the next tile's C starts (its rows `row_stride` apart), to ask for while
    /// this one computes; null for none.
    pub next: *const f32,
}

/// C tile ← β·C + α·(Σ_p a[p·MR + r] · b[(c / NR)·kc·NR + p·NR + c % NR]), over
/// `b.len() / (kc·NR)` panels (at most [`panels_per_tile`]).
///
/// `next_b`, when given, is the B micro-panel the following tiles will read: the vector
/// kernel asks for one of its cache lines per step, so a panel streamed from memory
/// (a weight packed once, too large for the caches) arrives before it is needed. Only a
/// panel's first tile passes it; the others find the panel in L1.
///
/// # Safety
/// `a` holds kc·MR and `b` a whole number of panels of kc·NR floats; `dst` points at a
/// tile the caller may write.
pub(super) unsafe fn tile(kc: usize, a: &[f32], b: &[f32], dst: &Dst, next_b: Option<&[f32]>) {
    tile_on(Isa::detect(), kc, a, b, dst, next_b);
}

/// [`tile`] in a given form (one this CPU has).
///
/// # Safety
/// As [`tile`].
unsafe fn tile_on(isa: Isa, kc: usize, a: &[f32], b: &[f32], dst: &Dst, next_b: Option<&[f32]>) {
    let panels = if kc == 0 { 1 } else { b.len() / (kc * NR) };
    debug_assert!(a.len() >= kc * MR && panels <= panels_per_tile_on(isa));
    debug_assert!(dst.rows <= MR && dst.cols <= panels * NR);
    let next = next_b.map_or(std::ptr::null(), <[f32]>::as_ptr);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::tile_avx512(kc, a.as_ptr(), b.as_ptr(), panels, dst, next),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::tile_avx2(kc, a.as_ptr(), b.as_ptr(), dst, next),
        _ => portable_tile(kc, a, b, dst),
    }
}

/// The micro-kernel in plain loops.
///
/// # Safety
/// As [`tile`].
pub(super) unsafe fn portable_tile(kc: usize, a: &[f32], b: &[f32], dst: &Dst) {
    let mut acc = [[0.0f32; MAX_PANELS * NR]; MR];
    for p in 0..kc {
        for (r, row) in acc.iter_mut().enumerate() {
            let x = a[p * MR + r];
            for (c, v) in row.iter_mut().enumerate().take(dst.cols) {
                *v += x * b[(c / NR) * kc * NR + p * NR + c % NR];
            }
        }
    }
    store(&acc, dst);
}

/// Writes the live part of a finished tile.
///
/// # Safety
/// As [`tile`].
unsafe fn store<const W: usize>(acc: &[[f32; W]; MR], dst: &Dst) {
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
    use super::{store, Dst, Vector, MAX_PANELS, MR, NR};
    use std::arch::x86_64::{__m256, __m512, _mm_prefetch, _MM_HINT_T0};

    /// # Safety
    /// AVX2 and FMA; as [`super::tile`], with one panel.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(
        kc: usize,
        a: *const f32,
        b: *const f32,
        dst: &Dst,
        next_b: *const f32,
    ) {
        by_rows::<__m256, 2>(kc, a, b, dst, next_b);
    }

    /// # Safety
    /// AVX-512 F; as [`super::tile`], with one or two panels.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn tile_avx512(
        kc: usize,
        a: *const f32,
        b: *const f32,
        panels: usize,
        dst: &Dst,
        next_b: *const f32,
    ) {
        if panels == 2 {
            by_rows::<__m512, 2>(kc, a, b, dst, next_b);
        } else {
            by_rows::<__m512, 1>(kc, a, b, dst, next_b);
        }
    }

    /// A tile of fewer than MR rows (see `pack::row_tiles`) computes only its live rows:
    /// a step costs about max(rows, 4) cycles (two FMA units, four cycles of latency).
    #[inline(always)]
    unsafe fn by_rows<V: Vector, const NV: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        dst: &Dst,
        next: *const f32,
    ) {
        match (dst.rows, !next.is_null()) {
            (1, false) => tile::<V, false, 1, NV>(kc, a, b, dst, next),
            (1, true) => tile::<V, true, 1, NV>(kc, a, b, dst, next),
            (2, false) => tile::<V, false, 2, NV>(kc, a, b, dst, next),
            (2, true) => tile::<V, true, 2, NV>(kc, a, b, dst, next),
            (3, false) => tile::<V, false, 3, NV>(kc, a, b, dst, next),
            (3, true) => tile::<V, true, 3, NV>(kc, a, b, dst, next),
            (4, false) => tile::<V, false, 4, NV>(kc, a, b, dst, next),
            (4, true) => tile::<V, true, 4, NV>(kc, a, b, dst, next),
            (5, false) => tile::<V, false, 5, NV>(kc, a, b, dst, next),
            (5, true) => tile::<V, true, 5, NV>(kc, a, b, dst, next),
            (_, false) => tile::<V, false, MR, NV>(kc, a, b, dst, next),
            (_, true) => tile::<V, true, MR, NV>(kc, a, b, dst, next),
        }
    }

    /// One step p of the k loop: R × NV fused multiply-adds.
    #[inline(always)]
    unsafe fn k_step<V: Vector, const PREFETCH: bool, const R: usize, const NV: usize>(
        p: usize,
        a: *const f32,
        starts: &[*const f32; NV],
        next_b: *const f32,
        acc: &mut [[V; NV]; R],
    ) {
        if PREFETCH {
            // one 64-byte line of the next panel per step: kc·NR floats in kc steps
            _mm_prefetch::<_MM_HINT_T0>(next_b.wrapping_add(p * NR) as *const i8);
        }
        let mut bv = [V::zero(); NV];
        for (v, s) in bv.iter_mut().zip(starts) {
            *v = V::load(s.add(p * NR));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let x = V::splat_from(a.add(p * MR + r));
            for (c, bb) in row.iter_mut().zip(&bv) {
                *c = x.mul_add(*bb, *c);
            }
        }
    }

    /// R rows × NV vectors of columns; vector u of step p is in panel u·L / NR.
    #[inline(always)]
    unsafe fn tile<V: Vector, const PREFETCH: bool, const R: usize, const NV: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        dst: &Dst,
        next_b: *const f32,
    ) {
        let lanes = V::LANES;
        // C's rows are touched only after the k loop; asking for them now hides
        // their miss (C is megabytes in a training step, out of every cache) behind
        // the loop's arithmetic. A prefetch never faults, even past C's end.
        for r in 0..dst.rows {
            let row = dst.ptr.wrapping_add(r * dst.row_stride) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(NV * lanes * 4 - 1));
        }
        // and the next tile's, so that its misses overlap this tile's whole k loop
        if !dst.next.is_null() {
            for r in 0..MR {
                let row = dst.next.wrapping_add(r * dst.row_stride) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(row);
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(NV * lanes * 4 - 1));
            }
        }
        let mut starts = [b; NV];
        for (u, s) in starts.iter_mut().enumerate() {
            *s = b.add((u * lanes / NR) * kc * NR + (u * lanes) % NR);
        }
        // only the first R rows of the A panel are read (R ≥ the tile's live rows, as
        // `by_rows` guarantees); the others' sums would be dropped
        let mut acc = [[V::zero(); NV]; R];
        // two steps an iteration, which halves the loop's own counting and branching:
        // an in-cache AVX-512 tile (one thread, 6 × 32, kc 256) went from 216 to 230
        // GFLOP/s, 95% of the FMA peak
        let mut p = 0;
        while p + 2 <= kc {
            k_step::<V, PREFETCH, R, NV>(p, a, &starts, next_b, &mut acc);
            k_step::<V, PREFETCH, R, NV>(p + 1, a, &starts, next_b, &mut acc);
            p += 2;
        }
        if p < kc {
            k_step::<V, PREFETCH, R, NV>(p, a, &starts, next_b, &mut acc);
        }
        let alpha = V::splat(dst.alpha);
        if dst.rows == R && dst.cols == NV * lanes && dst.col_stride == 1 {
            for (r, row) in acc.iter().enumerate() {
                for (u, v) in row.iter().enumerate() {
                    let p = dst.ptr.add(r * dst.row_stride + u * lanes);
                    let out = if dst.add {
                        alpha.mul_add(*v, V::load(p))
                    } else {
                        alpha.times(*v)
                    };
                    out.store(p);
                }
            }
            return;
        }
        let mut tmp = [[0.0f32; MAX_PANELS * NR]; MR];
        for (t, row) in tmp.iter_mut().zip(&acc) {
            for (u, v) in row.iter().enumerate() {
                v.store(t.as_mut_ptr().add(u * lanes));
            }
        }
        store(&tmp, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Every form this CPU has, with one and (where the form takes them) two panels,
    /// with and without a panel to prefetch, overwriting and adding, on whole and cut
    /// tiles: against sums in f64, and C's elements outside the tile untouched.
    #[test]
    fn every_form_of_the_tile_equals_f64_sums_and_keeps_outside_elements() {
        let mut rng = Rng::new(7);
        for isa in Isa::available() {
            for panels in 1..=panels_per_tile_on(isa) {
                let width = panels * NR;
                let stride = width + 3;
                for kc in [1, 5, 64] {
                    let a = rng.normals(kc * MR, 1.0);
                    let b = rng.normals(kc * width, 1.0);
                    let c0 = rng.normals(MR * stride, 1.0);
                    let cuts = [
                        (MR, width),
                        (5, width),
                        (4, width),
                        (3, 7),
                        (2, width),
                        (MR, 9),
                        (MR, width - 5),
                        (1, 1),
                        (1, width),
                    ];
                    for (rows, cols) in cuts {
                        for add in [false, true] {
                            for prefetch in [false, true] {
                                let mut c = c0.clone();
                                let dst = Dst {
                                    ptr: c.as_mut_ptr(),
                                    row_stride: stride,
                                    col_stride: 1,
                                    rows,
                                    cols,
                                    alpha: 0.5,
                                    add,
                                    next: std::ptr::null(),
                                };
                                // SAFETY: `c` holds MR rows of `stride`; the operands
                                // hold kc steps of `panels` panels; `isa` is available.
                                unsafe { tile_on(isa, kc, &a, &b, &dst, prefetch.then_some(&b)) };
                                for r in 0..MR {
                                    for col in 0..stride {
                                        let i = r * stride + col;
                                        let at =
                                            format!("{isa:?} {panels} panels kc {kc} ({r}, {col})");
                                        if r >= rows || col >= cols {
                                            assert_eq!(c[i], c0[i], "outside the tile at {at}");
                                            continue;
                                        }
                                        let dot: f64 = (0..kc)
                                            .map(|p| {
                                                let bv =
                                                    b[(col / NR) * kc * NR + p * NR + col % NR];
                                                a[p * MR + r] as f64 * bv as f64
                                            })
                                            .sum();
                                        let want = 0.5 * dot + if add { c0[i] as f64 } else { 0.0 };
                                        assert!(
                                            (c[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                                            "{at}: {} vs {want}",
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
    }
}
