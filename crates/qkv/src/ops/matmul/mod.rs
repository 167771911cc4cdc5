//! Matrix products on strided views into slices, so a transposed weight, one head
//! inside `[B,T,H,D]` or a K/V tile is read in place. The engine is our own (see
//! `blocked.rs`): packed AVX2 + FMA micro-kernels for most shapes and a packing-free
//! path for a few rows against a weight; the triple loop in the tests is its twin.

mod blocked;
mod dot;
mod kernel;
mod pack;
mod packed;
mod tile;
mod view;

pub use blocked::SlabSource;
pub(crate) use packed::check_weight;
pub use packed::PackedWeight;
use view::Update;
pub use view::{MatMut, MatRef, Par};

/// Columns per packed B panel (see [`pack_panels`]).
pub(crate) const PANEL: usize = tile::NR;

/// Packs all of `b` (`[K, N]`, in place of any layout) into panels of [`PANEL`]
/// columns: element (p, c) at `(c / PANEL)·K·PANEL + p·PANEL + c % PANEL`, the last
/// panel zero-padded. It is the layout the product's micro-kernel reads B in, and the
/// tiled attention packs its keys the same way (b = Kᵀ: one panel of 16 keys, `[D][16]`),
/// with the same transposing copy.
pub(crate) fn pack_panels(b: &MatRef, out: &mut [f32]) {
    assert!(b.fits() && out.len() >= b.cols.div_ceil(PANEL) * PANEL * b.rows);
    pack::pack_b(b, 0, b.rows, 0, b.cols, out);
}

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `dst = (accumulate ? dst : 0) + alpha · a · b`, with a: `[M,K]`, b: `[K,N]`, dst: `[M,N]`.
/// Errors when the shapes disagree or a view reaches outside its slice.
pub fn gemm(
    dst: MatMut<'_>,
    a: MatRef<'_>,
    b: MatRef<'_>,
    alpha: f32,
    accumulate: bool,
    par: Par,
) -> Result<()> {
    if !(a.rows == dst.rows && b.cols == dst.cols && a.cols == b.rows) {
        return Err(Error::shape(
            "gemm operands",
            format!(
                "a [M,K], b [K,N], dst [M,N]; got a {}x{}, b {}x{}, dst",
                a.rows, a.cols, b.rows, b.cols
            ),
            &[dst.rows, dst.cols],
        ));
    }
    outside(
        "gemm",
        &[("a", a.fits()), ("b", b.fits()), ("dst", dst.fits())],
    )?;
    if dst.rows == 0 || dst.cols == 0 {
        return Ok(());
    }
    if a.cols == 0 {
        if !accumulate {
            for r in 0..dst.rows {
                for c in 0..dst.cols {
                    dst.data[r * dst.row_stride + c * dst.col_stride] = 0.0;
                }
            }
        }
        return Ok(());
    }
    blocked::product(Update::of(dst, alpha, accumulate), a, b, par);
    Ok(())
}

/// `dst = scale · a · b` on this thread, for views that the crate builds from shapes it
/// has already checked, inside parallel loops that return no error (the attention
/// kernels' scores): a mismatch here is a bug in qkv, and panics.
pub(crate) fn gemm_views(dst: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, scale: f32) {
    if let Err(e) = gemm(dst, a, b, scale, false, Par::Single) {
        panic!("internal views: {e}");
    }
}

/// The error for the first view (name, inside its slice) that is not inside its slice.
fn outside(op: &str, views: &[(&str, bool)]) -> Result<()> {
    match views.iter().find(|(_, fits)| !fits) {
        Some((name, _)) => Err(Error::invalid(
            format!("{op} view {name}"),
            "its rows and strides reach outside its slice",
        )),
        None => Ok(()),
    }
}

/// [`gemm`] with b = Wᵀ for a weight packed once: `dst = (accumulate ? dst : 0) + alpha ·
/// a · Wᵀ`, a: `[M,K]`, W `[N,K]`, dst: `[M,N]`. Equal to [`gemm`] on W's transposed
/// view up to the order of the sums (the few-rows path sums differently). Errors as
/// [`gemm`] does.
pub fn gemm_packed(
    dst: MatMut<'_>,
    a: MatRef<'_>,
    w: &PackedWeight,
    alpha: f32,
    accumulate: bool,
    par: Par,
) -> Result<()> {
    if !(a.rows == dst.rows && w.n() == dst.cols && a.cols == w.k()) {
        return Err(Error::shape(
            "gemm_packed operands",
            format!(
                "a [M,K], W [N,K], dst [M,N]; got a {}x{}, W {}x{}, dst",
                a.rows,
                a.cols,
                w.n(),
                w.k()
            ),
            &[dst.rows, dst.cols],
        ));
    }
    outside("gemm_packed", &[("a", a.fits()), ("dst", dst.fits())])?;
    if dst.rows == 0 {
        return Ok(());
    }
    blocked::product_packed(Update::of(dst, alpha, accumulate), a, w, par);
    Ok(())
}

