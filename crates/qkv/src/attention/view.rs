//! `HeadsView`: a `[B, L, N, E]` block of per-head vectors read in place, whose batch
//! rows may lie further apart than L·N·E. Within a batch row the vectors lie
//! positions-major (`[L, N, E]`, qkv's layout) or heads-major (`[N, L, E]`, PyTorch's
//! SDPA layout and the KV cache's), so either is read without a copy. A KV cache with
//! spare capacity is heads-major with its heads' runs further apart than L·E: attention
//! reads their first L positions without copying them out.

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
        let run_len = self.run_len().expect("the bounds were checked");
        for start in self.runs() {
            let run = &self.data[start..][..run_len];
            if let Some(i) = crate::tensor::first_non_finite(run) {
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

    /// Whether the vectors lie in one of the two layouts: positions-major with a batch
    /// row's L·N·E elements one run, or heads-major with each head's L·E one run (runs
    /// at least that far apart). What the finiteness scan and the bounds check rely on.
    fn in_runs(&self) -> bool {
        let positions_major =
            self.head_stride == self.dim && self.pos_stride == self.heads.saturating_mul(self.dim);
        let heads_major =
            self.pos_stride == self.dim && self.head_stride >= self.len.saturating_mul(self.dim);
        positions_major || heads_major
    }

    /// Whether a head's L positions are one run (heads-major), not a batch row's.
    fn head_runs(&self) -> bool {
        self.heads > 1 && self.pos_stride == self.dim && self.head_stride != self.dim
    }

    /// Elements in each of [`Self::runs`] (`None` past `usize`).
    pub(super) fn run_len(&self) -> Option<usize> {
        let len = self.len.checked_mul(self.dim);
        match self.head_runs() {
            true => len,
            false => len?.checked_mul(self.heads),
        }
    }

    /// Where each contiguous run of viewed elements starts (layout checked): one per
    /// batch row, or per head of it (heads-major).
    pub(super) fn runs(&self) -> impl Iterator<Item = usize> + '_ {
        let per_row = if self.head_runs() { self.heads } else { 1 };
        (0..self.batch * per_row).map(move |i| self.offset(i / per_row, 0, i % per_row))
    }

    /// The viewed vectors copied into a contiguous positions-major `[B, L, N, E]` block.
    pub fn gather_positions_major(&self) -> Vec<T>
    where
        T: Copy,
    {
        let mut out = Vec::with_capacity(self.batch * self.len * self.heads * self.dim);
        for b in 0..self.batch {
            for l in 0..self.len {
                for n in 0..self.heads {
                    out.extend_from_slice(&self.data[self.offset(b, l, n)..][..self.dim]);
                }
            }
        }
        out
    }

    /// Checks that the view stays inside its buffer, naming it otherwise.
    pub fn check_bounds(&self, name: &str) -> Result<()> {
        // a batch row's extent: its last run's start plus the run
        let last_run = match self.head_runs() {
            true => (self.heads - 1).checked_mul(self.head_stride),
            false => Some(0),
        };
        let row = last_run
            .zip(self.run_len())
            .and_then(|(s, n)| s.checked_add(n));
        let needed = match (self.batch, row) {
            (0, Some(_)) => Some(0),
            (b, Some(row)) => (b - 1)
                .checked_mul(self.batch_stride)
                .and_then(|x| x.checked_add(row)),
            (_, None) => None,
        };
        let fits = row.is_some_and(|row| self.batch_stride >= row)
            && needed.is_some_and(|n| n <= self.data.len())
            && self.in_runs();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A heads-major store with spare capacity (a KV cache's: 2 heads, 3 of 5 positions
    /// in use, width 2): the view fits, its scan reads each head's first 3 positions
    /// and nothing past them, and the gather puts the vectors back positions-major.
    #[test]
    fn heads_major_runs_with_spare_capacity() {
        let (heads, cap, len, dim) = (2, 5, 3, 2);
        let mut data: Vec<f32> = (0..heads * cap * dim).map(|i| i as f32).collect();
        let strides = [heads * cap * dim, dim, cap * dim];
        // past position 3 of head 0: spare, not viewed
        data[len * dim] = f32::NAN;
        let v = HeadsView::strided(&data, [1, len, heads, dim], strides);
        v.check_bounds("kv").unwrap();
        v.check_finite("kv").unwrap();
        assert_eq!(
            v.gather_positions_major(),
            [0.0, 1.0, 10.0, 11.0, 2.0, 3.0, 12.0, 13.0, 4.0, 5.0, 14.0, 15.0]
        );
        // head 1, position 2: viewed
        data[cap * dim + 2 * dim + 1] = f32::INFINITY;
        let v = HeadsView::strided(&data, [1, len, heads, dim], strides);
        let msg = v.check_finite("kv").unwrap_err().to_string();
        assert!(msg.contains("kv") && msg.contains("15"), "{msg}");
        // runs closer than L·E overlap: refused
        let close = HeadsView::strided(
            &data,
            [1, len, heads, dim],
            [heads * cap * dim, dim, 2 * dim],
        );
        assert!(close.check_bounds("kv").is_err());
        // the last head's run past the buffer: refused
        let short = &data[..cap * dim + len * dim - 1];
        let v = HeadsView::strided(short, [1, len, heads, dim], strides);
        assert!(v.check_bounds("kv").is_err());
    }
}
