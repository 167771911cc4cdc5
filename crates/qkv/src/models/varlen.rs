//! Varlen batches (flash-attention's name): several whole sequences run as one row of
//! tokens, one after another, with no padding. The linear layers, norms and FFN see every real token once; each
//! sequence attends to its own tokens alone. A batch of texts of mixed lengths then
//! costs what its tokens cost, where a padded `[B, T]` batch costs B × the longest
//! (text-embeddings-inference runs its batches this way).

use super::net::arch::Position;
use super::net::footprint;
use super::net::forward::{Caches, Side, StackInput};
use super::transformer::Transformer;
use crate::batch::check_ids;
use crate::error::{Error, Result};
use crate::ops::on_pool;
use crate::tensor::Tensor;

impl Transformer {
    /// Whether [`Transformer::hidden_states_varlen`] runs this model: an encoder whose
    /// positions need no dense score bias (not T5's relative bias, not ALiBi).
    pub fn runs_varlen(&self) -> bool {
        self.arch.encoder.is_some()
            && !matches!(
                self.arch.position,
                Position::Relative { .. } | Position::Alibi
            )
    }

    /// The encoder's last hidden states for `sequences` packed into one row: `[N, C]`,
    /// N = Σ lengths, sequence i's states in its own rows in order. Each sequence is
    /// embedded from position 0 with token type 0 and attends to itself alone, so
    /// its rows equal [`Transformer::hidden_states`] of it alone (up to rounding).
    pub fn hidden_states_varlen(&self, sequences: &[&[usize]]) -> Result<Tensor> {
        if !self.runs_varlen() {
            return Err(Error::Unsupported(
                "varlen sequences through a decoder-only model or a dense score bias (T5, ALiBi)"
                    .into(),
            ));
        }
        if let Some(i) = sequences.iter().position(|s| s.is_empty()) {
            return Err(Error::invalid(
                "varlen sequences",
                format!("sequence {i} is empty"),
            ));
        }
        let lens: Vec<usize> = sequences.iter().map(|s| s.len()).collect();
        let n: usize = lens.iter().sum();
        if n == 0 {
            return Ok(Tensor::zeros(&[0, self.arch.d_model]));
        }
        // a bound from above: the sequences as a batch padded to the longest
        self.check_memory(footprint::Shapes {
            batch: lens.len(),
            source: lens.iter().copied().max().unwrap_or(0),
            target: 0,
            head: false,
            attentions: false,
        })?;
        let net = self.net();
        let ids: Vec<usize> = sequences.concat();
        check_ids(
            &ids,
            net.table(Side::Encoder).vocab_size(),
            "token id (vocabulary)",
        )?;
        let mut positions = Vec::with_capacity(n);
        for &len in &lens {
            positions.extend(net.positions(&vec![true; len], len, &[0])?);
        }
        let input = StackInput {
            ids,
            types: None,
            b: 1,
            t: n,
            positions,
            // every token is real; each sequence's keys are cut out by `Caches::Varlen`
            key_padding: Vec::new(),
            past: 0,
        };
        let out = on_pool(|| {
            net.run_stack(
                Side::Encoder,
                input,
                Caches::Varlen(&lens),
                None,
                false,
                false,
            )
        })?;
        out.h.reshape(&[n, self.arch.d_model])
    }
}
