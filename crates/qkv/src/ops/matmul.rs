//! Matrix products through the `gemm` crate. Operands are strided views into slices,
//! so a transposed weight, one head inside `[B,T,H,D]` or a K/V tile is read in place.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A read-only `rows × cols` matrix inside `data`: element (r, c) is at
/// `r * row_stride + c * col_stride`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

/// A writable strided matrix, laid out as in [`MatRef`].
#[derive(Debug)]
pub struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A contiguous row-major matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose, without moving data.
    pub fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    fn fits(&self) -> bool {
        span(self.rows, self.cols, self.row_stride, self.col_stride) <= self.data.len()
    }
}

impl<'a> MatMut<'a> {
    /// A contiguous row-major matrix.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        MatMut {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    fn fits(&self) -> bool {
        span(self.rows, self.cols, self.row_stride, self.col_stride) <= self.data.len()
    }
}

/// Number of elements a strided matrix reaches (0 for an empty one).
fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// Threading for one product. Kernels that already run inside a parallel loop pass
/// `Single`, so threads are not oversubscribed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Par {
    /// Let `gemm` split the product over all rayon threads when it is large enough.
    Auto,
    Single,
}

/// `dst = (accumulate ? dst : 0) + alpha · a · b`, with a: `[M,K]`, b: `[K,N]`, dst: `[M,N]`.
///
/// Panics if the shapes disagree or a view reaches outside its slice: callers build
/// views from validated shapes, so a mismatch here is an internal bug.
pub fn gemm(dst: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, alpha: f32, accumulate: bool, par: Par) {
    assert!(
        a.rows == dst.rows && b.cols == dst.cols && a.cols == b.rows,
        "gemm shapes: a {}x{}, b {}x{}, dst {}x{}",
        a.rows,
        a.cols,
        b.rows,
        b.cols,
        dst.rows,
        dst.cols
    );
    assert!(
        a.fits() && b.fits() && dst.fits(),
        "gemm view outside its slice"
    );
    if dst.rows == 0 || dst.cols == 0 {
        return;
    }
    if a.cols == 0 {
        if !accumulate {
            for r in 0..dst.rows {
                for c in 0..dst.cols {
                    dst.data[r * dst.row_stride + c * dst.col_stride] = 0.0;
                }
            }
        }
        return;
    }
    let parallelism = match par {
        Par::Auto => gemm::Parallelism::Rayon(0),
        Par::Single => gemm::Parallelism::None,
    };
    // SAFETY: every view was checked above to stay inside its slice, `dst` is borrowed
    // mutably and so cannot alias `a` or `b`, and the dimensions agree.
    unsafe {
        gemm::gemm(
            dst.rows,
            dst.cols,
            a.cols,
            dst.data.as_mut_ptr(),
            dst.col_stride as isize,
            dst.row_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
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
    );
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
        );
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
