//! Log-probabilities of a chosen token and of the likeliest alternatives, as OpenAI's
//! `logprobs` reports them. They are the model's own distribution, the log-softmax of
//! the logits before penalties, temperature or truncation (what vLLM reports by
//! default), so they equal the log-softmax of `qkv forward`'s logits at that position.

/// The most alternatives a caller may ask for (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One position's log-probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: usize,
    pub logprob: f32,
    /// The likeliest tokens, best first (ties to the lower id), with theirs.
    pub top: Vec<(usize, f32)>,
}

/// The log-probability of `token` under `logits` `[V]`, and the `top` likeliest tokens'.
/// The normaliser is summed in f64 so that a 150 000-token row loses nothing to it.
pub fn logprobs(logits: &[f32], token: usize, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let at = |i: usize| (f64::from(logits[i]) - lse) as f32;
    let better = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    let k = top.min(ids.len());
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, better);
    }
    ids.truncate(k);
    ids.sort_by(better);
    TokenLogprobs {
        token,
        logprob: at(token),
        top: ids.into_iter().map(|i| (i, at(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax_and_the_top_are_sorted() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let r = logprobs(&logits, 2, 3);
        assert!((f64::from(r.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<usize> = r.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        assert_eq!(logprobs(&logits, 0, 0).top, []);
        assert_eq!(logprobs(&logits, 0, 9).top.len(), 5);
    }
}
