//! A recurrent language model: token embeddings, an [`Elman`] stack, and a linear head
//! giving next-token logits from each state. Everything the model knows about the
//! tokens before t has to fit in the state h_t: the serial memory the articles contrast
//! with attention, which looks back at every earlier token directly.

use super::elman::{Elman, ElmanCache};
use crate::error::{Error, Result};
use crate::layers::{Embedding, Linear};
use crate::module::Module;
use crate::tensor::Tensor;

crate::module! {
    /// Embedding `[V, E]` → Elman stack (E → Hd) → head (Hd → V).
    #[derive(Clone, Debug)]
    pub struct RnnLm {
        pub embed: Embedding,
        pub rnn: Elman,
        pub head: Linear,
    }
}

/// What the backward needs from the forward.
#[derive(Clone, Debug)]
pub struct RnnLmCache {
    ids: Vec<usize>,
    rnn: ElmanCache,
    /// `[B, T, Hd]`
    states: Tensor,
}

impl RnnLm {
    /// Checks that the parts chain: E = the stack's input, Hd = the head's input, and
    /// the head's output = the vocabulary.
    pub fn new(embed: Embedding, rnn: Elman, head: Linear) -> Result<Self> {
        if rnn.input_size() != embed.dim() {
            return Err(Error::invalid(
                "rnn lm",
                format!(
                    "the stack reads width {}, the embedding gives {}",
                    rnn.input_size(),
                    embed.dim()
                ),
            ));
        }
        head.weight.expect_shape(
            "rnn lm head weight",
            &[Some(embed.vocab_size()), Some(rnn.hidden_size())],
        )?;
        Ok(RnnLm { embed, rnn, head })
    }

    /// Logits `[B, T, V]` for ids `[B·T]`; row b runs `lengths[b]` tokens (all T when
    /// `None`), its later positions giving the head's bias alone.
    pub fn forward(
        &self,
        ids: &[usize],
        batch: usize,
        lengths: Option<&[usize]>,
    ) -> Result<(Tensor, RnnLmCache)> {
        if batch == 0 || ids.is_empty() || !ids.len().is_multiple_of(batch) {
            return Err(Error::invalid(
                "rnn lm batch",
                format!("{} ids do not make {batch} non-empty rows", ids.len()),
            ));
        }
        let t_n = ids.len() / batch;
        let x = self
            .embed
            .forward(ids)?
            .reshape(&[batch, t_n, self.embed.dim()])?;
        let (y, rnn) = self.rnn.forward(&x, lengths, None)?;
        let logits = self.head.forward(&y.out)?;
        let cache = RnnLmCache {
            ids: ids.to_vec(),
            rnn,
            states: y.out,
        };
        Ok((logits, cache))
    }

    /// Backward for d logits `[B, T, V]`: **accumulates** every parameter's gradient
    /// into `grads`, a tree shaped as this model.
    pub fn backward(&self, cache: &RnnLmCache, d_logits: &Tensor, grads: &mut Self) -> Result<()> {
        self.expect_grads(grads, "rnn lm grads")?;
        let d_states = self
            .head
            .backward(&cache.states, d_logits, &mut grads.head)?;
        let (d_x, _) = self
            .rnn
            .backward(&cache.rnn, &d_states, None, &mut grads.rnn)?;
        self.embed.backward(&cache.ids, &d_x, &mut grads.embed)
    }
}
