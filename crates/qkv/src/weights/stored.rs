//! What every stored weight type shares: the [`StoredWeight`] interface (elements,
//! forms, the product in each), what a product starts from ([`Start`]), the operands'
//! check, the panel sweep of the tiled types, the widened form (the f32 product with the
//! weight widened slab by slab) and the readable twin (the whole weight widened, then
//! the f32 product).

use crate::error::{Error, Result};
use crate::ops::disjoint::Disjoint;
use crate::ops::for_each_task;
use crate::ops::matmul::{gemm_source, SlabSource};
use crate::ops::{gemm, MatMut, MatRef, Par};

/// What a row of y starts from, before a product is added to it.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// Zero: y is overwritten.
    Zero,
    /// y's own values.
    Accumulate,
    /// A bias `[N]` (y's values are not read): a linear layer's, added as each tile is
    /// written (or copied into y first, where a form cannot).
    Bias(&'a [f32]),
}

impl Start<'_> {
    /// y's own values when `accumulate`, else zero.
    pub fn adding(accumulate: bool) -> Start<'static> {
        if accumulate {
            Start::Accumulate
        } else {
            Start::Zero
        }
    }

    /// Whether the product adds to y's values (a bias copied into y first counts).
    pub fn accumulates(self) -> bool {
        !matches!(self, Start::Zero)
    }

    /// y `[rows, N]` as the product expects to find it when it adds to y: a bias copied
    /// into every row, else y untouched.
    pub fn prepare(self, y: &mut [f32], n: usize) {
        if let Start::Bias(b) = self {
            y.chunks_exact_mut(n).for_each(|row| row.copy_from_slice(b));
        }
    }

    /// y's elements `dst` (columns `first..` of a row) given the product's sums:
    /// matched once a run, so each arm's loop is a plain vector loop.
    #[inline(always)]
    fn apply(self, dst: &mut [f32], sums: &[f32], first: usize) {
        match self {
            Start::Zero => dst.copy_from_slice(&sums[..dst.len()]),
            Start::Accumulate => dst.iter_mut().zip(sums).for_each(|(d, s)| *d += s),
            Start::Bias(b) => {
                let b = &b[first..][..dst.len()];
                dst.iter_mut()
                    .zip(sums)
                    .zip(b)
                    .for_each(|((d, s), b)| *d = s + b);
            }
        }
    }
}

/// Which instructions compute a form's dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Plain loops: any CPU (the twin of the vector kernels, which tests run).
    Plain,
    /// 256-bit vectors (AVX2, FMA, and F16C or the integer madds where the type needs
    /// them).
    Avx2,
    /// 512-bit vectors.
    Avx512,
    /// AVX-512 VNNI's `vpdpbusd`: four byte products summed into an i32 lane.
    Vnni,
    /// AVX512-BF16's `vdpbf16ps`: two bf16 products summed into an f32 lane.
    Bf16,
}

/// How a product of a stored weight runs. Every form computes the same products; they
/// differ in the order of the f32 sums (some not even in that).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// x rounded as the type rounds it, then the f32 product with the weight widened
    /// slab by slab as the product packs it.
    Widened,
    /// A few rows of x against each weight row, the weight streamed from memory once
    /// and widened in registers.
    Rows(Kernel),
    /// Register tiles of rows × panels of 16 output columns.
    Tiles(Kernel),
    /// Intel AMX's tile registers.
    Amx,
}

/// A `[N, K]` weight stored in another number type, for y = start + x·Wᵀ. Every type
/// of [`super`] implements it: one interface for its elements, its forms on this CPU
/// and its product in each.
pub trait StoredWeight: SlabSource + Sync {
    /// (N, K).
    fn shape(&self) -> (usize, usize);

    /// W[r, c] as the products read it.
    fn element(&self, r: usize, c: usize) -> f32;

    /// The weight as the products read it, row-major `[N, K]` f32.
    fn widened(&self) -> Vec<f32> {
        let (n, k) = self.shape();
        (0..n * k).map(|i| self.element(i / k, i % k)).collect()
    }

    /// Bytes the weight takes as stored.
    fn bytes(&self) -> usize;

    /// The type's name, for errors: `bf16`, `int8`, `q4_k`, `f16`.
    fn type_name(&self) -> &'static str;

    /// The forms this CPU runs for this weight: what the tests compare.
    fn forms_here(&self) -> Vec<Form>;

    /// The form [`product`] takes for `rows` rows on this CPU.
    fn form(&self, rows: usize) -> Form;

    /// The product in `form`, one of [`Self::forms_here`], on operands [`product`]
    /// checked, rows > 0.
    fn run(&self, form: Form, ops: Operands, par: Par) -> Result<()>;
}

