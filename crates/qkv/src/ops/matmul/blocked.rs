//! The engine behind [`super::gemm`]: C ← β·C + α·A·B on strided views.
//!
//! Two paths, chosen by shape:
//! - **few rows** (a sentence of a dozen tokens, one decode step) against a weight read
//!   in place as Wᵀ: [`super::dot`] streams each weight row once and dots it with every row of
//!   A, so the product runs at memory speed with no packing;
//! - **everything else**, blocked as in BLIS / GotoBLAS: C is cut into one rectangle
//!   per thread, and each runs the sequential blocked product on its own: for each
//!   slab of `kc` steps along K, its columns of B are packed into `[kc][NR]`
//!   micro-panels, then each block of `MC` rows of A into `[kc][MR]` micro-panels, and
//!   the [`super::kernel`] computes tiles of MR rows × one or two NR-column panels. A
//!   block of A (≤ 144 × 384 floats, 216 KiB) stays in L2 while a tile's B micro-panels
//!   (≤ 384 × 16, 24 KiB, each) are reused from L1 by all of its tiles. The tasks share nothing and meet once, at the end of the
//!   call.
//!
//! No two tasks write the same element, and the result does not depend on the thread
//! count: every element is summed in the same order (slab by slab, p ascending inside
//! a slab) whichever task owns it.

use super::kernel::{tile, Dst};
use super::packed::PackedWeight;
use super::tile::{panels_per_tile, slabs, MR, NR};
use super::view::{MatRef, Par, Update};
use super::{dot, pack};
use crate::ops::disjoint::Disjoint;
use crate::ops::pool::for_each_task;
use std::cell::RefCell;

/// Rows of A per task block (a multiple of MR).
const MC: usize = 144;
/// Products smaller than this many multiply-adds run on the calling thread: waking
/// another costs more than it saves.
const PARALLEL_MACS: usize = 1 << 20;
/// A few-rows product over a weight of this many floats (256 KiB) is split over the
/// threads whatever its arithmetic: it is bound by reading the weight, and two cores
/// read memory faster than one.
const PARALLEL_WEIGHT: usize = 1 << 16;
/// Largest scratch (floats, 16 MiB) a thread keeps between calls; a bigger one (a huge
/// vocabulary head) is freed after its call.
const KEEP_MAX: usize = 1 << 22;
/// Row counts up to this go to the few-rows path when the layout allows it.
const DOT_ROWS: usize = 16;

