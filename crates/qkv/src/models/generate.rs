//! Text generation: greedy decoding, sampling (temperature, top-k, top-p) with a seed,
//! and beam search (`models/beam.rs`), for decoder-only and encoder-decoder models,
//! stopping on end-of-sequence. A folder's `generation_config.json` may ban token
//! sequences and force EOS at the last step, as transformers' logits processors do.
//! Every step feeds only the new tokens; the KV cache holds the past.

use super::generation_config::{GenerationConfig, Search};
use super::{beam, ModelKind, TokenBatch, Transformer};
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
    /// Beams (greedy scoring only), banned and forced tokens.
    pub search: Search,
}

impl GenerateOptions {
    /// `max_new_tokens` tokens chosen by `sampling`, stopping at `eos`: one beam,
    /// nothing banned or forced.
    pub fn new(max_new_tokens: usize, sampling: Sampling, eos: Vec<usize>) -> Self {
        GenerateOptions {
            max_new_tokens,
            sampling,
            eos,
            search: Search::default(),
        }
    }

    /// These options with a folder's beams, their scoring, and its banned and forced
    /// tokens.
    pub fn with_config(mut self, c: &GenerationConfig) -> Self {
        self.search = c.search.clone();
        self
    }

    /// Whether [`GenerateOptions::process`] can change anything: banned or forced tokens.
    fn constrained(&self) -> bool {
        !self.search.bad_words.is_empty() || !self.search.forced_eos.is_empty()
    }

