//! The many-rows product on AMX ([`crate::weights::amx`]): y `[M, N]` (+)= bf16(x)·Wᵀ by
//! `tdpbf16ps`, 16 × 16 × 32 multiply-adds an instruction, each pair of products summed
//! into f32.
//!
//! The weight's panels are already the right operand's tiles: at pair p0, a panel's 16
//! pair rows of 64 bytes lie one after another ([`super::weight`]), which is a tile of
//! K = 32 steps × 16 columns in the pair order `tdpbf16ps` wants. The last group of fewer
//! than 16 pairs (K not a multiple of 32) is copied into a zeroed tile per task.
//!
//! x is rounded once into a tile-ready copy: `[⌈M/16⌉·16, ⌈K/32⌉·16]` pair words, zero
//! beyond x's rows and K. A task takes a block of two panels (32 columns of y) and runs
//! every pair of row tiles over it: four 16×16 sums in tiles 0–3, the row tiles in 4–5,
//! the panels' tiles in 6–7.

use super::convert::round_pairs;
use super::job::Job;
use super::weight::PANEL;
use crate::ops::disjoint::Disjoint;
use crate::ops::for_each_task;
use crate::weights::amx::{self, Block, Dot, PanelTiles, Tiles};
use rayon::prelude::*;

/// Pairs in a tile's row (64 bytes).
const TILE_PAIRS: usize = Tiles::ROW_BYTES / 4;
/// Rows in a tile.
const TILE_ROWS: usize = Tiles::ROWS;

/// Whether this process can take this form.
pub(super) fn available() -> bool {
    amx::bf16()
}

/// y `[rows, N]` ← (accumulate ? y : 0) + bf16(x)`[rows, K]`·Wᵀ, all row-major. Only
/// where [`available`] says yes.
pub(super) fn product(job: Job<'_>, parallel: bool) {
    let Job {
        y,
        x,
        rows,
        w,
        accumulate,
    } = job;
    assert!(available(), "tdpbf16ps needs AMX-BF16");
    let (n, k, pairs) = (w.n(), w.k(), w.pairs());
    assert!(x.len() == rows * k && y.len() == rows * n);
    let stride = pairs.next_multiple_of(TILE_PAIRS);
    let row_tiles = rows.div_ceil(TILE_ROWS);
    let xt = x_tiles(x, k, stride, row_tiles * TILE_ROWS, parallel);
    let k_tiles = stride / TILE_PAIRS;
    let out = Disjoint::new(y);
    let blocks = w.panels().div_ceil(2);
    let run = |block: usize| {
        let j = 2 * block;
        let live = (w.panels() - j).min(2);
        let cols = (n - j * PANEL).min(live * PANEL);
        let right = PanelTiles::new(std::array::from_fn(|c| w.panel(j + c.min(live - 1))));
        let mut staging = [[[0.0f32; TILE_ROWS * PANEL]; 2]; 2];
        // SAFETY: available() said this process has AMX-BF16.
        let _tiles = unsafe { Tiles::configure() };
        for rt in (0..row_tiles).step_by(2) {
            let both = rt + 1 < row_tiles;
            let left = &xt[rt * TILE_ROWS * stride..];
            let r0 = rt * TILE_ROWS;
            let live_rows = (rows - r0).min(2 * TILE_ROWS);
            let (block_rows, block_cols) = ((r0, live_rows), (j * PANEL, cols));
            let mut sums = Sums::new(&out, n, block_rows, block_cols, &mut staging, accumulate);
            let block = Block {
                left: left.as_ptr().cast(),
                left_stride: 4 * stride,
                both,
                k_tiles,
                right: &right,
                places: sums.places(),
                accumulate,
            };
            // SAFETY: the tiles are configured; `left` holds 16 (32 when `both`) rows of
            // `stride` words, each right tile 16 rows of 16 words, and `sums` has a
            // place of 16 rows for each of the four sums.
            unsafe { amx::block(Dot::Bf16, &block) };
            sums.finish();
        }
    };
    if parallel {
        for_each_task(blocks, run);
    } else {
        (0..blocks).for_each(run);
    }
}

/// One 16×16 tile of f32 sums.
type SumTile = [f32; TILE_ROWS * PANEL];

/// The four sums of a block: (row tile, panel).
const SUMS: [(usize, usize); 4] = [(0, 0), (0, 1), (1, 0), (1, 1)];

