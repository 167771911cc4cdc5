//! What the weight types stored in fewer bits ([`super::bf16`], [`super::int8`]) share:
//! reading an element, the operands' check, the widened form (the f32 product with the
//! weight widened slab by slab) and the readable twin (the whole weight widened, then
//! the f32 product).

use crate::error::{Error, Result};
use crate::ops::matmul::{gemm_source, SlabSource};
use crate::ops::{gemm, MatMut, MatRef, Par};

/// A `[N, K]` weight stored in another number type, for y = x·Wᵀ.
pub trait StoredWeight: SlabSource {
    /// (N, K).
    fn shape(&self) -> (usize, usize);

    /// W[r, c] as the products read it.
    fn element(&self, r: usize, c: usize) -> f32;

    /// The weight as the products read it, row-major `[N, K]` f32.
    fn widened(&self) -> Vec<f32> {
        let (n, k) = self.shape();
        (0..n * k).map(|i| self.element(i / k, i % k)).collect()
    }
}

/// Errors unless x is `[rows, K]` and y `[rows, N]` for `w`; `what` names the product.
pub(crate) fn check_operands(
    what: &str,
    y: &[f32],
    x: &[f32],
    rows: usize,
    w: &dyn StoredWeight,
) -> Result<()> {
    let (n, k) = w.shape();
    if rows.checked_mul(k) != Some(x.len()) || rows.checked_mul(n) != Some(y.len()) {
        return Err(Error::shape(
            what,
            format!("x [rows, {k}] and y [rows, {n}] for the weight [{n}, {k}], rows = {rows}"),
            &[x.len(), y.len()],
        ));
    }
    Ok(())
}

/// y `[rows, N]` ← (accumulate ? y : 0) + x·Wᵀ on the f32 micro-kernel, the weight
/// widened slab by slab as the product packs it; x `[rows, K]` is already rounded as
/// the type rounds it.
pub(crate) fn widened_product(
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    w: &dyn StoredWeight,
    accumulate: bool,
    par: Par,
) -> Result<()> {
    let (n, k) = w.shape();
    gemm_source(
        MatMut::row_major(y, rows, n),
        MatRef::row_major(x, rows, k),
        (w, k, n),
        1.0,
        accumulate,
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

/// Panels a task takes when `panels` panels of output columns are split over the
/// threads (`parallel`): about four tasks a thread, a multiple of `group` (the panels
/// a kernel call takes); all of them on one thread.
pub(crate) fn panels_per_task(panels: usize, group: usize, parallel: bool) -> usize {
    if parallel {
        panels
            .div_ceil(4 * rayon::current_num_threads())
            .next_multiple_of(group)
    } else {
        panels
    }
}

/// Checks both stored types' tests share.
#[cfg(test)]
pub(crate) mod checks {
    use super::StoredWeight;
    use crate::rng::Rng;

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