/// A product's operands: y `[rows, N]` ← start + x `[rows, K]`·Wᵀ, row-major.
pub struct Operands<'a> {
    pub y: &'a mut [f32],
    pub x: &'a [f32],
    pub rows: usize,
    pub start: Start<'a>,
}

/// y `[rows, N]` ← start + x `[rows, K]`·Wᵀ, row-major, in the form the weight's type
/// takes for `rows` rows on this CPU. Errors when the lengths do not match the weight.
pub fn product(
    w: &dyn StoredWeight,
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    start: Start,
    par: Par,
) -> Result<()> {
    product_in(None, w, Operands { y, x, rows, start }, par)
}

/// [`product`] in a given form; an error when this CPU does not run it for `w`.
pub fn product_as(form: Form, w: &dyn StoredWeight, ops: Operands, par: Par) -> Result<()> {
    product_in(Some(form), w, ops, par)
}

/// The product in `form`, or the one for the row count; operands checked first.
fn product_in(form: Option<Form>, w: &dyn StoredWeight, ops: Operands, par: Par) -> Result<()> {
    check_operands(w, ops.y, ops.x, ops.rows, ops.start)?;
    let form = match form {
        None => w.form(ops.rows),
        Some(f) if w.forms_here().contains(&f) => f,
        Some(f) => {
            return Err(Error::invalid(
                "form",
                format!("this CPU does not run {f:?} for a {} weight", w.type_name()),
            ))
        }
    };
    if ops.rows == 0 {
        return Ok(());
    }
    w.run(form, ops, par)
}

/// Errors unless x is `[rows, K]`, y `[rows, N]` and a bias `[N]` for `w`.
pub(crate) fn check_operands(
    w: &dyn StoredWeight,
    y: &[f32],
    x: &[f32],
    rows: usize,
    start: Start,
) -> Result<()> {
    let (n, k) = w.shape();
    if rows.checked_mul(k) != Some(x.len()) || rows.checked_mul(n) != Some(y.len()) {
        return Err(Error::shape(
            format!("{} product operands", w.type_name()),
            format!("x [rows, {k}] and y [rows, {n}] for the weight [{n}, {k}], rows = {rows}"),
            &[x.len(), y.len()],
        ));
    }
    if let Start::Bias(b) = start {
        if b.len() != n {
            return Err(Error::shape(
                format!("{} product bias", w.type_name()),
                format!("[{n}]"),
                &[b.len()],
            ));
        }
    }
    Ok(())
}

/// The widened form: y `[rows, N]` ← start + x·Wᵀ on the f32 micro-kernel, the weight
/// widened slab by slab as the product packs it; x `[rows, K]` is already rounded as
/// the type rounds it.
pub(crate) fn widened_product(w: &dyn StoredWeight, ops: Operands, par: Par) -> Result<()> {
    let Operands { y, x, rows, start } = ops;
    let (n, k) = w.shape();
    start.prepare(y, n);
    gemm_source(
        MatMut::row_major(y, rows, n),
        MatRef::row_major(x, rows, k),
        (w, k, n),
        1.0,
        start.accumulates(),
        par,
    )
}

/// The twin: y `[rows, N]` ← (accumulate ? y : 0) + x·Wᵀ with the whole weight widened
/// first, then [`crate::ops::gemm`] (itself held to f64 loops).
pub(crate) fn reference_product(
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    w: &dyn StoredWeight,
    accumulate: bool,
) {
    let (n, k) = w.shape();
    let wf = w.widened();
    gemm(
        MatMut::row_major(y, rows, n),
        MatRef::row_major(x, rows, k),
        MatRef::row_major(&wf, n, k).t(),
        1.0,
        accumulate,
        Par::Auto,
    )
    .expect("shapes from the weight");
}

/// Output columns of a panel, in every tiled type.
pub(crate) const PANEL: usize = 16;

/// Rows of x a tile takes at most.
pub(crate) const TILE_ROWS: usize = 4;

/// The sums of one tile: `[row][panel][column]`.
pub(crate) type Sums<const R: usize, const NP: usize> = [[[f32; PANEL]; NP]; R];

/// Where a tile lies: rows `r0..` of x against the weight's panels `panels`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At<const NP: usize> {
    pub r0: usize,
    pub panels: [usize; NP],
}

/// A tiled type's kernel: the sums of R rows of x against NP panels of the weight.
pub(crate) trait TileKernel: Sync {
    /// `out[r][np][c]`: row `r0 + r` of x against column c of panel `panels[np]`.
    fn sums<const R: usize, const NP: usize>(&self, at: At<NP>, out: &mut Sums<R, NP>);
}