    /// Applies the banned and forced tokens to one row of scores (logits or
    /// log-probabilities), for a row that has read `prefix` (prompt or decoder start)
    /// and then generated `tokens`.
    pub(crate) fn process(&self, scores: &mut [f32], prefix: &[usize], tokens: &[usize]) {
        for bad in &self.search.bad_words {
            if bad.len() == 1 && self.eos.contains(&bad[0]) {
                continue;
            }
            let (last, before) = bad.split_last().expect("bad words are non-empty");
            // does prefix ++ tokens end with `before`? (read backwards, not copied)
            let read = prefix.iter().chain(tokens);
            let ends = prefix.len() + tokens.len() >= before.len()
                && read.rev().zip(before.iter().rev()).all(|(a, b)| a == b);
            if ends {
                if let Some(s) = scores.get_mut(*last) {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
        if !self.search.forced_eos.is_empty() && tokens.len() + 1 == self.max_new_tokens {
            scores.fill(f32::NEG_INFINITY);
            for &id in &self.search.forced_eos {
                if let Some(s) = scores.get_mut(id) {
                    *s = 0.0;
                }
            }
        }
    }
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
    prefixes: &[Vec<usize>],
    opts: &GenerateOptions,
    on_token: OnToken,
    mut step: impl FnMut(&TokenBatch) -> Result<Tensor>,
) -> Result<Vec<Vec<usize>>> {
    let batch = prefixes.len();
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
            // a copy only where banned or forced tokens change the row
            let processed;
            let row = if opts.constrained() {
                let mut copy = row.to_vec();
                opts.process(&mut copy, &prefixes[r], &out[r]);
                processed = copy;
                &processed[..]
            } else {
                row
            };
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
    check(opts)?;
    let prefixes: Vec<Vec<usize>> = (0..prompt.batch).map(|r| real_tokens(prompt, r)).collect();
    if opts.search.num_beams > 1 {
        // each prompt alone (its padding dropped), its row repeated once per beam
        return each_row(&prefixes, on_token, |prefix| {
            let n = opts.search.num_beams;
            let rows = TokenBatch::new(prefix.repeat(n), None, n, prefix.len())?;
            let mut cache = model.new_cache(n);
            let first = model.prefill(&rows, &mut cache)?;
            beam::search(opts, prefix, first, |tokens, from| {
                cache = cache.select_rows(from)?;
                model.forward_cached(&TokenBatch::new(tokens.to_vec(), None, n, 1)?, &mut cache)
            })
        });
    }
    let mut cache = model.new_cache(prompt.batch);
    let first = model.prefill(prompt, &mut cache)?;
    decode_loop(first, &prefixes, opts, on_token, |tokens| {
        model.forward_cached(tokens, &mut cache)
    })
}

/// Settings no run can use: bad sampling values, or beams with sampling.
fn check(opts: &GenerateOptions) -> Result<()> {
    opts.sampling.validate()?;
    if opts.search.num_beams == 0 {
        return Err(Error::invalid("num_beams", "must be at least 1"));
    }
    if opts.search.num_beams > 1 && opts.sampling != Sampling::Greedy {
        return Err(Error::invalid(
            "num_beams",
            "beam search scores greedily here; it cannot be combined with sampling",
        ));
    }
    Ok(())
}

/// Row `r`'s real tokens (its padding left out).
fn real_tokens(batch: &TokenBatch, r: usize) -> Vec<usize> {
    let row = r * batch.len..(r + 1) * batch.len;
    batch.ids[row.clone()]
        .iter()
        .zip(&batch.mask[row])
        .filter(|(_, &real)| real)
        .map(|(&id, _)| id)
        .collect()
}

/// Runs `search` for each row and reports its tokens, in order, once the row is done
/// (a beam's tokens are known only at the end).
fn each_row(
    rows: &[Vec<usize>],
    on_token: OnToken,
    mut search: impl FnMut(&[usize]) -> Result<Vec<usize>>,
) -> Result<Vec<Vec<usize>>> {
    let mut out = Vec::with_capacity(rows.len());
    for (r, row) in rows.iter().enumerate() {
        let tokens = search(row)?;
        tokens.iter().for_each(|&t| on_token(r, t));
        out.push(tokens);
    }
    Ok(out)
}

/// Generates for each row of `prompt` with the loop the model's kind needs: a
/// continuation of the prompt for a decoder-only model, the transformation of the source
/// sentence (a translation) for an encoder-decoder.
pub fn generate_each(
    model: &Transformer,
    prompt: &TokenBatch,
    opts: &GenerateOptions,
    on_token: OnToken,
) -> Result<Vec<Vec<usize>>> {
    match model.kind() {
        ModelKind::Decoder => generate_causal_each(model, prompt, opts, on_token),
        ModelKind::EncoderDecoder => generate_seq2seq_each(model, prompt, opts, on_token),
        ModelKind::Encoder => Err(no_head(model)),
    }
}

/// Why an encoder cannot generate.
pub(crate) fn no_head(model: &Transformer) -> Error {
    Error::Unsupported(format!(
        "{} is an encoder; it has no language-model head to generate with",
        model.info().architecture
    ))
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
    check(opts)?;
    let start = model.special_tokens().decoder_start.ok_or_else(|| {
        Error::invalid(
            "decoder_start_token_id",
            "the model config does not define one",
        )
    })?;
    if opts.search.num_beams > 1 {
        let sources: Vec<Vec<usize>> = (0..src.batch).map(|r| real_tokens(src, r)).collect();
        return each_row(&sources, on_token, |source| {
            let n = opts.search.num_beams;
            let enc = model.encode(&TokenBatch::new(source.repeat(n), None, n, source.len())?)?;
            let mut cache = model.new_cache(n);
            let starts = TokenBatch::new(vec![start; n], None, n, 1)?;
            let first = model.decode_cached(&starts, &enc, &mut cache)?;
            beam::search(opts, &[start], first, |tokens, from| {
                cache = cache.select_rows(from)?;
                let next = TokenBatch::new(tokens.to_vec(), None, n, 1)?;
                model.decode_cached(&next, &enc, &mut cache)
            })
        });
    }
    let enc = model.encode(src)?;
    let mut cache = model.new_cache(src.batch);
    let first = model.decode_cached(
        &TokenBatch::new(vec![start; src.batch], None, src.batch, 1)?,
        &enc,
        &mut cache,
    )?;
    let prefixes = vec![vec![start]; src.batch];
    decode_loop(first, &prefixes, opts, on_token, |tokens| {
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
    fn banned_sequences_and_forced_eos_follow_the_tokens_read() {
        let mut opts = GenerateOptions::new(3, Sampling::Greedy, vec![0]);
        // [4] always; [1, 2] bans 2 after 1; a lone EOS is never banned
        opts.search.bad_words = vec![vec![4], vec![1, 2], vec![0]];
        let run = |opts: &GenerateOptions, prefix: &[usize], tokens: &[usize]| {
            let mut s = vec![1.0; 6];
            opts.process(&mut s, prefix, tokens);
            s.iter().map(|x| x.is_finite()).collect::<Vec<_>>()
        };
        assert_eq!(run(&opts, &[5], &[]), [true, true, true, true, false, true]);
        // the banned pair spans the prompt and the generated tokens
        assert_eq!(
            run(&opts, &[1], &[]),
            [true, true, false, true, false, true]
        );
        assert_eq!(
            run(&opts, &[3], &[5, 1]),
            [true, true, false, true, false, true]
        );
        opts.search.forced_eos = vec![0];
        // the last of 3 new tokens: only EOS is left
        assert_eq!(
            run(&opts, &[3], &[5, 5]),
            [true, false, false, false, false, false]
        );
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
