//! The RNN encoder-decoder of 2014, with and without attention.
//!
//! The encoder is an [`Elman`] stack over the source embeddings. The decoder is one
//! Elman cell whose input at step i is the previous target token's embedding joined
//! with a context c_i, starting from the encoder's final state:
//!
//! - **without attention** (Cho et al., Sutskever et al.), c_i is the encoder's final
//!   state for every step: the whole source squeezed into one vector;
//! - **with attention** (Bahdanau et al.), c_i = [`Additive`] attention of the previous
//!   decoder state over every encoder state.
//!
//! `s_i = tanh(W_ih·[y_{i−1}; c_i] + b_ih + W_hh·s_{i−1} + b_hh)`, and the logits of step
//! i are `W_out·[s_i; c_i] + b_out`. Training feeds the target tokens (teacher forcing).

use super::additive::{Additive, AdditiveStep};
use super::elman::{Elman, ElmanCache, ElmanLayer};
use crate::error::{Error, Result};
use crate::layers::{Embedding, Linear};
use crate::module::Module;
use crate::tensor::Tensor;

crate::module! {
    /// The encoder-decoder's parameters. E: embedding width, Hd: state width.
    #[derive(Clone, Debug)]
    pub struct RnnSeq2Seq {
        /// `[V_src, E]`
        pub source_embed: Embedding,
        /// `[V_tgt, E]`
        pub target_embed: Embedding,
        /// E → Hd, any number of layers
        pub encoder: Elman,
        /// the decoder cell: input E + Hd (embedding, then context), state Hd
        pub decoder: ElmanLayer,
        /// `None`: the 2014 baseline, whose context is the encoder's final state
        pub attention: Option<Additive>,
        /// 2·Hd → V_tgt, reading [s_i; c_i]
        pub out: Linear,
    }
}

/// A batch: B source rows of S tokens (padded, with lengths) and B target-input rows
/// of T tokens.
#[derive(Clone, Debug)]
pub struct Seq2SeqInput<'a> {
    /// `[B·S]` source ids
    pub source: &'a [usize],
    /// B real source lengths, each in 1..=S
    pub source_lengths: &'a [usize],
    /// `[B·T]` decoder inputs (the target shifted right)
    pub target: &'a [usize],
    pub batch: usize,
}

/// What the backward needs from the forward.
#[derive(Clone, Debug)]
pub struct Seq2SeqCache {
    source: Vec<usize>,
    target: Vec<usize>,
    encoder: ElmanCache,
    /// `[B, S, Hd]` encoder states
    memory: Tensor,
    /// `[B, S, A]` projected keys (attention only)
    proj: Option<Tensor>,
    /// per step: the cell's input `[B, E + Hd]`, its state `[B, Hd]`, the attention
    steps: Vec<(Tensor, Tensor, Option<AdditiveStep>)>,
    /// `[B, T, 2·Hd]`
    features: Tensor,
}

impl RnnSeq2Seq {
    /// Checks that the parts fit together.
    pub fn new(
        source_embed: Embedding,
        target_embed: Embedding,
        encoder: Elman,
        decoder: ElmanLayer,
        attention: Option<Additive>,
        out: Linear,
    ) -> Result<Self> {
        let (e, hd) = (source_embed.dim(), encoder.hidden_size());
        if target_embed.dim() != e || encoder.input_size() != e {
            return Err(Error::invalid(
                "rnn seq2seq",
                format!(
                    "embedding widths {} and {} and encoder input {} must be equal",
                    e,
                    target_embed.dim(),
                    encoder.input_size()
                ),
            ));
        }
        decoder
            .weight_ih
            .expect_shape("decoder weight_ih", &[Some(hd), Some(e + hd)])?;
        decoder
            .weight_hh
            .expect_shape("decoder weight_hh", &[Some(hd), Some(hd)])?;
        decoder
            .bias_ih
            .expect_shape("decoder bias_ih", &[Some(hd)])?;
        decoder
            .bias_hh
            .expect_shape("decoder bias_hh", &[Some(hd)])?;
        if let Some(a) = &attention {
            a.query
                .expect_shape("attention query weight", &[None, Some(hd)])?;
            a.key
                .expect_shape("attention key weight", &[None, Some(hd)])?;
        }
        out.weight.expect_shape(
            "out weight",
            &[Some(target_embed.vocab_size()), Some(2 * hd)],
        )?;
        Ok(RnnSeq2Seq {
            source_embed,
            target_embed,
            encoder,
            decoder,
            attention,
            out,
        })
    }