/// Rows of x and panels of the weight in one tile: four panels for one row (a decoding
/// step, 64 columns, eight vectors of sums), else two; up to [`TILE_ROWS`] rows.
type TileSums = [[f32; 4 * PANEL]; TILE_ROWS];

/// The tile of rows `r0..r0 + rows` against panels `j..j + live` (of `width` a tile)
/// into `sums[r][c]`, the panels' columns c, in the shape the kernel is compiled for.
fn tile_sums(
    kernel: &impl TileKernel,
    (r0, rows): (usize, usize),
    (j, live, width): (usize, usize, usize),
    sums: &mut TileSums,
) {
    fn shaped<const R: usize, const NP: usize>(
        kernel: &impl TileKernel,
        r0: usize,
        (j, live): (usize, usize),
        sums: &mut TileSums,
    ) {
        // missing panels repeat the last live one; their sums are dropped
        let panels = std::array::from_fn(|i| j + i.min(live - 1));
        let mut out = [[[0.0f32; PANEL]; NP]; R];
        kernel.sums::<R, NP>(At { r0, panels }, &mut out);
        for (dst, src) in sums.iter_mut().zip(&out) {
            for (np, cols) in src.iter().enumerate() {
                dst[np * PANEL..][..PANEL].copy_from_slice(cols);
            }
        }
    }
    match (rows, width) {
        (1, 4) => shaped::<1, 4>(kernel, r0, (j, live), sums),
        (1, _) => shaped::<1, 2>(kernel, r0, (j, live), sums),
        (2, _) => shaped::<2, 2>(kernel, r0, (j, live), sums),
        (3, _) => shaped::<3, 2>(kernel, r0, (j, live), sums),
        _ => shaped::<4, 2>(kernel, r0, (j, live), sums),
    }
}

/// The panel sweep of the tiled types: y `[rows, N]` ← start + the sums of `kernel`.
/// The weight's panels of [`PANEL`] columns are split into runs, about
/// `tasks_per_thread` a thread; a task sweeps every row tile over its run, so its
/// panels stay in cache while x streams past, and the weight is read from memory once.
pub(crate) fn sweep_panels(
    kernel: &impl TileKernel,
    ops: Operands,
    tasks_per_thread: usize,
    parallel: bool,
) {
    sweep_panels_of(vec![(kernel, ops)], tasks_per_thread, parallel);
}

