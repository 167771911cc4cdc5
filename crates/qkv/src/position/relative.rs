//! T5's relative position bias: the distance j − i between key and query is mapped
//! to one of `num_buckets` buckets (exact for small distances, logarithmic up to
//! `max_distance`, one bucket beyond), and each bucket has a learned bias per head.
//! Bidirectional (encoder) buckets keep the sign; causal (decoder) ones only look back.

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

    /// Bias `[1, H, T, S]` for T queries at positions offset..offset+T against S keys
    /// at 0..S (offset > 0 when decoding with a cache).
    pub fn compute(&self, t: usize, s: usize, offset: usize) -> Tensor {
        let (nb, h_n) = (self.table.shape()[0], self.num_heads());
        let mut out = Tensor::zeros(&[1, h_n, t, s]);
        for i in 0..t {
            for j in 0..s {
                let rel = j as i64 - (i + offset) as i64;
                let bucket =
                    relative_position_bucket(rel, self.bidirectional, nb, self.max_distance);
                for h in 0..h_n {
                    out.data_mut()[(h * t + i) * s + j] = self.table.data()[bucket * h_n + h];
                }
            }
        }
        out
    }
}
