//! Learned absolute positions (BERT, GPT-2): row p of a trained `[P, C]` table is added
//! to the token embedding at position p. P caps the sequence length.
//!
//! Training: the table is a parameter. The forward is `x += table[pos]` (see
//! [`LearnedPositions::add_to`]), so the gradient of the looked-up rows is the gradient
//! of x itself, unchanged, and the table's gradient is exactly
//! [`Embedding::backward`] on `self.table`, called with `positions` as the ids and that
//! same dx as dy: row p accumulates the sum of dx over every token at position p. The
//! residual stream's dx passes through the addition untouched. Nothing here duplicates
//! it.

use crate::error::{Error, Result};
use crate::layers::Embedding;
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct LearnedPositions {
    pub table: Embedding,
}

impl LearnedPositions {
    pub fn new(table: Tensor) -> Result<Self> {
        Ok(LearnedPositions {
            table: Embedding::new(table)?,
        })
    }

    pub fn max_positions(&self) -> usize {
        self.table.vocab_size()
    }

    /// positions: N → [N, C]. A position past the table is "sequence longer than the
    /// model's positions", reported as such.
    pub fn forward(&self, positions: &[usize]) -> Result<Tensor> {
        let max = self.max_positions();
        if let Some(&p) = positions.iter().find(|&&p| p >= max) {
            return Err(Error::OutOfRange {
                what: "position (sequence longer than the model's learned positions)".into(),
                index: p,
                size: max,
            });
        }
        self.table.forward(positions)
    }

    /// Adds the encodings of `positions` (len N) to x: [N, C] in place.
    pub fn add_to(&self, x: &mut Tensor, positions: &[usize]) -> Result<()> {
        let pe = self.forward(positions)?;
        if pe.shape() != x.shape() {
            return Err(Error::shape("x", format!("{:?}", pe.shape()), x.shape()));
        }
        for (a, b) in x.data_mut().iter_mut().zip(pe.data()) {
            *a += b;
        }
        Ok(())
    }
}
