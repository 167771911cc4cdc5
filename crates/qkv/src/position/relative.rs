//! T5's relative position bias: the distance j − i between key and query is mapped
//! to one of `num_buckets` buckets (exact for small distances, logarithmic up to
//! `max_distance`, one bucket beyond), and each bucket has a learned bias per head.
//! Bidirectional (encoder) buckets keep the sign; causal (decoder) ones only look back.
//!
//! Training: the table is a parameter. The attention backward returns the gradient of
//! the dense bias it was given (`attention_backward(.., want_dbias = true)`), and
//! [`RelativeBias::backward`] scatters it back onto the buckets.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Bucket of `relative_position` = key position − query position, as in Hugging Face's
/// `T5Attention._relative_position_bucket`, with its float32 rounding.
pub fn relative_position_bucket(
    relative_position: i64,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let mut buckets = num_buckets as i64;
    let mut bucket = 0i64;
    let distance = if bidirectional {
        buckets /= 2;
        if relative_position > 0 {
            bucket += buckets;
        }
        relative_position.abs()
    } else {
        (-relative_position).max(0)
    };
    let max_exact = buckets / 2;
    if distance < max_exact {
        return (bucket + distance) as usize;
    }
    // log(d / max_exact) / log(max_distance / max_exact) · (buckets − max_exact), in
    // f32 as torch computes it, truncated towards zero.
    let ratio = (distance as f32 / max_exact as f32).ln();
    let span = ((max_distance as f64 / max_exact as f64).ln()) as f32;
    let large = max_exact + (ratio / span * (buckets - max_exact) as f32) as i64;
    (bucket + large.min(buckets - 1)) as usize
}

/// The learned table `[num_buckets, H]` and the bucketing that indexes it.
#[derive(Clone, Debug)]
pub struct RelativeBias {
    pub table: Tensor,
    pub bidirectional: bool,
    pub max_distance: usize,
}

impl RelativeBias {
    pub fn new(table: Tensor, bidirectional: bool, max_distance: usize) -> Result<Self> {
        table.expect_shape("relative_attention_bias.weight", &[None, None])?;
        if table.shape()[0] < 2 || max_distance == 0 {
            return Err(Error::invalid(
                "relative_attention_num_buckets",
                "need at least 2 buckets and a positive max_distance",
            ));
        }
        Ok(RelativeBias {
            table,
            bidirectional,
            max_distance,
        })
    }

    pub fn num_heads(&self) -> usize {
        self.table.shape()[1]
    }

    /// Each (query i, key j) of a T×S score matrix with its bucket, queries at
    /// offset..offset+T and keys at 0..S.
    fn buckets(
        &self,
        t: usize,
        s: usize,
        offset: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let nb = self.table.shape()[0];
        (0..t).flat_map(move |i| {
            (0..s).map(move |j| {
                let rel = j as i64 - (i + offset) as i64;
                (
                    i,
                    j,
                    relative_position_bucket(rel, self.bidirectional, nb, self.max_distance),
                )
            })
        })
    }

    /// Bias `[1, H, T, S]` for T queries at positions offset..offset+T against S keys
    /// at 0..S (offset > 0 when decoding with a cache).
    pub fn compute(&self, t: usize, s: usize, offset: usize) -> Tensor {
        let h_n = self.num_heads();
        let mut out = Tensor::zeros(&[1, h_n, t, s]);
        for (i, j, bucket) in self.buckets(t, s, offset) {
            for h in 0..h_n {
                out.data_mut()[(h * t + i) * s + j] = self.table.data()[bucket * h_n + h];
            }
        }
        out
    }

    /// Backward of [`RelativeBias::compute`]: `dbias` `[N, H, T, S]` (N ≥ 1, usually 1:
    /// the gradient the attention backward returns for the dense bias, already summed
    /// over the batch it was broadcast along) is **added** into `grads` `[num_buckets, H]`,
    /// the gradient of the table. `offset` is the forward's query offset.
    ///
    /// The forward copied table[bucket(j − (i + offset)), h] to bias[·, h, i, j], so each
    /// table entry's gradient is the sum of dbias over every (i, j) that falls in its
    /// bucket (and over N).
    pub fn backward(&self, dbias: &Tensor, offset: usize, grads: &mut Tensor) -> Result<()> {
        let (nb, h_n) = (self.table.shape()[0], self.num_heads());
        dbias.expect_shape("relative bias gradient", &[None, Some(h_n), None, None])?;
        grads.expect_shape("relative bias table gradient", &[Some(nb), Some(h_n)])?;
        let (n, t, s) = (dbias.shape()[0], dbias.shape()[2], dbias.shape()[3]);
        let g = grads.data_mut();
        for (i, j, bucket) in self.buckets(t, s, offset) {
            for r in 0..n {
                for h in 0..h_n {
                    // from compute(): bias[r, h, i, j] = table[bucket, h]
                    g[bucket * h_n + h] += dbias.data()[((r * h_n + h) * t + i) * s + j];
                }
            }
        }
        Ok(())
    }
}
