//! Continuous batching's step: sequences of different lengths, each with its own KV
//! cache, advance together, each by one token (decoding) or by a chunk of its prompt
//! (joining; Sarathi-Serve's and vLLM's chunked prefill mixed into the decode step).
//! The linear layers run once over all the new tokens, so a step reads the weights once
//! however many sequences share it; attention runs per sequence over its own cache.
//!
//! A sequence leaves by dropping its cache, between any two steps.

use super::net::arch::{ModelKind, Position};
use super::net::forward::{Caches, Side, StackInput};
use super::transformer::Transformer;
use crate::attention::KvCache;
use crate::batch::{check_ids, too_long};
use crate::block::Segment;
use crate::error::{Error, Result};
use crate::ops::on_pool;
use crate::tensor::Tensor;

/// One sequence's part of a packed step ([`Transformer::step_packed`]).
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    /// Its new tokens (at least one), after those in its cache.
    pub tokens: &'a [usize],
    /// The logits of every new token (scoring a prompt), not of the last alone.
    pub all_logits: bool,
    /// The whole prompt's length while it is prefilled in chunks: RoPE scalings that
    /// depend on a call's length (dynamic, LongRoPE) then take the frequencies that one
    /// call of the whole prompt would. `None`: the chunk is a call of its own.
    pub prompt_len: Option<usize>,
}

impl Transformer {
    /// Decoder-only: `chunks[i]` continues the sequence cached in `caches[i]` (one row
    /// each, any lengths) → logits `[R, V]`: for each chunk in order, the logits of its
    /// last token, or of all its tokens with [`Chunk::all_logits`]. Every check runs
    /// before any cache changes, so a rejected step leaves them all usable.
    pub fn step_packed(&self, chunks: &[Chunk], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        self.needs(ModelKind::Decoder, "step_packed")?;
        if chunks.is_empty() || chunks.len() != caches.len() {
            return Err(Error::invalid(
                "chunks",
                format!(
                    "{} chunks for {} caches: a step takes one chunk per sequence",
                    chunks.len(),
                    caches.len()
                ),
            ));
        }
        if let Some(i) = chunks.iter().position(|c| c.tokens.is_empty()) {
            return Err(Error::invalid("chunks", format!("chunk {i} has no tokens")));
        }
        if matches!(self.arch.position, Position::Relative { .. }) {
            return Err(Error::Unsupported(
                "per-sequence decoding of a relative-position (T5) decoder".into(),
            ));
        }
        let layers = self.arch.stack().layers;
        let max = self.arch.max_positions();
        let n: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let mut positions = Vec::with_capacity(n);
        let mut segments = Vec::with_capacity(chunks.len());
        for (i, (cache, chunk)) in caches.iter().zip(chunks).enumerate() {
            cache.check_layers(layers)?;
            if cache.batch() != 1 {
                return Err(Error::invalid(
                    "kv cache",
                    format!(
                        "cache {i} holds {} rows; each sequence keeps its own",
                        cache.batch()
                    ),
                ));
            }
            let (p, len) = (cache.real_len(0), chunk.tokens.len());
            if let Some(max) = max.filter(|&m| p + len > m) {
                return Err(too_long(p + len - 1, max));
            }
            positions.extend(p..p + len);
            segments.push(Segment {
                len,
                rope_len: chunk.prompt_len.unwrap_or(0).max(p + len),
            });
        }
        let ids: Vec<usize> = chunks
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        check_ids(&ids, self.arch.vocab, "token id (vocabulary)")?;
        for (cache, chunk) in caches.iter_mut().zip(chunks) {
            let len = chunk.tokens.len();
            cache.begin_step(&vec![true; len], len, max)?;
        }
        let input = StackInput {
            ids,
            types: None,
            b: 1,
            t: n,
            positions,
            // every cached key of a one-row cache is real
            key_padding: Vec::new(),
            past: 0,
        };
        on_pool(|| {
            let net = self.net();
            let out = net.run_stack(
                Side::Decoder,
                input,
                Caches::Packed(caches, &segments),
                None,
                false,
                false,
            )?;
            // the head over the rows whose logits are wanted alone: every row when each
            // chunk wants all of its (decoding rows of one token each)
            let c = self.arch.d_model;
            let every = chunks.iter().all(|k| k.all_logits || k.tokens.len() == 1);
            let h = match every {
                true => out.h.reshape(&[1, n, c])?,
                false => {
                    let mut rows = Vec::new();
                    let mut end = 0;
                    for chunk in chunks {
                        let start = end;
                        end += chunk.tokens.len();
                        let from = if chunk.all_logits { start } else { end - 1 };
                        rows.extend_from_slice(&out.h.data()[from * c..end * c]);
                    }
                    Tensor::new(&[1, rows.len() / c, c], rows)?
                }
            };
            let r = h.shape()[1];
            let logits = net.head(h, false)?.0;
            let v = logits.shape()[2];
            logits.reshape(&[r, v])
        })
    }

    /// Decoder-only: `tokens[i]` continues the sequence cached in `caches[i]` (one row
    /// each, any lengths) → logits `[N, 1, V]`, row i for sequence i: a packed step of
    /// one-token chunks.
    pub fn step_rows(&self, tokens: &[usize], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        if tokens.is_empty() || tokens.len() != caches.len() {
            return Err(Error::invalid(
                "tokens",
                format!(
                    "{} tokens for {} caches: a step takes one token per sequence",
                    tokens.len(),
                    caches.len()
                ),
            ));
        }
        let chunks: Vec<Chunk> = tokens
            .chunks(1)
            .map(|t| Chunk {
                tokens: t,
                all_logits: false,
                prompt_len: None,
            })
            .collect();
        let logits = self.step_packed(&chunks, caches)?;
        let v = logits.shape()[1];
        logits.reshape(&[tokens.len(), 1, v])
    }
}
