//! Beam search for one prompt, step for step as transformers' `generate(num_beams=N)`
//! runs it (the vectorised form of 4.5x), so that the same config gives the same
//! tokens:
//!
//! - each step scores every beam's continuations: log-softmax of the logits, the
//!   banned and forced tokens applied (then log-softmax again with
//!   `renormalize_logits`), plus the beam's running score;
//! - the best K = max(2, 1 + #EOS)·N continuations are kept; those ending in EOS or at
//!   the length limit are candidates for the finished list (only if among the best N),
//!   scored `sum of log-probs / generated_length^length_penalty`; the best N others run on;
//! - the finished list keeps the best N hypotheses; the search stops when it is full
//!   and `early_stopping` is true, when no running beam can beat its worst entry
//!   (`false`: judged at the current length; `"never"`: at the longest allowed length
//!   when the penalty favours length), or when every continuation has stopped.
//!
//! Ties between equal scores go to the earlier beam and the lower token id.

use super::config::EarlyStopping;
use super::options::GenerateOptions;
use crate::error::Result;
use crate::tensor::Tensor;

/// transformers' stand-in for "never": added to the score of what may not be chosen.
const NEVER: f32 = -1.0e9;

#[derive(Clone)]
struct Hypothesis {
    tokens: Vec<usize>,
    score: f32,
    finished: bool,
}

/// The generated tokens of the best hypothesis for one prompt. `prefix` is what the
/// decoder has read before the first new token (the prompt, or the decoder start
/// token), `first` the logits `[N, T, V]` after it (N identical rows, one per beam);
/// `step(tokens, from)` must reorder the cache so that row i continues beam `from[i]`,
/// feed `tokens[i]` to row i, and return the logits `[N, 1, V]`.
pub(crate) fn search(
    opts: &GenerateOptions,
    prefix: &[usize],
    first: Tensor,
    mut step: impl FnMut(&[usize], &[usize]) -> Result<Tensor>,
) -> Result<Vec<usize>> {
    let n = opts.search.num_beams;
    let keep = 2.max(1 + opts.eos.len()) * n;
    let penalty = |len: usize| (len as f64).powf(f64::from(opts.search.length_penalty)) as f32;
    let mut running: Vec<Hypothesis> = (0..n)
        .map(|b| Hypothesis {
            tokens: Vec::new(),
            score: if b == 0 { 0.0 } else { NEVER },
            finished: false,
        })
        .collect();
    let mut done = vec![
        Hypothesis {
            tokens: Vec::new(),
            score: NEVER,
            finished: false,
        };
        n
    ];
    let mut improvable = true;
    let mut logits = first;
    for generated in 0..opts.max_new_tokens {
        let v = *logits
            .shape()
            .last()
            .expect("logits have a vocabulary axis");
        let t = logits.shape()[1];
        // every continuation's accumulated score, [N·V]
        let mut total = Vec::with_capacity(n * v);
        for (b, beam) in running.iter().enumerate() {
            let row = &logits.data()[(b * t + t - 1) * v..][..v];
            let mut scores = log_softmax(row);
            opts.process(&mut scores, prefix, &beam.tokens);
            if opts.search.renormalize_logits {
                scores = log_softmax(&scores);
            }
            total.extend(scores.iter().map(|s| s + beam.score));
        }
        let candidates = best(&total, keep);
        let last = generated + 1 == opts.max_new_tokens;
        let stops: Vec<bool> = candidates
            .iter()
            .map(|&i| last || opts.eos.contains(&(i % v)))
            .collect();
        let extend = |i: usize| {
            let mut tokens = running[i / v].tokens.clone();
            tokens.push(i % v);
            tokens
        };

        // the best N that did not stop run on
        let run_scores: Vec<f32> = candidates
            .iter()
            .zip(&stops)
            .map(|(&i, &s)| total[i] + if s { NEVER } else { 0.0 })
            .collect();
        let chosen = best(&run_scores, n);
        let from: Vec<usize> = chosen.iter().map(|&c| candidates[c] / v).collect();
        let next_running: Vec<Hypothesis> = chosen
            .iter()
            .map(|&c| Hypothesis {
                tokens: extend(candidates[c]),
                score: run_scores[c],
                finished: false,
            })
            .collect();

        // stopped ones among the best N join the finished list if they beat it
        let full =
            done.iter().all(|h| h.finished) && opts.search.early_stopping == EarlyStopping::Done;
        let mut merged = done.clone();
        for (k, (&i, &stopped)) in candidates.iter().zip(&stops).enumerate() {
            let just_finished = stopped && k < n;
            let mut score = total[i] / penalty(generated + 1);
            if full {
                score += NEVER;
            }
            if !improvable {
                score += NEVER;
            }
            if !just_finished {
                score += NEVER;
            }
            merged.push(Hypothesis {
                tokens: extend(i),
                score,
                finished: just_finished,
            });
        }
        let order = best(&merged.iter().map(|h| h.score).collect::<Vec<_>>(), n);
        done = order.iter().map(|&k| merged[k].clone()).collect();
        running = next_running;

        // can a running beam still beat the worst finished one?
        let length = match opts.search.early_stopping {
            EarlyStopping::Never if opts.search.length_penalty > 0.0 => opts.max_new_tokens,
            _ => generated + 1,
        };
        let best_possible = running[0].score / penalty(length);
        let worst = done.iter().map(|h| h.score).fold(f32::INFINITY, f32::min);
        improvable &= done
            .iter()
            .any(|h| best_possible > if h.finished { worst } else { NEVER });
        let all_done =
            done.iter().all(|h| h.finished) && opts.search.early_stopping == EarlyStopping::Done;
        if !improvable || all_done || stops.iter().all(|&s| s) || last {
            break;
        }
        let tokens: Vec<usize> = running.iter().map(|h| *h.tokens.last().unwrap()).collect();
        logits = step(&tokens, &from)?;
    }
    Ok(done.swap_remove(0).tokens)
}

/// Indices of the `k` largest values, largest first; ties to the lower index.
fn best(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// log(softmax(x)) of one row, in f32 as torch computes it: x − max − ln Σ e^(x − max).
pub(crate) fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return row.to_vec();
    }
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    let ln = sum.ln();
    row.iter().map(|&x| x - max - ln).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_breaks_ties_by_index_and_log_softmax_normalises() {
        assert_eq!(best(&[1.0, 3.0, 3.0, f32::NEG_INFINITY, 2.0], 3), [1, 2, 4]);
        let lp = log_softmax(&[1.0, 2.0, f32::NEG_INFINITY]);
        let total: f32 = lp.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6 && lp[2] == f32::NEG_INFINITY);
    }
}