/// [`gemm`] with b a [`SlabSource`] `[K, N]` of `(k, n)`: `dst = (accumulate ? dst : 0)
/// + alpha · a · b` on the blocked path, B packed by the source slab by slab. Errors as
/// [`gemm`] does.
pub fn gemm_source(
    dst: MatMut<'_>,
    a: MatRef<'_>,
    (b, k, n): (&dyn SlabSource, usize, usize),
    alpha: f32,
    accumulate: bool,
    par: Par,
) -> Result<()> {
    if !(a.rows == dst.rows && n == dst.cols && a.cols == k) {
        return Err(Error::shape(
            "gemm_source operands",
            format!(
                "a [M,K], b [K,N], dst [M,N]; got a {}x{}, b {k}x{n}, dst",
                a.rows, a.cols
            ),
            &[dst.rows, dst.cols],
        ));
    }
    outside("gemm_source", &[("a", a.fits()), ("dst", dst.fits())])?;
    if dst.rows == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    blocked::product_source(Update::of(dst, alpha, accumulate), a, b, par);
    Ok(())
}

/// a: `[..., M, K]` (leading axes flattened into rows) times b: `[K, N]` → `[..., M, N]`.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.rank() < 1 || b.rank() != 2 || a.last_dim() != b.shape()[0] {
        return Err(Error::shape(
            "matmul operands",
            format!("a [.., K] and b [K, N], with a {:?}", a.shape()),
            b.shape(),
        ));
    }
    let (k, n) = (b.shape()[0], b.shape()[1]);
    let m = a.numel() / k.max(1);
    let mut shape = a.shape().to_vec();
    *shape.last_mut().expect("rank checked") = n;
    let mut out = Tensor::zeros(&shape);
    gemm(
        MatMut::row_major(out.data_mut(), m, n),
        MatRef::row_major(a.data(), m, k),
        MatRef::row_major(b.data(), k, n),
        1.0,
        false,
        Par::Auto,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook triple loop: the readable twin that `gemm` is held to.
    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn matmul_matches_naive_on_odd_sizes() {
        for &(m, k, n) in &[(1, 1, 1), (7, 17, 2), (33, 5, 17), (64, 65, 63)] {
            let a = Tensor::from_fn(&[m, k], |i| ((i * 7 % 13) as f32 - 6.0) * 0.1);
            let b = Tensor::from_fn(&[k, n], |i| ((i * 5 % 11) as f32 - 5.0) * 0.1);
            let c = matmul(&a, &b).unwrap();
            let want = naive(a.data(), b.data(), m, k, n);
            for (x, y) in c.data().iter().zip(&want) {
                assert!((x - y).abs() < 1e-4, "{m}x{k}x{n}: {x} vs {y}");
            }
        }
    }

    /// `rows × cols` values stored row-major (`transposed == false`) or column-major,
    /// inside a slice padded by `pad` floats per line so strides exceed the extent.
    fn stored(
        vals: &[f32],
        rows: usize,
        cols: usize,
        transposed: bool,
        pad: usize,
    ) -> (Vec<f32>, usize, usize) {
        let (lines, len) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let ld = len + pad;
        let mut data = vec![f32::NAN; lines * ld];
        for r in 0..rows {
            for c in 0..cols {
                let (line, at) = if transposed { (c, r) } else { (r, c) };
                data[line * ld + at] = vals[r * cols + c];
            }
        }
        if transposed {
            (data, 1, ld)
        } else {
            (data, ld, 1)
        }
    }

    /// Asserts that `got`, an element of C ← (add ? c0 : 0) − 0.5·A·B, equals −0.5·`dot`
    /// (+ c0) computed in f64, to the rounding a sum of k f32 products allows.
    /// A `[M, K]` (row-major) times B (element (p, j) from `b`) in f64: the readable
    /// twin every product is held to.
    /// Holds `got(i, j)` to −0.5·A·B (+ C₀ when `add`) in f64, for every element of the
    /// m×n product of A (`a`, row-major m×k) and B (`b(p, j)`), within f32 rounding.
    fn assert_products(
        got: impl Fn(usize, usize) -> f32,
        a: &[f32],
        b: impl Fn(usize, usize) -> f32,
        (m, k, n): (usize, usize, usize),
        (c0, add): (&[f32], bool),
        what: &str,
    ) {
        for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
            let dot: f64 = (0..k).map(|p| a[i * k + p] as f64 * b(p, j) as f64).sum();
            let want = -0.5 * dot + if add { c0[i * n + j] as f64 } else { 0.0 };
            let got = got(i, j);
            assert!(
                (got as f64 - want).abs() < 2e-6 * (k as f64).sqrt() * (1.0 + want.abs()),
                "{m}x{k}x{n} {what}: ({i}, {j}) {got} vs {want}"
            );
        }
    }

    /// Every path of the engine (few rows, blocked, several K slabs and row blocks,
    /// column chunks, parallel or not) on every operand layout equals an f64 triple loop.
    #[test]
    fn gemm_matches_f64_loops_on_every_layout_and_path() {
        let mut rng = crate::rng::Rng::new(11);
        let shapes = [
            (1, 1, 1),
            (1, 384, 70),
            (3, 1001, 9),
            (8, 40, 33),
            (9, 300, 17),
            (150, 520, 40),
            (13, 64, 700),
            (301, 70, 45),
        ];
        for &(m, k, n) in &shapes {
            let a = rng.normals(m * k, 1.0);
            let b = rng.normals(k * n, 1.0);
            let c0 = rng.normals(m * n, 1.0);
            for layout in 0..8 {
                let (ta, tb, tc) = (layout & 1 == 1, layout & 2 == 2, layout & 4 == 4);
                let (a_data, a_rs, a_cs) = stored(&a, m, k, ta, 3);
                let (b_data, b_rs, b_cs) = stored(&b, k, n, tb, 1);
                for (par, add) in [(Par::Auto, false), (Par::Single, true)] {
                    let (mut c_data, c_rs, c_cs) = stored(&c0, m, n, tc, 2);
                    gemm(
                        MatMut {
                            data: &mut c_data,
                            rows: m,
                            cols: n,
                            row_stride: c_rs,
                            col_stride: c_cs,
                        },
                        MatRef {
                            data: &a_data,
                            rows: m,
                            cols: k,
                            row_stride: a_rs,
                            col_stride: a_cs,
                        },
                        MatRef {
                            data: &b_data,
                            rows: k,
                            cols: n,
                            row_stride: b_rs,
                            col_stride: b_cs,
                        },
                        -0.5,
                        add,
                        par,
                    )
                    .unwrap();
                    assert_products(
                        |i, j| c_data[i * c_rs + j * c_cs],
                        &a,
                        |p, j| b[p * n + j],
                        (m, k, n),
                        (&c0, add),
                        &format!("layout {layout} {par:?}"),
                    );
                    assert!(
                        c_data.iter().filter(|v| v.is_nan()).count() == c_data.len() - m * n,
                        "padding written"
                    );
                }
            }
        }
    }

    /// A weight packed once gives the f64 triple loop's result on every path (few rows,
    /// several K slabs, a last panel of fewer than NR columns, parallel or not), and
    /// exactly the blocked path's bits when that path runs (more than DOT_ROWS rows):
    /// the same tiles sum in the same order.
    #[test]
    fn packed_weight_matches_f64_loops_and_the_blocked_path() {
        let mut rng = crate::rng::Rng::new(12);
        for &(m, k, n) in &[
            (1, 7, 3),
            (2, 384, 40),
            (13, 300, 70),
            (17, 600, 33),
            (301, 70, 45),
        ] {
            let a = rng.normals(m * k, 1.0);
            let w = rng.normals(n * k, 1.0);
            let c0 = rng.normals(m * n, 1.0);
            let packed = PackedWeight::new(&w, n, k).unwrap();
            for (par, add) in [(Par::Auto, false), (Par::Single, true)] {
                let mut got = c0.clone();
                let mut blocked = c0.clone();
                gemm_packed(
                    MatMut::row_major(&mut got, m, n),
                    MatRef::row_major(&a, m, k),
                    &packed,
                    -0.5,
                    add,
                    par,
                )
                .unwrap();
                gemm(
                    MatMut::row_major(&mut blocked, m, n),
                    MatRef::row_major(&a, m, k),
                    MatRef::row_major(&w, n, k).t(),
                    -0.5,
                    add,
                    par,
                )
                .unwrap();
                assert_products(
                    |i, j| got[i * n + j],
                    &a,
                    |p, j| w[j * k + p],
                    (m, k, n),
                    (&c0, add),
                    &format!("{par:?}"),
                );
                if m > 16 {
                    assert_eq!(got, blocked, "{m}x{k}x{n} {par:?}: packed vs blocked bits");
                }
            }
        }
    }

    #[test]
    fn transposed_view_and_accumulate() {
        // dst += 2 · a · wᵀ with w stored [N, K], as a linear layer reads its weight.
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5).collect();
        let w: Vec<f32> = (0..n * k).map(|i| 1.0 - i as f32 * 0.1).collect();
        let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
        let mut dst = vec![1.0; m * n];
        gemm(
            MatMut::row_major(&mut dst, m, n),
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&w, n, k).t(),
            2.0,
            true,
            Par::Single,
        )
        .unwrap();
        let want = naive(&a, &wt, m, k, n);
        for (x, y) in dst.iter().zip(&want) {
            assert!((x - (1.0 + 2.0 * y)).abs() < 1e-4);
        }
    }

    #[test]
    fn matmul_rejects_mismatch() {
        let a = Tensor::zeros(&[2, 3]);
        let b = Tensor::zeros(&[4, 2]);
        assert!(matmul(&a, &b).is_err());
    }
}
