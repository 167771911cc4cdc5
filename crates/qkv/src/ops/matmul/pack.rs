//! Copies of the operands' blocks in the order the micro-kernel reads them, so its
//! inner loop walks memory contiguously whatever the operands' strides:
//! - A block (rows × kc) → micro-panels of [`MR`] rows, each `[kc][MR]`;
//! - B block (kc × cols) → micro-panels of [`NR`] columns, each `[kc][NR]`.
//!
//! The last panel's missing rows or columns are zeros, so the kernel always computes a
//! whole tile and the store keeps only the part inside the matrix.
//!
//! The two layouts a linear layer's forward pass gives (A row-major, B = Wᵀ with W's
//! rows contiguous) read each source line along K and write across it, a transpose:
//! on AVX2 whole panels go through 8×8 register transposes; everything else, and the
//! portable build, copies element by element.

use super::tile::{MR, NR};
use super::view::MatRef;

/// Packs rows `r0..r0+rows` × columns `k0..k0+kc` of `a` into `out`, one micro-panel
/// per tile of [`row_tiles`]`(rows)`: the element at (start + r, p) of tile i goes to
/// `i·kc·MR + p·MR + r`, and a tile's rows past its own count are zeros.
pub(super) fn pack_a(a: &MatRef, r0: usize, rows: usize, k0: usize, kc: usize, out: &mut [f32]) {
    let out = &mut out[..rows.div_ceil(MR) * kc * MR];
    for ((start, live), panel) in row_tiles(rows).zip(out.chunks_exact_mut(kc * MR)) {
        let base = (r0 + start) * a.row_stride + k0 * a.col_stride;
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if a.col_stride == 1 && crate::ops::simd::avx2_fma() {
            // SAFETY: AVX2 is present; the `live` rows hold kc values from `base` (the
            // caller's view is inside its slice) and the panel holds kc·MR.
            done = unsafe { x86::rows_to_panel_a(&a.data[base..], a.row_stride, live, kc, panel) };
        }
        if a.row_stride == 1 {
            // column-major A (a transposed view): `live` consecutive values per p
            for (p, dst) in panel.chunks_exact_mut(MR).enumerate().skip(done) {
                copy_line::<MR>(dst, &a.data[base + p * a.col_stride..], live);
            }
        } else {
            let at = |p: usize, r: usize| a.data[base + r * a.row_stride + p * a.col_stride];
            fill_panel::<MR>(&mut panel[done * MR..], done..kc, live, at);
        }
    }
}

/// Cuts `rows` rows into `rows.div_ceil(MR)` tiles of near-equal size, as (first row,
/// rows) pairs: 13 rows make tiles of 5, 4 and 4 rather than 6, 6 and 1. A kernel step
/// costs about max(rows, 4) cycles (two FMA units, four cycles of latency), so 6 + 6 +
/// 1 rows cost 16 cycles a step and 5 + 4 + 4 cost 13.
pub(super) fn row_tiles(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles = rows.div_ceil(MR);
    let (base, extra) = (rows / tiles.max(1), rows % tiles.max(1));
    (0..tiles).map(move |i| (i * base + i.min(extra), base + usize::from(i < extra)))
}

/// Packs rows `k0..k0+kc` × columns `c0..c0+cols` of `b` into `out`:
/// element (p, c) at `(c / NR)·kc·NR + p·NR + c % NR`.
pub(super) fn pack_b(b: &MatRef, k0: usize, kc: usize, c0: usize, cols: usize, out: &mut [f32]) {
    let panels = cols.div_ceil(NR);
    let out = &mut out[..panels * kc * NR];
    for (j, panel) in out.chunks_exact_mut(kc * NR).enumerate() {
        let live = (cols - j * NR).min(NR);
        let base = k0 * b.row_stride + (c0 + j * NR) * b.col_stride;
        if b.col_stride == 1 {
            // row-major B: NR consecutive values per p
            for (p, dst) in panel.chunks_exact_mut(NR).enumerate() {
                copy_line::<NR>(dst, &b.data[base + p * b.row_stride..], live);
            }
            continue;
        }
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if live == NR && b.row_stride == 1 && crate::ops::simd::avx2_fma() {
            // SAFETY: AVX2 is present; the NR columns (W's rows) hold kc values from
            // `base` and the panel holds kc·NR.
            done = unsafe { x86::rows_to_panel_b(&b.data[base..], b.col_stride, kc, panel) };
        }
        let at = |p: usize, c: usize| b.data[base + c * b.col_stride + p * b.row_stride];
        fill_panel::<NR>(&mut panel[done * NR..], done..kc, live, at);
    }
}