    fn hidden(&self) -> usize {
        self.encoder.hidden_size()
    }

    /// Logits `[B, T, V_tgt]` for every target step, with the cache for the backward.
    /// Each step's attention weights `[B, S]` are in the cache ([`Seq2SeqCache::weights`]).
    pub fn forward(&self, input: &Seq2SeqInput) -> Result<(Tensor, Seq2SeqCache)> {
        let b_n = input.batch;
        if b_n == 0
            || !input.source.len().is_multiple_of(b_n)
            || !input.target.len().is_multiple_of(b_n)
            || input.source.is_empty()
            || input.target.is_empty()
        {
            return Err(Error::invalid(
                "rnn seq2seq batch",
                format!(
                    "{} source and {} target ids do not make {b_n} non-empty rows",
                    input.source.len(),
                    input.target.len()
                ),
            ));
        }
        let (s_n, t_n, hd) = (
            input.source.len() / b_n,
            input.target.len() / b_n,
            self.hidden(),
        );
        let e = self.source_embed.dim();
        let source_x = self
            .source_embed
            .forward(input.source)?
            .reshape(&[b_n, s_n, e])?;
        let (enc, encoder) = self
            .encoder
            .forward(&source_x, Some(input.source_lengths), None)?;
        let top = self.encoder.layers.len() - 1;
        let s0 = Tensor::new(
            &[b_n, hd],
            enc.h_n.data()[top * b_n * hd..(top + 1) * b_n * hd].to_vec(),
        )?;
        let memory = enc.out;
        let mask: Vec<bool> = (0..b_n * s_n)
            .map(|i| i % s_n < input.source_lengths[i / s_n])
            .collect();
        let proj = self
            .attention
            .as_ref()
            .map(|a| a.project_keys(&memory))
            .transpose()?;
        let y = self.target_embed.forward(input.target)?;
        let mut features = Tensor::zeros(&[b_n, t_n, 2 * hd]);
        let mut steps = Vec::with_capacity(t_n);
        let mut state = s0.clone();
        for i in 0..t_n {
            let attended = match (&self.attention, &proj) {
                (Some(a), Some(p)) => Some(a.step(&state, p, &memory, Some(&mask))?),
                _ => None,
            };
            let context = attended.as_ref().map_or(&s0, |a| &a.context);
            let mut cell_in = Tensor::zeros(&[b_n, e + hd]);
            for b in 0..b_n {
                let row = &mut cell_in.data_mut()[b * (e + hd)..(b + 1) * (e + hd)];
                row[..e].copy_from_slice(&y.data()[(b * t_n + i) * e..][..e]);
                row[e..].copy_from_slice(&context.data()[b * hd..(b + 1) * hd]);
            }
            let next = self.decoder.step(&cell_in, &state)?;
            for b in 0..b_n {
                let f = &mut features.data_mut()[(b * t_n + i) * 2 * hd..][..2 * hd];
                f[..hd].copy_from_slice(&next.data()[b * hd..(b + 1) * hd]);
                f[hd..].copy_from_slice(&context.data()[b * hd..(b + 1) * hd]);
            }
            steps.push((cell_in, std::mem::replace(&mut state, next), attended));
        }
        let logits = self.out.forward(&features)?;
        let cache = Seq2SeqCache {
            source: input.source.to_vec(),
            target: input.target.to_vec(),
            encoder,
            memory,
            proj,
            steps,
            features,
        };
        Ok((logits, cache))
    }

