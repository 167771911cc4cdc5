//! Text generation: greedy decoding and sampling (temperature, top-k, top-p) with a
//! seed, for decoder-only and encoder-decoder models, stopping on end-of-sequence.
//! Every step feeds only the new tokens; the KV cache holds the past.

use super::{TokenBatch, Transformer};
use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::tensor::Tensor;

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    Greedy,
    /// Applied in Hugging Face's order: temperature, then top-k, then top-p (nucleus).
    Sample {
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        seed: u64,
    },
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Stop a row when it emits one of these (the model's EOS ids by default).
    pub eos: Vec<usize>,
}

impl Sampling {
    fn validate(&self) -> Result<()> {
        if let Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } = *self
        {
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(Error::invalid(
                    "temperature",
                    format!("must be > 0, got {temperature}"),
                ));
            }
            if top_k == Some(0) {
                return Err(Error::invalid("top_k", "must be at least 1"));
            }
            if let Some(p) = top_p {
                if !(p > 0.0 && p <= 1.0) {
                    return Err(Error::invalid(
                        "top_p",
                        format!("must be in (0, 1], got {p}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Picks one token from a row of logits.
fn choose(logits: &[f32], sampling: Sampling, rng: &mut Rng) -> usize {
    let argmax = |xs: &[f32]| {
        xs.iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
                if x > best.1 {
                    (i, x)
                } else {
                    best
                }
            })
            .0
    };
    let Sampling::Sample {
        temperature,
        top_k,
        top_p,
        ..
    } = sampling
    else {
        return argmax(logits);
    };
    // Candidates sorted by logit, best first; keep the top k.
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(top_k.unwrap_or(order.len()).max(1));
    let max = logits[order[0]] / temperature;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] / temperature - max) as f64).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = top_p {
        // Smallest prefix whose mass reaches p (at least one token).
        let mut mass = 0.0;
        let keep = probs
            .iter()
            .position(|&q| {
                mass += q;
                mass >= p as f64
            })
            .map_or(probs.len(), |i| i + 1);
        order.truncate(keep);
        probs.truncate(keep);
        let kept: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= kept);
    }
    let mut u = rng.uniform();
    for (&i, &q) in order.iter().zip(&probs) {
        if u < q {
            return i;
        }
        u -= q;
    }
    *order.last().expect("at least one candidate")
}

/// Last position's logits of each row: logits [B, T, V] → B rows of V.
fn last_rows(logits: &Tensor) -> Vec<&[f32]> {
    let (b, t, v) = (logits.shape()[0], logits.shape()[1], logits.shape()[2]);
    (0..b)
        .map(|r| &logits.data()[((r * t) + t - 1) * v..][..v])
        .collect()
}

/// Called with (row, token) for each token as it is chosen, in order.
pub type OnToken<'a> = &'a mut dyn FnMut(usize, usize);

/// Runs the decode loop shared by both model kinds. `step` maps the tokens chosen last
/// (one per row) to next logits [B, 1, V]. Returns each row's new tokens, ending at
/// (and including) its EOS when one came.
fn decode_loop(
    first: Tensor,
    batch: usize,
    opts: &GenerateOptions,
    on_token: OnToken,
    mut step: impl FnMut(&TokenBatch) -> Result<Tensor>,
) -> Result<Vec<Vec<usize>>> {
    opts.sampling.validate()?;
    let seed = match opts.sampling {
        Sampling::Sample { seed, .. } => seed,
        Sampling::Greedy => 0,
    };
    let mut rng = Rng::new(seed);
    let mut out = vec![Vec::new(); batch];
    let mut done = vec![false; batch];
    let mut logits = first;
    for n in 0..opts.max_new_tokens {
        let mut next = Vec::with_capacity(batch);
        for (r, row) in last_rows(&logits).into_iter().enumerate() {
            let tok = choose(row, opts.sampling, &mut rng);
            if !done[r] {
                on_token(r, tok);
                out[r].push(tok);
                done[r] = opts.eos.contains(&tok);
            }
            next.push(tok);
        }
        if done.iter().all(|&d| d) || n + 1 == opts.max_new_tokens {
            break;
        }
        // Finished rows keep decoding (their tokens are discarded) so the batch stays
        // rectangular; they are marked as padding so they cannot affect anything.
        let mask = done.iter().map(|&d| !d).collect();
        logits = step(&TokenBatch::new(next, Some(mask), batch, 1)?)?;
    }
    Ok(out)
}

/// Continues each row of `prompt` (left padding allowed) with up to
/// `opts.max_new_tokens` tokens.
pub fn generate_causal(
    model: &Transformer,
    prompt: &TokenBatch,
    opts: &GenerateOptions,
) -> Result<Vec<Vec<usize>>> {
    generate_causal_each(model, prompt, opts, &mut |_, _| {})
}

/// [`generate_causal`], calling `on_token` with each token as it is chosen.
pub fn generate_causal_each(
    model: &Transformer,
    prompt: &TokenBatch,
    opts: &GenerateOptions,
    on_token: OnToken,
) -> Result<Vec<Vec<usize>>> {
    let mut cache = model.new_cache(prompt.batch);
    let first = model.forward_cached(prompt, &mut cache)?;
    decode_loop(first, prompt.batch, opts, on_token, |tokens| {
        model.forward_cached(tokens, &mut cache)
    })
}

/// Translates / transforms each source row; decoding starts from the model's decoder
/// start token. Returns the generated tokens (without the start token).
pub fn generate_seq2seq(
    model: &Transformer,
    src: &TokenBatch,
    opts: &GenerateOptions,
) -> Result<Vec<Vec<usize>>> {
    generate_seq2seq_each(model, src, opts, &mut |_, _| {})
}

/// [`generate_seq2seq`], calling `on_token` with each token as it is chosen.
pub fn generate_seq2seq_each(
    model: &Transformer,
    src: &TokenBatch,
    opts: &GenerateOptions,
    on_token: OnToken,
) -> Result<Vec<Vec<usize>>> {
    let start = model.special_tokens().decoder_start.ok_or_else(|| {
        Error::invalid(
            "decoder_start_token_id",
            "the model config does not define one",
        )
    })?;
    let enc = model.encode(src)?;
    let mut cache = model.new_cache(src.batch);
    let first = model.decode_cached(
        &TokenBatch::new(vec![start; src.batch], None, src.batch, 1)?,
        &enc,
        &mut cache,
    )?;
    decode_loop(first, src.batch, opts, on_token, |tokens| {
        model.decode_cached(tokens, &enc, &mut cache)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax_and_top_k_one_is_greedy() {
        let logits = [0.1, 2.0, -1.0, 1.9];
        let mut rng = Rng::new(1);
        assert_eq!(choose(&logits, Sampling::Greedy, &mut rng), 1);
        let k1 = Sampling::Sample {
            temperature: 5.0,
            top_k: Some(1),
            top_p: None,
            seed: 0,
        };
        assert!((0..50).all(|_| choose(&logits, k1, &mut rng) == 1));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // softmax ≈ [0.64, 0.24, 0.09, 0.03]: p = 0.7 keeps the first two.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let s = Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.7),
            seed: 0,
        };
        let mut rng = Rng::new(3);
        let picks: Vec<usize> = (0..400).map(|_| choose(&logits, s, &mut rng)).collect();
        assert!(picks.iter().all(|&i| i < 2));
        assert!(picks.contains(&0) && picks.contains(&1));
    }

    #[test]
    fn bad_sampling_settings_are_named() {
        let s = Sampling::Sample {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
        };
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
    }
}
