//! The operands of a product: strided views into slices (so a transposed weight, one
//! head inside `[B,T,H,D]` or a K/V tile is read in place), and how a product may
//! use the threads.

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

    pub(super) fn fits(&self) -> bool {
        span(self.rows, self.cols, self.row_stride, self.col_stride)
            .is_some_and(|n| n <= self.data.len())
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

    pub(super) fn fits(&self) -> bool {
        span(self.rows, self.cols, self.row_stride, self.col_stride)
            .is_some_and(|n| n <= self.data.len())
    }
}

/// Number of elements a strided matrix reaches (0 for an empty one); `None` past
/// `usize`, which no slice holds.
fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

/// What a product writes: C ← (`add` ? C : 0) + `alpha`·(the product).
pub(crate) struct Update<'a> {
    pub c: MatMut<'a>,
    pub alpha: f32,
    pub add: bool,
}

impl<'a> Update<'a> {
    pub(crate) fn of(c: MatMut<'a>, alpha: f32, add: bool) -> Self {
        Update { c, alpha, add }
    }
}

/// Threading for one product. Kernels that already run inside a parallel loop pass
/// `Single`, so threads are not oversubscribed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Par {
    /// Split the product over all rayon threads when it is large enough.
    Auto,
    Single,
}
