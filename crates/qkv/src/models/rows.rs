//! Continuous batching's decoding step: sequences of different lengths, each with its
//! own KV cache, advance by one token together. The linear layers run once over all of
//! them, so a step reads the weights once however many sequences share it; attention
//! runs per sequence over its own cache.
//!
//! A sequence joins by a prefill of its prompt into a fresh one-row cache
//! ([`Transformer::prefill`]) and leaves by dropping its cache, between any two steps.

use super::net::arch::{ModelKind, Position};
use super::net::forward::{Caches, Side, StackInput};
use super::transformer::Transformer;
use crate::attention::KvCache;
use crate::batch::too_long;
use crate::error::{Error, Result};
use crate::ops::on_pool;
use crate::tensor::Tensor;

impl Transformer {
    /// Decoder-only: `tokens[i]` continues the sequence cached in `caches[i]` (one row
    /// each, any lengths) → logits `[N, 1, V]`, row i for sequence i. Every check runs
    /// before any cache changes, so a rejected step leaves them all usable.
    pub fn step_rows(&self, tokens: &[usize], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        self.needs(ModelKind::Decoder, "step_rows")?;
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
        if matches!(self.arch.position, Position::Relative { .. }) {
            return Err(Error::Unsupported(
                "per-sequence decoding of a relative-position (T5) decoder".into(),
            ));
        }
        let layers = self.arch.stack().layers;
        let max = self.arch.max_positions();
        let mut positions = Vec::with_capacity(caches.len());
        for (i, cache) in caches.iter().enumerate() {
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
            let p = cache.real_len(0);
            if let Some(max) = max.filter(|&m| p >= m) {
                return Err(too_long(p, max));
            }
            positions.push(p);
        }
        let batch = crate::batch::TokenBatch::new(tokens.to_vec(), None, tokens.len(), 1)?;
        batch.check_vocab(self.arch.vocab)?;
        for cache in caches.iter_mut() {
            cache.begin_step(&[true], 1, max)?;
        }
        let input = StackInput {
            ids: tokens.to_vec(),
            types: None,
            b: tokens.len(),
            t: 1,
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
                Caches::PerRow(caches),
                None,
                false,
                false,
            )?;
            Ok(net.head(out.h, false)?.0)
        })
    }
}
