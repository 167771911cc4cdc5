//! Text generation: greedy decoding, sampling (temperature, top-k, top-p) with a seed,
//! and beam search (`beam.rs`), for decoder-only and encoder-decoder models,
//! stopping on end-of-sequence. A folder's `generation_config.json` may ban token
//! sequences and force EOS at the last step, as transformers' logits processors do.
//! Every step feeds only the new tokens; the KV cache holds the past.

use super::beam;
use super::chooser::Chooser;
use super::grammar::Constraint;
use super::options::{check, GenerateOptions, Sampling};
use super::sampling::choose;
use crate::attention::KvCache;
use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::models::net::arch::ModelKind;
use crate::models::transformer::Transformer;
use crate::rng::Rng;
use crate::tensor::Tensor;

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
            let mut cached = Cached::new(model, &rows)?;
            let first = model.prefill(&rows, &mut cached.cache)?;
            beam::search(opts, prefix, first, |tokens, from| {
                cached.select_rows(from)?;
                cached.step(&TokenBatch::new(tokens.to_vec(), None, n, 1)?)
            })
        });
    }
    let mut cached = Cached::new(model, prompt)?;
    let first = model.prefill(prompt, &mut cached.cache)?;
    decode_loop(first, &prefixes, opts, on_token, |tokens| {
        cached.step(tokens)
    })
}

/// A causal model's cache through decoding. transformers' Phi-3 generation
/// (`prepare_inputs_for_generation`) drops the cache when a LongRoPE model's sequence
/// first passes its pre-training length and recomputes the whole sequence, so that
/// every key, not only the later ones, rotates with the long factors; for such a model
/// the tokens seen so far are kept to do the same.
struct Cached<'m> {
    model: &'m Transformer,
    cache: KvCache,
    /// the pre-training length and the tokens so far (prompt included), for LongRoPE
    seen: Option<(usize, TokenBatch)>,
}

impl<'m> Cached<'m> {
    fn new(model: &'m Transformer, prompt: &TokenBatch) -> Result<Self> {
        Ok(Cached {
            model,
            cache: model.new_cache(prompt.batch),
            seen: model.long_rope_switch().map(|at| (at, prompt.clone())),
        })
    }

    /// Logits of `tokens` (one column) after the cached ones.
    fn step(&mut self, tokens: &TokenBatch) -> Result<Tensor> {
        if let Some((at, seen)) = &mut self.seen {
            *seen = seen.append(tokens)?;
            // the cache holds exactly the pre-training length: the new token is the
            // first past it
            if self.cache.len() == *at {
                self.cache = self.model.new_cache(seen.batch);
                return self.model.forward_cached(seen, &mut self.cache);
            }
        }
        self.model.forward_cached(tokens, &mut self.cache)
    }

    /// Keeps rows `from` (a beam search's survivors), in that order.
    fn select_rows(&mut self, from: &[usize]) -> Result<()> {
        self.cache = self.cache.select_rows(from)?;
        if let Some((_, seen)) = &mut self.seen {
            *seen = seen.select_rows(from)?;
        }
        Ok(())
    }
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

/// Continues one prompt of a decoder-only model with its tokens held to `constraint`'s
/// grammar, calling `on_token` with each as it is chosen. One sequence, stepped with a
/// [`Chooser`] so that the grammar's mask applies before each choice; it ends at an
/// end-of-sequence token, when the grammar is complete, or at the length. Beam search is
/// refused (by the chooser).
pub fn generate_constrained(
    model: &Transformer,
    prompt: &[usize],
    opts: &GenerateOptions,
    constraint: Constraint,
    on_token: &mut dyn FnMut(usize),
) -> Result<Vec<usize>> {
    if model.kind() != ModelKind::Decoder {
        return Err(Error::Unsupported(format!(
            "{}: structured output is for decoder-only models",
            model.info().architecture
        )));
    }
    let batch = TokenBatch::single(prompt.to_vec())?;
    let mut chooser = Chooser::new(opts.clone(), prompt.to_vec())?.constrained(constraint);
    let mut cached = Cached::new(model, &batch)?;
    let mut logits = model.prefill(&batch, &mut cached.cache)?;
    loop {
        let v = logits.shape()[2];
        let tok = chooser.choose(&logits.data()[logits.data().len() - v..])?;
        on_token(tok);
        if chooser.finished().is_some() {
            return Ok(chooser.tokens().to_vec());
        }
        logits = cached.step(&TokenBatch::single(vec![tok])?)?;
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