/// The B operand of the blocked path.
#[derive(Clone, Copy)]
enum Operand<'a> {
    /// A strided view, packed slab by slab during the product.
    View(MatRef<'a>),
    /// A weight packed once, read in place.
    Packed(&'a PackedWeight),
    /// A weight that packs its own slabs (one stored in another number type).
    Source(&'a dyn SlabSource),
}

/// A `[K, N]` B operand that writes its slabs in the packed layout itself: what lets a
/// weight stored in another number type (bf16) run on the f32 micro-kernel, widened
/// slab by slab as the product packs it.
pub trait SlabSource: Sync {
    /// Writes rows `k0..k0 + kc` × columns `c0..c0 + cols` of B into `out` as
    /// `matmul::pack_panels` lays B out: element (p, c) at
    /// `(c / PANEL)·kc·PANEL + p·PANEL + c % PANEL`, columns past `cols` in the last
    /// panel zero. `c0` is a multiple of the panel width (16).
    fn pack_slab(&self, k0: usize, kc: usize, c0: usize, cols: usize, out: &mut [f32]);
}

/// Whether a product of this shape is split over the threads.
fn parallel((m, n, k): (usize, usize, usize), par: Par) -> bool {
    par == Par::Auto
        && rayon::current_num_threads() > 1
        && (m * n * k >= PARALLEL_MACS || (m <= DOT_ROWS && n * k >= PARALLEL_WEIGHT))
}

/// C ← (add ? C : 0) + α·A·B, with shapes already checked by the caller: a `[M,K]`,
/// b `[K,N]`, c `[M,N]`, all views inside their slices, M, N, K > 0.
pub(super) fn product(u: Update<'_>, a: MatRef<'_>, b: MatRef<'_>, par: Par) {
    let shape = (u.c.rows, u.c.cols, a.cols);
    if u.c.rows <= DOT_ROWS && a.col_stride == 1 && b.row_stride == 1 {
        dot::product(u, a, b, parallel(shape, par));
        return;
    }
    blocked(u, a, Operand::View(b), parallel(shape, par));
}

/// [`product`] with B a packed weight: the blocked path for every row count, without
/// packing B. Shapes as [`product`] (b `[K,N]` is the packed Wᵀ).
pub(super) fn product_packed(u: Update<'_>, a: MatRef<'_>, b: &PackedWeight, par: Par) {
    let shape = (u.c.rows, u.c.cols, a.cols);
    blocked(u, a, Operand::Packed(b), parallel(shape, par));
}

/// [`product`] with B a [`SlabSource`]: the blocked path for every row count. Shapes
/// as [`product`].
pub(super) fn product_source(u: Update<'_>, a: MatRef<'_>, b: &dyn SlabSource, par: Par) {
    let shape = (u.c.rows, u.c.cols, a.cols);
    blocked(u, a, Operand::Source(b), parallel(shape, par));
}

/// The blocked product, cut into one rectangle of C per thread when `parallel`.
fn blocked(u: Update<'_>, a: MatRef<'_>, b: Operand, parallel: bool) {
    let Update { c, alpha, add } = u;
    let (m, n) = (c.rows, c.cols);
    let threads = rayon::current_num_threads();
    let parts = if parallel { threads } else { 1 };
    let panels = n.div_ceil(NR);
    // cut C into `parts` rectangles of whole micro-panels. Each part packs its own
    // rows of A and columns of B, so a cut along N copies A `parts` times and a cut
    // along M copies B: cut along the larger of M and N, where there is room for it.
    let along_n = panels >= 4 * parts && (n >= m || m < 4 * parts * MR);
    let (row_parts, col_parts) = if along_n { (1, parts) } else { (parts, 1) };
    let rows_per_part = m.div_ceil(row_parts).next_multiple_of(MR);
    let panels_per_part = panels.div_ceil(col_parts);
    let out = Disjoint::new(c.data);
    let (rs, cs) = (c.row_stride, c.col_stride);
    let task = |t: usize| {
        let r0 = (t / col_parts) * rows_per_part;
        let c0 = (t % col_parts) * panels_per_part * NR;
        if r0 < m && c0 < n {
            let part = Part {
                r0,
                rows: rows_per_part.min(m - r0),
                c0,
                cols: (panels_per_part * NR).min(n - c0),
            };
            part.run(&a, b, &out, (rs, cs), alpha, add);
        }
    };
    if parts > 1 {
        for_each_task(parts, task);
    } else {
        task(0);
    }
}

/// One task's rectangle of C: rows `r0..r0 + rows`, columns `c0..c0 + cols`.
struct Part {
    r0: usize,
    rows: usize,
    c0: usize,
    cols: usize,
}

impl Part {
    /// The sequential blocked product on this rectangle: per slab of K, pack this part's
    /// columns of B, then per block of MC rows pack A and sweep the micro-tiles, B's
    /// micro-panel outer so it stays in L1 while A's block streams from L2.
    fn run(
        &self,
        a: &MatRef,
        b: Operand,
        out: &Disjoint,
        (rs, cs): (usize, usize),
        alpha: f32,
        add: bool,
    ) {
        let k = a.cols;
        let (slabs, kc_max) = slabs(k);
        let panels = self.cols.div_ceil(NR);
        let per_tile = panels_per_tile();
        let b_scratch = match b {
            Operand::View(_) | Operand::Source(_) => panels * kc_max * NR,
            Operand::Packed(_) => 0,
        };
        with_buffer(&PACKED_B, b_scratch, |b_scratch| {
            with_buffer(
                &PACKED_A,
                MC.min(self.rows).next_multiple_of(MR) * kc_max,
                |packed_a| {
                    for slab in 0..slabs {
                        let k0 = slab * kc_max;
                        let kc = kc_max.min(k - k0);
                        let packed_b: &[f32] = match b {
                            Operand::View(view) => {
                                pack::pack_b(&view, k0, kc, self.c0, self.cols, b_scratch);
                                b_scratch
                            }
                            Operand::Source(source) => {
                                let len = panels * kc * NR;
                                source.pack_slab(k0, kc, self.c0, self.cols, &mut b_scratch[..len]);
                                b_scratch
                            }
                            // a part starts on a panel boundary (c0 is a multiple of NR)
                            Operand::Packed(w) => w.panels(k0, kc, self.c0 / NR, panels),
                        };
                        for r0 in (self.r0..self.r0 + self.rows).step_by(MC) {
                            let rows = MC.min(self.r0 + self.rows - r0);
                            pack::pack_a(a, r0, rows, k0, kc, packed_a);
                            for j in (0..panels).step_by(per_tile) {
                                let np = per_tile.min(panels - j);
                                let b_panel = &packed_b[j * kc * NR..][..np * kc * NR];
                                let col = self.c0 + j * NR;
                                let cols = (np * NR).min(self.c0 + self.cols - col);
                                let mut tiles = pack::row_tiles(rows).enumerate().peekable();
                                while let Some((i, (start, tile_rows))) = tiles.next() {
                                    let next_row = tiles.peek().map(|&(_, (s, _))| r0 + s);
                                    let a_panel = &packed_a[i * kc * MR..][..kc * MR];
                                    let r = r0 + start;
                                    let start = r * rs + col * cs;
                                    let end = start + (tile_rows - 1) * rs + (cols - 1) * cs + 1;
                                    let dst = Dst {
                                        // SAFETY: the tile lies inside C (the caller checked
                                        // C's view) and inside this part, which no other
                                        // task writes.
                                        ptr: unsafe { out.ptr(start, end) },
                                        row_stride: rs,
                                        col_stride: cs,
                                        rows: tile_rows,
                                        cols,
                                        alpha,
                                        add: add || slab > 0,
                                        next: next_row.map_or(std::ptr::null(), |nr| {
                                            out.address(nr * rs + col * cs)
                                        }),
                                    };
                                    let next_b = (i == 0 && j + np < panels)
                                        .then(|| &packed_b[(j + np) * kc * NR..][..kc * NR]);
                                    // SAFETY: the panels hold kc steps; `dst` is as above.
                                    unsafe { tile(kc, a_panel, b_panel, &dst, next_b) };
                                }
                            }
                        }
                    }
                },
            )
        })
    }
}

thread_local! {
    /// Packing space, kept between calls so a product allocates nothing once warm.
    static PACKED_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACKED_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a 64-byte-aligned scratch slice of `len` floats from `slot`. The vector is
/// taken out of the slot for the call, so a nested product on the same thread (a rayon
/// task that steals another) gets a fresh one rather than a second borrow.
fn with_buffer<R>(
    slot: &'static std::thread::LocalKey<RefCell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    const ALIGN: usize = 16;
    let mut buf = slot.with(|s| std::mem::take(&mut *s.borrow_mut()));
    if buf.len() < len + ALIGN {
        buf.resize(len + ALIGN, 0.0);
    }
    let skip = buf.as_ptr().align_offset(64).min(ALIGN);
    let result = f(&mut buf[skip..skip + len]);
    slot.with(|s| {
        let mut kept = s.borrow_mut();
        if kept.len() < buf.len() && buf.len() <= KEEP_MAX {
            *kept = buf;
        }
    });
    result
}