/// The element by element copy: line p of `ks` (`ks.start` the first) is
/// `panel[(p − ks.start)·W ..][..W]`, holding `at(p, x)` for its first `live` lanes x and
/// zeros past them.
#[inline(always)]
fn fill_panel<const W: usize>(
    panel: &mut [f32],
    ks: std::ops::Range<usize>,
    live: usize,
    at: impl Fn(usize, usize) -> f32,
) {
    for (p, line) in ks.zip(panel.chunks_exact_mut(W)) {
        for (x, v) in line.iter_mut().enumerate() {
            *v = if x < live { at(p, x) } else { 0.0 };
        }
    }
}

/// dst ← the first `live` values of `src`, then zeros. A whole line is copied at a
/// length known when compiling (MR or NR floats: a few vector moves); a copy of a
/// length known only at run time is a call to `memcpy`, which cost more than the
/// copy itself on these short lines (5% of a training step).
#[inline(always)]
fn copy_line<const N: usize>(dst: &mut [f32], src: &[f32], live: usize) {
    let dst: &mut [f32; N] = dst.try_into().expect("a panel line holds N values");
    if live == N {
        dst.copy_from_slice(&src[..N]);
    } else {
        dst[..live].copy_from_slice(&src[..live]);
        dst[live..].fill(0.0);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// Transposes the 8×8 block whose row i is `v[i]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn transpose8(v: &mut [__m256; 8]) {
        let t0 = _mm256_unpacklo_ps(v[0], v[1]);
        let t1 = _mm256_unpackhi_ps(v[0], v[1]);
        let t2 = _mm256_unpacklo_ps(v[2], v[3]);
        let t3 = _mm256_unpackhi_ps(v[2], v[3]);
        let t4 = _mm256_unpacklo_ps(v[4], v[5]);
        let t5 = _mm256_unpackhi_ps(v[4], v[5]);
        let t6 = _mm256_unpacklo_ps(v[6], v[7]);
        let t7 = _mm256_unpackhi_ps(v[6], v[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        v[0] = _mm256_permute2f128_ps::<0x20>(s0, s4);
        v[1] = _mm256_permute2f128_ps::<0x20>(s1, s5);
        v[2] = _mm256_permute2f128_ps::<0x20>(s2, s6);
        v[3] = _mm256_permute2f128_ps::<0x20>(s3, s7);
        v[4] = _mm256_permute2f128_ps::<0x31>(s0, s4);
        v[5] = _mm256_permute2f128_ps::<0x31>(s1, s5);
        v[6] = _mm256_permute2f128_ps::<0x31>(s2, s6);
        v[7] = _mm256_permute2f128_ps::<0x31>(s3, s7);
    }

    /// Packs the first steps of an A panel from `live` ≤ MR rows that start `stride`
    /// apart in `src`, each contiguous along K: panel[p·MR + r] = src[r·stride + p],
    /// and zeros for r ≥ live. Each
    /// 8-step block is transposed in registers and written as 8 vectors of 8 at a step
    /// of MR, each spilling 2 floats into the next step's slot, which the next store
    /// overwrites; so the last block stops short of the panel's end. Returns how many
    /// steps were packed (the caller does the rest).
    ///
    /// # Safety
    /// AVX2; 1 ≤ live ≤ MR; row live−1 ends at `(live−1)·stride + kc ≤ src.len()`;
    /// `panel` holds kc·MR.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn rows_to_panel_a(
        src: &[f32],
        stride: usize,
        live: usize,
        kc: usize,
        panel: &mut [f32],
    ) -> usize {
        debug_assert!((1..=MR).contains(&live));
        debug_assert!((live - 1) * stride + kc <= src.len() && panel.len() >= kc * MR);
        let mut p = 0;
        while p + 8 < kc {
            let mut v = [_mm256_setzero_ps(); 8];
            for (r, row) in v.iter_mut().enumerate().take(live) {
                *row = _mm256_loadu_ps(src.as_ptr().add(r * stride + p));
            }
            transpose8(&mut v);
            for (i, col) in v.iter().enumerate() {
                _mm256_storeu_ps(panel.as_mut_ptr().add((p + i) * MR), *col);
            }
            p += 8;
        }
        p
    }

    /// Packs the first steps of a full B panel from NR columns stored as rows `stride`
    /// apart in `src`, each contiguous along K: panel[p·NR + c] = src[c·stride + p].
    /// Returns how many steps were packed (a multiple of 8).
    ///
    /// # Safety
    /// AVX2; row NR−1 ends at `(NR−1)·stride + kc ≤ src.len()`; `panel` holds kc·NR.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn rows_to_panel_b(
        src: &[f32],
        stride: usize,
        kc: usize,
        panel: &mut [f32],
    ) -> usize {
        debug_assert!((NR - 1) * stride + kc <= src.len() && panel.len() >= kc * NR);
        let mut p = 0;
        while p + 8 <= kc {
            for half in 0..NR / 8 {
                let mut v = [_mm256_setzero_ps(); 8];
                for (c, row) in v.iter_mut().enumerate() {
                    *row = _mm256_loadu_ps(src.as_ptr().add((half * 8 + c) * stride + p));
                }
                transpose8(&mut v);
                for (i, col) in v.iter().enumerate() {
                    _mm256_storeu_ps(panel.as_mut_ptr().add((p + i) * NR + half * 8), *col);
                }
            }
            p += 8;
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the logical element (r, c) of a test matrix.
    type At<'a> = Box<dyn Fn(usize, usize) -> f32 + 'a>;

    /// `rows × cols` distinct values, stored row-major or (as a transposed view)
    /// column-major; `at(r, c)` reads the logical element.
    fn both_layouts(rows: usize, cols: usize, data: &[f32]) -> [(MatRef<'_>, At<'_>); 2] {
        [
            (
                MatRef::row_major(data, rows, cols),
                Box::new(move |r, c| data[r * cols + c]),
            ),
            (
                MatRef::row_major(data, cols, rows).t(),
                Box::new(move |r, c| data[c * rows + r]),
            ),
        ]
    }

    /// Both packers hold each element of their block once, in the order the
    /// micro-kernel reads it, and zeros past its edge: A for three tiles of fewer than
    /// MR rows, B for a last panel of fewer than NR columns; kc long enough for the
    /// vector path and a tail.
    #[test]
    fn packed_blocks_hold_each_element_once_and_zeros_past_the_edge() {
        let (m, k, n) = (16, 40, 41);
        let a_data: Vec<f32> = (0..m * k).map(|i| i as f32 + 1.0).collect();
        let b_data: Vec<f32> = (0..k * n).map(|i| i as f32 + 1.0).collect();
        let (r0, rows, a_k0, kc) = (1, 14, 2, 29);
        let (b_k0, c0, cols) = (1, 2, 38);
        let tiles: Vec<_> = row_tiles(rows).collect();
        assert_eq!(tiles, [(0, 5), (5, 5), (10, 4)]);
        let layouts = both_layouts(m, k, &a_data)
            .into_iter()
            .zip(both_layouts(k, n, &b_data));
        for ((a, a_at), (b, b_at)) in layouts {
            let mut packed_a = vec![f32::NAN; 3 * kc * MR];
            pack_a(&a, r0, rows, a_k0, kc, &mut packed_a);
            let mut packed_b = vec![f32::NAN; 3 * kc * NR];
            pack_b(&b, b_k0, kc, c0, cols, &mut packed_b);
            for p in 0..kc {
                for (i, &(start, live)) in tiles.iter().enumerate() {
                    for r in 0..MR {
                        let want = if r < live {
                            a_at(r0 + start + r, a_k0 + p)
                        } else {
                            0.0
                        };
                        let got = packed_a[i * kc * MR + p * MR + r];
                        assert_eq!(got, want, "A tile {i} ({r}, {p})");
                    }
                }
                for c in 0..3 * NR {
                    let want = if c < cols {
                        b_at(b_k0 + p, c0 + c)
                    } else {
                        0.0
                    };
                    let got = packed_b[(c / NR) * kc * NR + p * NR + c % NR];
                    assert_eq!(got, want, "B ({p}, {c})");
                }
            }
        }
    }
}
