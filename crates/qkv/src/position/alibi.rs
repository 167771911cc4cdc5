//! ALiBi (Attention with Linear Biases, used by BLOOM): no position vectors at all;
//! head h adds m_h · (j − i) to the score of query i on key j, a penalty growing
//! linearly with distance, with a different slope m_h per head. Attention applies it
//! on the fly through [`crate::attention::Bias::Alibi`].
//!
//! Training: ALiBi has no parameters (the slopes are fixed by the head count), so it
//! has no backward of its own. Its bias is added to the scores inside attention, and
//! the gradient through it is part of the attention backward's dS, which flows on to Q
//! and K unchanged by the (constant) bias.

use crate::tensor::Tensor;

/// Slopes for `n_heads` heads, as BLOOM computes them: for n a power of two, the
/// geometric sequence 2^(−8/n), 2^(−16/n), …; otherwise the slopes of the largest
/// power of two below n, followed by every other slope of twice that many heads.
pub fn alibi_slopes(n_heads: usize) -> Vec<f32> {
    if n_heads == 0 {
        return Vec::new();
    }
    let closest = 1usize << n_heads.ilog2();
    let base = |n: usize| 2f64.powf(-(2f64.powf(-((n as f64).log2() - 3.0)))) as f32;
    let b = base(closest);
    let mut slopes: Vec<f32> = (1..=closest).map(|p| b.powf(p as f32)).collect();
    if closest != n_heads {
        let extra = base(2 * closest);
        let remaining = (n_heads - closest).min(closest);
        slopes.extend((0..remaining).map(|i| extra.powf((2 * i + 1) as f32)));
    }
    slopes
}

/// BLOOM's explicit ALiBi tensor `[B·H, 1, S]`: slope_h · position of key j among the
/// real tokens of its row (cumsum(mask) − 1, and 0 on padding). Attention itself uses
/// the relative form slope·(j − i), which differs from this by a constant per query
/// row and so gives the same softmax; this form exists to check against Hugging Face.
/// attention_mask: [B, S] with 1 = token.
pub fn bloom_alibi_tensor(attention_mask: &[i64], batch: usize, n_heads: usize) -> Tensor {
    let s = attention_mask.len() / batch.max(1);
    let slopes = alibi_slopes(n_heads);
    let mut out = Tensor::zeros(&[batch * n_heads, 1, s]);
    for b in 0..batch {
        let mask = &attention_mask[b * s..(b + 1) * s];
        let mut seen = 0i64;
        for (j, &m) in mask.iter().enumerate() {
            seen += m;
            let pos = ((seen - 1) * m) as f32;
            for (h, slope) in slopes.iter().enumerate() {
                out.data_mut()[(b * n_heads + h) * s + j] = slope * pos;
            }
        }
    }
    out
}