    /// Backward for d logits `[B, T, V_tgt]`: **accumulates** every parameter's
    /// gradient into `grads`, a tree shaped as this model.
    pub fn backward(
        &self,
        cache: &Seq2SeqCache,
        d_logits: &Tensor,
        grads: &mut Self,
    ) -> Result<()> {
        self.expect_grads(grads, "rnn seq2seq grads")?;
        let d_features = self
            .out
            .backward(&cache.features, d_logits, &mut grads.out)?;
        let (b_n, t_n, hd) = (
            cache.features.shape()[0],
            cache.features.shape()[1],
            self.hidden(),
        );
        let e = self.source_embed.dim();
        let mut d_memory = Tensor::zeros(cache.memory.shape());
        let mut d_proj = cache.proj.as_ref().map(|p| Tensor::zeros(p.shape()));
        let mut d_y = Tensor::zeros(&[b_n, t_n, e]);
        // the gradient reaching s_i from later steps, and the constant context's
        let mut d_state = Tensor::zeros(&[b_n, hd]);
        let mut d_s0 = Tensor::zeros(&[b_n, hd]);
        for i in (0..t_n).rev() {
            let (cell_in, prev, attended) = &cache.steps[i];
            // the features are [s_i; c_i]: their gradient splits into d s_i and d c_i
            let mut s_i = Tensor::zeros(&[b_n, hd]);
            let mut d_s = Tensor::zeros(&[b_n, hd]);
            let mut d_context = Tensor::zeros(&[b_n, hd]);
            for b in 0..b_n {
                let at = (b * t_n + i) * 2 * hd;
                let df = &d_features.data()[at..at + 2 * hd];
                let row = b * hd..(b + 1) * hd;
                s_i.data_mut()[row.clone()].copy_from_slice(&cache.features.data()[at..at + hd]);
                for ((d, &f), &later) in d_s.data_mut()[row.clone()]
                    .iter_mut()
                    .zip(&df[..hd])
                    .zip(&d_state.data()[row.clone()])
                {
                    *d = f + later;
                }
                d_context.data_mut()[row].copy_from_slice(&df[hd..]);
            }
            let (d_in, mut d_prev) =
                self.decoder
                    .step_backward((cell_in, prev, &s_i), &d_s, &mut grads.decoder)?;
            let n_in = e + hd;
            for b in 0..b_n {
                let row = &d_in.data()[b * n_in..(b + 1) * n_in];
                d_y.data_mut()[(b * t_n + i) * e..][..e].copy_from_slice(&row[..e]);
                for (g, &d) in d_context.data_mut()[b * hd..(b + 1) * hd]
                    .iter_mut()
                    .zip(&row[e..])
                {
                    *g += d;
                }
            }
            match (&self.attention, attended, &mut grads.attention, &mut d_proj) {
                (Some(a), Some(step), Some(ga), Some(dp)) => {
                    let dq =
                        a.step_backward(step, &cache.memory, &d_context, ga, dp, &mut d_memory)?;
                    d_prev.add_assign(&dq)?;
                }
                _ => d_s0.add_assign(&d_context)?,
            }
            d_state = d_prev;
        }
        // s_0 is the encoder's final top state: its gradient enters as d h_n
        d_s0.add_assign(&d_state)?;
        if let (Some(a), Some(ga), Some(dp)) = (&self.attention, &mut grads.attention, &d_proj) {
            a.project_keys_backward(&cache.memory, dp, ga, &mut d_memory)?;
        }
        let layers = self.encoder.layers.len();
        let mut d_hn = Tensor::zeros(&[layers, b_n, hd]);
        d_hn.data_mut()[(layers - 1) * b_n * hd..].copy_from_slice(d_s0.data());
        let (d_x, _) =
            self.encoder
                .backward(&cache.encoder, &d_memory, Some(&d_hn), &mut grads.encoder)?;
        self.source_embed
            .backward(&cache.source, &d_x, &mut grads.source_embed)?;
        self.target_embed
            .backward(&cache.target, &d_y, &mut grads.target_embed)?;
        Ok(())
    }
}

impl Seq2SeqCache {
    /// The attention weights of decoder step i, `[B, S]` (zero at padded keys); `None`
    /// for the model without attention.
    pub fn weights(&self, i: usize) -> Option<&Tensor> {
        self.steps.get(i)?.2.as_ref().map(|s| &s.weights)
    }
}
