//! The many-rows int8 product on AMX ([`crate::weights::amx`]) for a weight with one scale
//! per row: y `[M, N]` ← start + deq(q(x))·deq(W)ᵀ by `tdpbsud`, 16 × 16 × 64
//! multiply-adds an instruction, each sum exact in i32 over the whole of K.
//!
//! The weight's panels are already the right operand's tiles: at quad t0, a panel's 16
//! quad rows of 64 bytes lie one after another ([`super::weight`]), unsigned (q + 128)
//! as `tdpbsud` wants its right side. The last group of fewer than 16 quads is copied
//! into a zeroed tile per task. x's codes (signed) are copied once into rows padded to
//! whole tiles. A task takes a block of two panels and runs every pair of row tiles
//! over it into four 16×16 tiles of i32 sums, then scales them as the VNNI kernel does
//! (the bias of 128 taken off with the row's offset, then one multiply-add by the two
//! scales), so both give the same bits.
//!
//! A weight with a scale per 32 steps (Q8_0's blocks) is not taken: a tile row spans
//! 64 steps, two blocks with their own scales, whose sums the unit cannot keep apart.

use super::rows::QuantizedRows;
use super::weight::{Int8Weight, PANEL};
use crate::ops::disjoint::Disjoint;
use crate::ops::for_each_task;
use crate::weights::amx::{self, Block, Dot, PanelTiles, Tiles};
use crate::weights::stored::Start;
use rayon::prelude::*;

/// K steps (bytes) in a tile's row.
const TILE_K: usize = Tiles::ROW_BYTES;
/// Rows in a tile.
const TILE_ROWS: usize = Tiles::ROWS;

/// Whether this process can take this form for `w`: AMX-INT8, and one scale a row.
pub(super) fn available(w: &Int8Weight) -> bool {
    amx::int8() && w.groups() == 1
}

/// y `[rows, N]` ← start + deq(xq)·deq(W)ᵀ, row-major. Only where [`available`] says
/// yes for `w`.
pub(super) fn product(
    y: &mut [f32],
    xq: &QuantizedRows,
    rows: usize,
    w: &Int8Weight,
    start: Start,
    parallel: bool,
) {
    assert!(available(w), "tdpbsud needs AMX-INT8 and one scale a row");
    let n = w.n();
    assert!(y.len() == rows * n && xq.width == 4 * w.quads());
    let stride = xq.width.next_multiple_of(TILE_K);
    let row_tiles = rows.div_ceil(TILE_ROWS);
    let left = left_tiles(xq, rows, stride, row_tiles * TILE_ROWS, parallel);
    let k_tiles = stride / TILE_K;
    let out = Disjoint::new(y);
    let run = |block: usize| {
        let j = 2 * block;
        let live = (w.panels() - j).min(2);
        let cols = (n - j * PANEL).min(live * PANEL);
        let right = PanelTiles::new(std::array::from_fn(|c| w.panel_codes(j + c.min(live - 1))));
        let scales: [&[f32]; 2] = std::array::from_fn(|c| w.panel_scales(j + c.min(live - 1)));
        let mut sums = [[[0i32; TILE_ROWS * PANEL]; 2]; 2];
        // SAFETY: available() said this process has AMX-INT8.
        let _tiles = unsafe { Tiles::configure() };
        for rt in (0..row_tiles).step_by(2) {
            let places = std::array::from_fn(|t| {
                std::array::from_fn(|c| (sums[t][c].as_mut_ptr().cast(), 4 * PANEL))
            });
            let block = Block {
                left: left[rt * TILE_ROWS * stride..].as_ptr().cast(),
                left_stride: stride,
                both: rt + 1 < row_tiles,
                k_tiles,
                right: &right,
                places,
                accumulate: false,
            };
            // SAFETY: the tiles are configured; `left` holds 16 (32 when `both`) rows of
            // `stride` bytes, each right tile 16 rows of 64 bytes, and each place is one
            // of this task's sum tiles.
            unsafe { amx::block(Dot::Int8, &block) };
            let r0 = rt * TILE_ROWS;
            let live_rows = (rows - r0).min(2 * TILE_ROWS);
            let epilogue = Epilogue {
                sums: &sums,
                x_scales: &xq.scales[r0..][..live_rows],
                offsets: &xq.offsets[r0..][..live_rows],
                scales,
                start: match start {
                    Start::Bias(b) => Start::Bias(&b[j * PANEL..][..cols]),
                    other => other,
                },
            };
            epilogue.write(&out, (r0 * n + j * PANEL, n), cols);
        }
    };
    let blocks = w.panels().div_ceil(2);
    if parallel {
        for_each_task(blocks, run);
    } else {
        (0..blocks).for_each(run);
    }
}