/// Where the four 16×16 sums of a block (row tiles t = 0, 1 × panels c = 0, 1) start
/// from and go: straight into y for a whole tile, or through a staging tile for one cut
/// by y's last rows or columns (copied in first when accumulating, copied out after).
struct Sums<'a> {
    out: &'a Disjoint,
    n: usize,
    r0: usize,
    rows: usize,
    c0: usize,
    cols: usize,
    /// The task's staging tiles, [t][c].
    staging: &'a mut [[SumTile; 2]; 2],
}

impl<'a> Sums<'a> {
    /// The block of y at rows `r0..r0 + rows` (≤ 32) and columns `c0..c0 + cols` (≤ 32)
    /// of a row-major y with `n` columns; a task's own.
    fn new(
        out: &'a Disjoint,
        n: usize,
        (r0, rows): (usize, usize),
        (c0, cols): (usize, usize),
        staging: &'a mut [[SumTile; 2]; 2],
        accumulate: bool,
    ) -> Self {
        let sums = Sums {
            out,
            n,
            r0,
            rows,
            c0,
            cols,
            staging,
        };
        for (t, c) in SUMS {
            if !sums.staged(t, c) {
                continue;
            }
            let (tr, tc) = sums.live(t, c);
            let (first, n) = (sums.at(t, c, 0), sums.n);
            let tile = &mut sums.staging[t][c];
            tile.fill(0.0);
            if accumulate {
                for r in 0..tr {
                    // SAFETY: the block belongs to this task alone.
                    let src = unsafe { sums.out.range(first + r * n, tc) };
                    tile[r * PANEL..][..tc].copy_from_slice(src);
                }
            }
        }
        sums
    }

    /// Whether sum (t, c) goes through a staging tile: it is not wholly inside y.
    fn staged(&self, t: usize, c: usize) -> bool {
        self.live(t, c) != (TILE_ROWS, PANEL)
    }

    /// Live (rows, columns) of sum tile (t, c): (0, 0) for one wholly outside y.
    fn live(&self, t: usize, c: usize) -> (usize, usize) {
        let tr = self.rows.saturating_sub(t * TILE_ROWS).min(TILE_ROWS);
        let tc = self.cols.saturating_sub(c * PANEL).min(PANEL);
        if tr == 0 || tc == 0 {
            (0, 0)
        } else {
            (tr, tc)
        }
    }

    /// The index in y of row r of sum tile (t, c).
    fn at(&self, t: usize, c: usize, r: usize) -> usize {
        (self.r0 + t * TILE_ROWS + r) * self.n + self.c0 + c * PANEL
    }

    /// Each sum's first element and row stride in bytes. A tile wholly outside y (an odd
    /// last row tile or panel) points at a staging tile whose sums are dropped.
    fn places(&mut self) -> [[(*mut u8, usize); 2]; 2] {
        std::array::from_fn(|t| {
            std::array::from_fn(|c| {
                if !self.staged(t, c) {
                    let end = self.at(t, c, TILE_ROWS - 1) + PANEL;
                    // SAFETY: the whole tile lies in this task's block of y.
                    (
                        unsafe { self.out.ptr(self.at(t, c, 0), end) }.cast(),
                        4 * self.n,
                    )
                } else {
                    (self.staging[t][c].as_mut_ptr().cast(), 4 * PANEL)
                }
            })
        })
    }

    /// Copies the staged tiles' live parts into y.
    fn finish(self) {
        for (t, c) in SUMS.into_iter().filter(|&(t, c)| self.staged(t, c)) {
            let (tr, tc) = self.live(t, c);
            for r in 0..tr {
                // SAFETY: the block belongs to this task alone.
                let dst = unsafe { self.out.range(self.at(t, c, r), tc) };
                dst.copy_from_slice(&self.staging[t][c][r * PANEL..][..tc]);
            }
        }
    }
}

/// x `[rows, K]` rounded to bf16 pairs into `[rows_out, stride]` words (rows_out ≥ rows,
/// stride ≥ ⌈K/2⌉), zero beyond x.
fn x_tiles(x: &[f32], k: usize, stride: usize, rows_out: usize, parallel: bool) -> Vec<u32> {
    let mut out = vec![0u32; rows_out * stride];
    let round = |(dst, src): (&mut [u32], &[f32])| round_pairs(src, &mut dst[..k.div_ceil(2)]);
    let rows = x.len() / k.max(1);
    if parallel && rows >= 64 {
        out.par_chunks_mut(stride)
            .zip(x.par_chunks_exact(k))
            .for_each(round);
    } else {
        out.chunks_mut(stride)
            .zip(x.chunks_exact(k))
            .for_each(round);
    }
    out
}
