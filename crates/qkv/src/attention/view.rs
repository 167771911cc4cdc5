//! `HeadsView`: a `[B, L, N, E]` block of per-head vectors read in place, whose batch
//! rows may lie further apart than L·N·E. A KV cache with spare capacity is such a
//! block: attention reads its first L positions without copying them out. Within a
//! batch row the vectors lie positions-major (`[L, N, E]`, qkv's layout) or heads-major
//! (`[N, L, E]`, PyTorch's SDPA layout), so either is read without a copy.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The elements are f32, or (`T = u16`) bf16 bit patterns in a bf16 KV cache.
#[derive(Clone, Copy, Debug)]
pub struct HeadsView<'a, T = f32> {
    pub data: &'a [T],
    /// B
    pub batch: usize,
    /// L: sequence positions in use
    pub len: usize,
    /// N: heads
    pub heads: usize,
    /// E: width of one head
    pub dim: usize,
    /// Elements between batch rows (≥ L·N·E).
    pub batch_stride: usize,
    /// Elements between positions l and l + 1 of one head: N·E positions-major, E
    /// heads-major.
    pub pos_stride: usize,
    /// Elements between heads n and n + 1 at one position: E positions-major, L·E
    /// heads-major.
    pub head_stride: usize,
}

impl<'a> HeadsView<'a> {
    /// The whole of a contiguous `[B, L, N, E]` tensor; `name` labels shape errors.
    pub fn of(t: &'a Tensor, name: &str) -> Result<Self> {
        t.expect_shape(name, &[None, None, None, None])?;
        let s = t.shape();
        Ok(HeadsView::positions_major(
            t.data(),
            [s[0], s[1], s[2], s[3]],
        ))
    }

    /// Views of q, k and v, each checked as `[B, L, N, E]` and named so in an error.
    pub fn of_qkv([q, k, v]: [&'a Tensor; 3]) -> Result<[Self; 3]> {
        Ok([Self::of(q, "q")?, Self::of(k, "k")?, Self::of(v, "v")?])
    }

    /// A contiguous positions-major block `[B, L, N, E]` (qkv's layout).
    pub fn positions_major(data: &'a [f32], shape: [usize; 4]) -> Self {
        let [batch, len, heads, dim] = shape;
        let strides = [len * heads * dim, heads * dim, dim];
        HeadsView::strided(data, [batch, len, heads, dim], strides)
    }

    /// A contiguous heads-major block `[B, N, L, E]` (PyTorch's `[B, H, T, D]`) viewed as
    /// `[B, L, N, E]`; `shape` is the block's own `[B, N, L, E]`.
    pub fn heads_major(data: &'a [f32], shape: [usize; 4]) -> Self {
        let [batch, heads, len, dim] = shape;
        let strides = [heads * len * dim, dim, len * dim];
        HeadsView::strided(data, [batch, len, heads, dim], strides)
    }

    /// The E-wide vector of head `n` at position `l` of batch row `b`.
    pub fn vector(&self, b: usize, l: usize, n: usize) -> &'a [f32] {
        &self.data[self.offset(b, l, n)..][..self.dim]
    }

    /// Errors on the first NaN or infinity among the viewed elements.
    pub fn check_finite(&self, name: &str) -> Result<()> {
        let row = self.len * self.heads * self.dim;
        for b in 0..self.batch {
            let start = b * self.batch_stride;
            if let Some(i) = crate::tensor::first_non_finite(&self.data[start..start + row]) {
                return Err(Error::NonFinite {
                    tensor: name.into(),
                    index: start + i,
                    value: self.data[start + i],
                });
            }
        }
        Ok(())
    }
}

impl<'a, T> HeadsView<'a, T> {
    /// `[B, L, N, E]` over `data` with the batch, position and head strides given.
    pub(super) fn strided(
        data: &'a [T],
        [batch, len, heads, dim]: [usize; 4],
        strides: [usize; 3],
    ) -> Self {
        let [batch_stride, pos_stride, head_stride] = strides;
        HeadsView {
            data,
            batch,
            len,
            heads,
            dim,
            batch_stride,
            pos_stride,
            head_stride,
        }
    }

    /// Whether the L·N·E elements of a batch row fill its first L·N·E slots, in
    /// either order: what the finiteness scan and the bounds check rely on.
    fn dense_rows(&self) -> bool {
        let positions_major =
            self.head_stride == self.dim && self.pos_stride == self.heads.saturating_mul(self.dim);
        let heads_major =
            self.pos_stride == self.dim && self.head_stride == self.len.saturating_mul(self.dim);
        positions_major || heads_major
    }

    /// Checks that the view stays inside its buffer, naming it otherwise.
    pub fn check_bounds(&self, name: &str) -> Result<()> {
        let row = self
            .len
            .checked_mul(self.heads)
            .and_then(|x| x.checked_mul(self.dim));
        let needed = match (self.batch, row) {
            (0, Some(_)) => Some(0),
            (b, Some(row)) => (b - 1)
                .checked_mul(self.batch_stride)
                .and_then(|x| x.checked_add(row)),
            (_, None) => None,
        };
        let fits = row.is_some_and(|row| self.batch_stride >= row)
            && needed.is_some_and(|n| n <= self.data.len())
            && self.dense_rows();
        if !fits {
            return Err(Error::invalid(
                name,
                format!(
                    "view [{}, {}, {}, {}] with strides (batch {}, position {}, head {}) does not fit {} elements",
                    self.batch,
                    self.len,
                    self.heads,
                    self.dim,
                    self.batch_stride,
                    self.pos_stride,
                    self.head_stride,
                    self.data.len()
                ),
            ));
        }
        Ok(())
    }

    pub fn shape(&self) -> [usize; 4] {
        [self.batch, self.len, self.heads, self.dim]
    }

    /// Flat index of element 0 of head `n` at position `l` of batch row `b`.
    pub fn offset(&self, b: usize, l: usize, n: usize) -> usize {
        b * self.batch_stride + l * self.pos_stride + n * self.head_stride
    }
}