/// A block's i32 sums on their way into y. (x has one scale a row: its scales and
/// offsets are `[rows]`.)
struct Epilogue<'a> {
    sums: &'a [[SumTile; 2]; 2],
    /// The block's live rows' scales and offsets (128 · Σ the row's codes: what the
    /// weight's bias of 128 added to every sum).
    x_scales: &'a [f32],
    offsets: &'a [i32],
    /// The two panels' weight scales, one a column.
    scales: [&'a [f32]; 2],
    /// A bias is the block's columns of it.
    start: Start<'a>,
}

impl Epilogue<'_> {
    /// Writes the block's live rows into y: row r's `cols` (≤ 32) values at
    /// `first + r·stride`, each ← start + (sum − offset)·(d_w·d_x), the VNNI kernel's
    /// operations in its order ([`super::kernel`]), 16 columns a vector.
    fn write(&self, out: &Disjoint, (first, stride): (usize, usize), cols: usize) {
        let rows = self.x_scales.len();
        assert!(cols <= 2 * PANEL && rows <= 2 * TILE_ROWS && self.offsets.len() == rows);
        if let Start::Bias(b) = self.start {
            assert_eq!(b.len(), cols);
        }
        for r in 0..rows {
            // SAFETY: the block's columns belong to this task alone.
            let dst = unsafe { out.range(first + r * stride, cols) };
            // SAFETY: AMX-INT8 CPUs have AVX-512 F; the lengths were checked above.
            unsafe { x86::row(self, r, dst) }
        }
    }
}

/// One 16×16 tile of i32 sums.
type SumTile = [i32; TILE_ROWS * PANEL];

mod x86 {
    use super::{Epilogue, Start, PANEL, TILE_ROWS};
    use std::arch::x86_64::*;

    /// Row r of [`Epilogue::write`].
    ///
    /// # Safety
    /// AVX-512 F; `dst` at most 32 long, a bias as long as it, r a live row.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row(e: &Epilogue<'_>, r: usize, dst: &mut [f32]) {
        let offset = _mm512_set1_epi32(*e.offsets.get_unchecked(r));
        let x_scale = _mm512_set1_ps(*e.x_scales.get_unchecked(r));
        let tiles = &e.sums[r / TILE_ROWS];
        for (c, (tile, scales)) in tiles.iter().zip(e.scales).enumerate() {
            let c0 = c * PANEL;
            if c0 >= dst.len() {
                break;
            }
            let mask = (u32::MAX >> (32 - (dst.len() - c0).min(PANEL))) as __mmask16;
            let sums = _mm512_loadu_si512(tile.as_ptr().add((r % TILE_ROWS) * PANEL).cast());
            let exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, offset));
            let scale = _mm512_mul_ps(_mm512_loadu_ps(scales.as_ptr()), x_scale);
            let total = _mm512_fmadd_ps(exact, scale, _mm512_setzero_ps());
            let at = dst.as_mut_ptr().add(c0);
            let value = match e.start {
                Start::Bias(b) => {
                    _mm512_add_ps(total, _mm512_maskz_loadu_ps(mask, b.as_ptr().add(c0)))
                }
                Start::Accumulate => _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), total),
                Start::Zero => total,
            };
            _mm512_mask_storeu_ps(at, mask, value);
        }
    }
}

/// x's codes `[rows, width]` copied into `[rows_out, stride]` bytes (rows_out ≥ rows,
/// stride ≥ width), zero beyond them: whole tiles for the left operand.
fn left_tiles(
    xq: &QuantizedRows,
    rows: usize,
    stride: usize,
    rows_out: usize,
    parallel: bool,
) -> Vec<i8> {
    let mut out = vec![0i8; rows_out * stride];
    let copy = |(r, dst): (usize, &mut [i8])| {
        if r < rows {
            dst[..xq.width].copy_from_slice(xq.row(r).codes);
        }
    };
    if parallel && rows >= 64 {
        out.par_chunks_mut(stride).enumerate().for_each(copy);
    } else {
        out.chunks_mut(stride).enumerate().for_each(copy);
    }
    out
}