/// [`sweep_panels`] of several products of the same rows in one job (an attention's
/// Q, K and V from one input): the runs are cut from all the weights' panels together,
/// so a small weight (GQA's K and V) does not make a job of its own.
pub(crate) fn sweep_panels_of<K: TileKernel>(
    parts: Vec<(&K, Operands)>,
    tasks_per_thread: usize,
    parallel: bool,
) {
    /// One product as its tasks see it: y `[rows, n]` in `panels` panels.
    struct Part<'a, K> {
        kernel: &'a K,
        out: Disjoint,
        start: Start<'a>,
        n: usize,
        panels: usize,
    }
    let Some(rows) = parts.first().map(|(_, ops)| ops.rows) else {
        return;
    };
    let width = if rows == 1 { 4 } else { 2 };
    let parts: Vec<Part<K>> = parts
        .into_iter()
        .map(|(kernel, ops)| {
            assert_eq!(ops.rows, rows, "one sweep, one row count");
            let n = ops.y.len() / rows;
            Part {
                kernel,
                out: Disjoint::new(ops.y),
                start: ops.start,
                n,
                panels: n.div_ceil(PANEL),
            }
        })
        .collect();
    let all: usize = parts.iter().map(|p| p.panels).sum();
    let chunk = panels_per_task(all, width, tasks_per_thread, parallel);
    let run = |part: &Part<K>, j0: usize| {
        let (n, j1) = (part.n, part.panels.min(j0 + chunk));
        let mut sums = [[0.0f32; 4 * PANEL]; TILE_ROWS];
        for j in (j0..j1).step_by(width) {
            let live = (j1 - j).min(width);
            let cols = (n - j * PANEL).min(live * PANEL);
            for r0 in (0..rows).step_by(TILE_ROWS) {
                let r_live = (rows - r0).min(TILE_ROWS);
                tile_sums(part.kernel, (r0, r_live), (j, live, width), &mut sums);
                for (r, row) in sums.iter().enumerate().take(r_live) {
                    // SAFETY: columns j·PANEL.. of this task's panels belong to it alone.
                    let dst = unsafe { part.out.range((r0 + r) * n + j * PANEL, cols) };
                    part.start.apply(dst, row, j * PANEL);
                }
            }
        }
    };
    // task t is run t − first[p] of the part p whose tasks hold it
    let mut tasks = 0;
    let first: Vec<usize> = parts
        .iter()
        .map(|p| {
            let at = tasks;
            tasks += p.panels.div_ceil(chunk);
            at
        })
        .collect();
    let task = |t: usize| {
        let p = first.partition_point(|&f| f <= t) - 1;
        run(&parts[p], (t - first[p]) * chunk);
    };
    if parallel {
        for_each_task(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Panels a task takes when `panels` panels of output columns are split over the
/// threads (`parallel`): about `tasks_per_thread` tasks a thread, a multiple of `group`
/// (the panels a kernel call takes); all of them on one thread.
pub(crate) fn panels_per_task(
    panels: usize,
    group: usize,
    tasks_per_thread: usize,
    parallel: bool,
) -> usize {
    if parallel {
        panels
            .div_ceil(tasks_per_thread * rayon::current_num_threads())
            .next_multiple_of(group)
    } else {
        panels
    }
}

/// Checks both stored types' tests share.
#[cfg(test)]
pub(crate) mod checks {
    use super::{product_as, Form, Operands, Start, StoredWeight};
    use crate::ops::Par;
    use crate::rng::Rng;

    /// y0 after `w`'s product with x in `form`.
    pub fn run_form(
        w: &dyn StoredWeight,
        form: Form,
        (x, y0): (&[f32], &[f32]),
        rows: usize,
        start: Start,
        par: Par,
    ) -> Vec<f32> {
        let mut y = y0.to_vec();
        product_as(
            form,
            w,
            Operands {
                y: &mut y,
                x,
                rows,
                start,
            },
            par,
        )
        .unwrap();
        y
    }

    /// What the twin gives from y0 `[rows, n]`: `start` applied as the products apply
    /// it, then `twin(y, accumulate)`.
    pub fn twin(
        y0: &[f32],
        n: usize,
        start: Start,
        twin: impl FnOnce(&mut [f32], bool),
    ) -> Vec<f32> {
        let mut want = y0.to_vec();
        start.prepare(&mut want, n);
        twin(&mut want, start.accumulates());
        want
    }

    /// A bias `[n]` for the products' third start.
    pub fn bias(n: usize) -> Vec<f32> {
        (0..n).map(|c| c as f32 * 0.25 - 3.0).collect()
    }

    /// Products' shapes (rows, K, N): one row and a few, both sides of a tile, odd K, a
    /// last panel of fewer than 16 columns.
    pub const SHAPES: [(usize, usize, usize); 8] = [
        (1, 7, 3),
        (1, 512, 100),
        (3, 130, 40),
        (4, 64, 17),
        (5, 33, 70),
        (13, 301, 45),
        (40, 80, 33),
        (64, 96, 129),
    ];

    /// Random x `[rows, K]`, f32 weight `[N, K]` and starting y `[rows, N]` for each of
    /// [`SHAPES`].
    pub fn cases(seed: u64) -> impl Iterator<Item = ((usize, usize, usize), [Vec<f32>; 3])> {
        let mut rng = Rng::new(seed);
        SHAPES.into_iter().map(move |(rows, k, n)| {
            let x = rng.normals(rows * k, 1.0);
            let w = rng.normals(n * k, 1.0);
            ((rows, k, n), [x, w, rng.normals(rows * n, 1.0)])
        })
    }

    /// `got` equals the twin's `want` within f32 rounding of sums over K (in another order).
    pub fn assert_near(what: &str, got: &[f32], want: &[f32], k: usize) {
        for (i, (g, t)) in got.iter().zip(want).enumerate() {
            let tol = 1e-5 * (k as f32).sqrt() * (1.0 + t.abs());
            assert!((g - t).abs() < tol, "{what} [{i}]: {g} vs {t}");
        }
    }

    /// Each slab `(k0, kc, c0, cols)` holds W's elements where the packed layout puts
    /// them, and zeros past the last column.
    pub fn assert_slabs(w: &dyn StoredWeight, slabs: &[(usize, usize, usize, usize)]) {
        const PANEL: usize = 16;
        let (n, _) = w.shape();
        for &(k0, kc, c0, cols) in slabs {
            let panels = cols.div_ceil(PANEL);
            let mut out = vec![f32::NAN; panels * kc * PANEL];
            w.pack_slab(k0, kc, c0, cols, &mut out);
            for (i, &v) in out.iter().enumerate() {
                let (c, p) = ((i / (kc * PANEL)) * PANEL + i % PANEL, (i / PANEL) % kc);
                let want = if c0 + c < n {
                    w.element(c0 + c, k0 + p)
                } else {
                    0.0
                };
                assert_eq!(v, want, "slab {k0}+{kc} × {c0}+{cols}: ({p}, {c})");
            }
        }
    }
}
