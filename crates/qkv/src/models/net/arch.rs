//! [`Arch`]: the one typed description of a Transformer. Every family's `config.json`
//! is read into it, every model is built from it, and qkv's own folders store it. It
//! says which stacks there are (decoder-only, encoder, encoder-decoder), their sizes,
//! and each choice the articles discuss: positions, norm and its place, attention
//! details, the feed-forward network, the embeddings and the head.

use serde::{Deserialize, Serialize};

use crate::block::Residual;
use crate::error::{Error, Result};
use crate::layers::NormKind;
use crate::ops::Activation;
use crate::position::{RopeScaling, SinusoidalLayout};

/// A Transformer architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Arch {
    /// V: rows of the token table that the logits are read against (the decoder's, or
    /// an encoder-only model's).
    pub vocab: usize,
    /// The encoder's own vocabulary when it has a table of its own; `None`: the encoder
    /// reads the one table (Marian's and T5's `shared`).
    pub src_vocab: Option<usize>,
    /// C
    pub d_model: usize,
    /// A bidirectional stack over the source (BERT, encoder-decoders).
    pub encoder: Option<StackDims>,
    /// A causal stack (decoder-only models, encoder-decoders).
    pub decoder: Option<StackDims>,
    pub position: Position,
    pub norm: NormSpec,
    pub residual: Residual,
    pub attention: AttentionArch,
    pub ffn: FfnArch,
    pub embed: EmbedArch,
    pub head: Head,
    /// The head's logits soft-capped to (−cap, cap): cap·tanh(z/cap) (Gemma 2's
    /// `final_logit_softcapping`).
    #[serde(default)]
    pub logit_softcap: Option<f32>,
}

/// One stack's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackDims {
    pub layers: usize,
    /// H
    pub heads: usize,
    /// G, dividing H
    pub kv_heads: usize,
    /// D (H·D may differ from C, as in T5)
    pub head_dim: usize,
    /// F
    pub ffn_dim: usize,
}

/// How token order enters the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Position {
    /// No position information: only the causal mask tells positions apart.
    None,
    /// A trained `[max_len, C]` table added to the token embeddings (BERT, GPT-2), one
    /// per stack.
    Learned { max_len: usize },
    /// The fixed sin/cos vectors of "Attention Is All You Need", added to the token
    /// embeddings; positions ≥ `max_len` are refused as a model with a table would.
    Sinusoidal {
        max_len: usize,
        layout: SinusoidalLayout,
    },
    /// Rotary embedding of q and k in self-attention (half-split layout, as Llama).
    Rope {
        theta: f32,
        /// How the frequencies stretch past the trained length (`rope_scaling`). Read
        /// from `linear_scaling: factor` too, as configs written before the other kinds
        /// existed hold it.
        #[serde(
            default,
            alias = "linear_scaling",
            deserialize_with = "scaling_or_linear_factor"
        )]
        scaling: RopeScaling,
        /// The trained context (`max_position_embeddings`); not enforced.
        max_len: Option<usize>,
        /// Only the first R dimensions of each head rotate, the rest pass through
        /// (GPT-NeoX's `rotary_pct`, Phi's `partial_rotary_factor`); `None`: all D.
        #[serde(default)]
        rotary_dim: Option<usize>,
    },
    /// Linear distance penalties on the scores, BLOOM's slopes per head: slope·(j − i)
    /// in causal self-attention, −slope·|i − j| in an encoder.
    Alibi,
    /// T5's learned bias per head and relative-distance bucket, in self-attention.
    Relative { buckets: usize, max_distance: usize },
}

/// A [`RopeScaling`], or a bare number: the linear factor of older configs (1: none).
fn scaling_or_linear_factor<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<RopeScaling, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Factor(f32),
        Scaling(RopeScaling),
    }
    Ok(match Either::deserialize(d)? {
        Either::Factor(1.0) => RopeScaling::None,
        Either::Factor(factor) => RopeScaling::Linear { factor },
        Either::Scaling(s) => s,
    })
}

/// The norm of every sub-layer, the embeddings and the stack ends.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NormSpec {
    pub kind: NormKind,
    pub eps: f32,
    /// LayerNorm with a bias
    pub bias: bool,
    /// Each norm scales by 1 + weight (Gemma's RMSNorm)
    #[serde(default)]
    pub unit_offset: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionArch {
    /// Biases on W_Q, W_K, W_V.
    pub qkv_bias: bool,
    /// A bias on W_O.
    pub out_bias: bool,
    /// The score scale; `None` is 1/√D (T5 uses 1).
    pub scale: Option<f32>,
    /// Layer l's scores are also divided by l + 1 (GPT-2's
    /// `scale_attn_by_inverse_layer_idx`).
    #[serde(default)]
    pub scale_by_layer: bool,
    /// Sliding window of the self-attention: causal (Mistral, Qwen2), or on both sides
    /// of the query in an encoder (ModernBERT's |i − j| < w).
    pub window: Option<usize>,
    /// The window applies to decoder layers l ≥ this one only (Qwen2's
    /// `max_window_layers`); 0: to every layer.
    #[serde(default)]
    pub window_from_layer: usize,
    /// A norm (the stack's kind, width D) over each query and key head after the
    /// projections, before RoPE (Qwen3's `q_norm` / `k_norm`).
    #[serde(default)]
    pub qk_norm: bool,
    /// Scores soft-capped to (−cap, cap) after scaling: cap·tanh(s/cap) (Gemma 2's
    /// `attn_logit_softcapping`).
    #[serde(default)]
    pub softcap: Option<f32>,
    /// Which layers are local, one flag per layer of the stack (a decoder-only or an
    /// encoder-only model's): they attend through the sliding window (and with the
    /// local RoPE base when there is one). `None`: the layers from `window_from_layer`
    /// up. (Gemma's and ModernBERT's alternating layers.)
    #[serde(default)]
    pub local_layers: Option<Vec<bool>>,
    /// The RoPE base of local layers, when it differs from the global one (Gemma 3's
    /// `rope_local_base_freq`).
    #[serde(default)]
    pub local_rope_theta: Option<f32>,
}

impl AttentionArch {
    /// Whether layer `l` is local (sliding window, local RoPE base).
    pub fn is_local(&self, l: usize) -> bool {
        match &self.local_layers {
            Some(flags) => flags.get(l).copied().unwrap_or(false),
            None => l >= self.window_from_layer,
        }
    }
}

/// The feed-forward network: `W₂·act(W₁x)`, or gated `W₂·(act(W₁x) ⊙ W₃x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FfnArch {
    pub activation: Activation,
    pub gated: bool,
    pub bias: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbedArch {
    /// Token embeddings are multiplied by √C (the original Transformer, Marian).
    #[serde(default)]
    pub scale: bool,
    /// A norm after the embeddings (BERT, BLOOM).
    #[serde(default)]
    pub norm: bool,
    /// Layer 0's attention reads the embedding norm's output as it is, with no norm
    /// of its own (ModernBERT's first `attn_norm` is the identity).
    #[serde(default)]
    pub first_attn_unnormed: bool,
    /// Rows of a token-type table added to the embeddings (BERT's segments); 0: none.
    #[serde(default)]
    pub token_types: usize,
    /// Positions are slots 0..T, padding included (BERT). Otherwise they count real
    /// tokens, cumsum(mask) − 1, as generation assigns them, so a left-padded row is
    /// computed as if alone.
    #[serde(default)]
    pub slot_positions: bool,
    /// Real tokens' positions start here and padding sits one below (RoBERTa's
    /// `padding_idx + 1`, position ids made from the mask); 0: from 0.
    #[serde(default)]
    pub position_offset: usize,
    /// Lookups of this id give the token table no gradient (PyTorch's `padding_idx`,
    /// which BERT, Llama and Marian set to the pad token).
    pub padding_idx: Option<usize>,
}

/// What turns the last hidden states into the model's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Head {
    /// None: the output is the last hidden states (`BertModel`).
    None,
    /// logits = (s·h)·Wᵀ (+ b): W the token table when `tied`, else its own `lm_head`;
    /// s = C^−½ when `rescale` (T5), else 1; b a fixed bias when `logits_bias`
    /// (Marian's `final_logits_bias`, a buffer, not trained).
    Lm {
        tied: bool,
        #[serde(default)]
        rescale: bool,
        #[serde(default)]
        logits_bias: bool,
    },
    /// BERT's masked-LM head: dense C→C (with a bias when `dense_bias`), activation,
    /// norm, then the tied token table plus a trained bias.
    MaskedLm {
        activation: Activation,
        /// ModernBERT's `head.dense` has none (`classifier_bias: false`)
        #[serde(default = "crate::models::net::arch::yes")]
        dense_bias: bool,
    },
}

/// serde's default of a flag that older configs leave out and that was true then.
pub(crate) fn yes() -> bool {
    true
}

impl Head {
    /// A plain language-model head: no rescale, no fixed bias.
    pub fn lm(tied: bool) -> Self {
        Head::Lm {
            tied,
            rescale: false,
            logits_bias: false,
        }
    }

    /// Whether the head reads the token table (a tied LM head, a masked-LM head).
    pub fn tied(&self) -> bool {
        matches!(self, Head::Lm { tied: true, .. } | Head::MaskedLm { .. })
    }
}

impl Arch {
    /// GPT-2's architecture: learned positions, pre-norm LayerNorm (eps 1e-5), a 4·C
    /// GELU-tanh (`gelu_new`) MLP, biases everywhere, head tied to the embedding.
    pub fn gpt2(vocab: usize, d_model: usize, layers: usize, heads: usize, max_len: usize) -> Self {
        Arch {
            vocab,
            src_vocab: None,
            d_model,
            encoder: None,
            decoder: Some(StackDims {
                layers,
                heads,
                kv_heads: heads,
                head_dim: d_model / heads.max(1),
                ffn_dim: 4 * d_model,
            }),
            position: Position::Learned { max_len },
            norm: NormSpec {
                kind: NormKind::LayerNorm,
                eps: 1e-5,
                bias: true,
                unit_offset: false,
            },
            residual: Residual::PreNorm,
            attention: AttentionArch {
                qkv_bias: true,
                out_bias: true,
                scale: None,
                scale_by_layer: false,
                window: None,
                window_from_layer: 0,
                qk_norm: false,
                softcap: None,
                local_layers: None,
                local_rope_theta: None,
            },
            ffn: FfnArch {
                activation: Activation::GeluTanh,
                gated: false,
                bias: true,
            },
            embed: EmbedArch::default(),
            head: Head::lm(true),
            logit_softcap: None,
        }
    }

    /// Llama's architecture: RoPE (θ = 10 000), pre-norm RMSNorm (eps 1e-6), SwiGLU with
    /// F = 8C/3 rounded up to a multiple of 8, no biases, `kv_heads` key/value heads,
    /// untied head.
    pub fn llama(
        vocab: usize,
        d_model: usize,
        layers: usize,
        heads: usize,
        kv_heads: usize,
        max_len: usize,
    ) -> Self {
        let mut a = Arch::gpt2(vocab, d_model, layers, heads, max_len);
        a.decoder = Some(StackDims {
            kv_heads,
            ffn_dim: (8 * d_model).div_ceil(3).div_ceil(8) * 8,
            ..a.stack()
        });
        a.position = Position::Rope {
            theta: 10_000.0,
            scaling: RopeScaling::None,
            max_len: Some(max_len),
            rotary_dim: None,
        };
        a.norm = NormSpec {
            kind: NormKind::RmsNorm,
            eps: 1e-6,
            bias: false,
            unit_offset: false,
        };
        a.attention.qkv_bias = false;
        a.attention.out_bias = false;
        a.ffn = FfnArch {
            activation: Activation::Silu,
            gated: true,
            bias: false,
        };
        a.head = Head::lm(false);
        a
    }

    /// BERT's encoder: learned positions in slots 0..T (`max_len` of them), an
    /// embedding LayerNorm, post-norm layers with biases, `activation` in an F-wide FFN,
    /// no head; `layers` layers of `heads` heads over C.
    #[allow(clippy::too_many_arguments)]
    pub fn bert(
        vocab: usize,
        d_model: usize,
        layers: usize,
        heads: usize,
        ffn_dim: usize,
        max_len: usize,
        activation: Activation,
        eps: f32,
    ) -> Self {
        let mut a = Arch::gpt2(vocab, d_model, layers, heads, max_len)
            .with_widths(d_model / heads.max(1), ffn_dim);
        a.encoder = a.decoder.take();
        a.norm.eps = eps;
        a.residual = Residual::PostNorm;
        a.ffn.activation = activation;
        a.embed.norm = true;
        a.embed.slot_positions = true;
        a.head = Head::None;
        a
    }

    /// The base Transformer of "Attention Is All You Need" at any size: one shared
    /// vocabulary and table (tied to the head) scaled by √C, sinusoidal positions,
    /// post-norm LayerNorm (eps 1e-5), a 4·C ReLU FFN, biases, `layers` in each stack.
    /// (Without the √C, embeddings of std 0.02 are drowned by sinusoids of amplitude 1.)
    pub fn vaswani(
        vocab: usize,
        d_model: usize,
        layers: usize,
        heads: usize,
        max_len: usize,
    ) -> Self {
        let mut a = Arch::gpt2(vocab, d_model, layers, heads, max_len);
        a.encoder = a.decoder;
        a.position = Position::Sinusoidal {
            max_len,
            layout: SinusoidalLayout::Interleaved,
        };
        a.residual = Residual::PostNorm;
        a.ffn.activation = Activation::Relu;
        a.embed.scale = true;
        a
    }

    /// The same with each head D wide and an FFN F wide in its stack (the decoder's, or
    /// an encoder-only model's).
    pub fn with_widths(mut self, head_dim: usize, ffn_dim: usize) -> Self {
        if let Some(s) = self.decoder.as_mut().or(self.encoder.as_mut()) {
            s.head_dim = head_dim;
            s.ffn_dim = ffn_dim;
        }
        self
    }

    /// Rows of the largest token table: a tokenizer for this model must produce ids
    /// below it (Marian may give its encoder a table of its own).
    pub fn token_rows(&self) -> usize {
        self.src_vocab.map_or(self.vocab, |s| s.max(self.vocab))
    }

    /// The decoder's sizes, or the encoder's for an encoder-only model.
    pub fn stack(&self) -> StackDims {
        self.decoder
            .or(self.encoder)
            .expect("validated: an architecture has a stack")
    }

    /// Rows of a position table, for the kinds that have one.
    pub fn max_positions(&self) -> Option<usize> {
        match self.position {
            Position::Learned { max_len } | Position::Sinusoidal { max_len, .. } => Some(max_len),
            _ => None,
        }
    }

    /// Errors on the first inconsistent field, naming it.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: String| Err(Error::invalid(field, reason));
        if self.encoder.is_none() && self.decoder.is_none() {
            return bad(
                "encoder",
                "an architecture needs an encoder, a decoder or both".into(),
            );
        }
        for (field, v) in [("vocab", self.vocab), ("d_model", self.d_model)]
            .into_iter()
            .chain(self.src_vocab.map(|v| ("src_vocab", v)))
        {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        for (name, s) in [("encoder", self.encoder), ("decoder", self.decoder)] {
            let Some(s) = s else { continue };
            for (field, v) in [
                ("heads", s.heads),
                ("kv_heads", s.kv_heads),
                ("head_dim", s.head_dim),
                ("ffn_dim", s.ffn_dim),
            ] {
                if v == 0 {
                    return bad(&format!("{name}.{field}"), "must be at least 1".into());
                }
            }
            if !s.heads.is_multiple_of(s.kv_heads) {
                return bad(
                    &format!("{name}.kv_heads"),
                    format!(
                        "{} key/value heads do not divide {} heads",
                        s.kv_heads, s.heads
                    ),
                );
            }
            let whole_heads_rotate = matches!(
                self.position,
                Position::Rope {
                    rotary_dim: None,
                    ..
                }
            );
            if whole_heads_rotate && !s.head_dim.is_multiple_of(2) {
                return bad(
                    &format!("{name}.head_dim"),
                    format!(
                        "RoPE rotates pairs of dimensions: head width {} must be even",
                        s.head_dim
                    ),
                );
            }
        }
        if !(self.norm.eps.is_finite() && self.norm.eps >= 0.0) {
            return bad(
                "norm.eps",
                format!("must be finite and ≥ 0, got {}", self.norm.eps),
            );
        }
        if self.norm.bias && self.norm.kind == NormKind::RmsNorm {
            return bad("norm.bias", "RMSNorm has no bias".into());
        }
        match &self.position {
            Position::Learned { max_len } | Position::Sinusoidal { max_len, .. }
                if *max_len == 0 =>
            {
                return bad("position.max_len", "must be at least 1".into())
            }
            Position::Rope {
                theta,
                scaling,
                rotary_dim,
                ..
            } => {
                let widths = [self.encoder, self.decoder].into_iter().flatten();
                let theta = *theta;
                if let Some(r) = *rotary_dim {
                    if r == 0 || !r.is_multiple_of(2) || widths.clone().any(|s| r > s.head_dim) {
                        return bad(
                            "position.rotary_dim",
                            format!("must be even, at least 2 and at most the head width, got {r}"),
                        );
                    }
                }
                if !(theta.is_finite() && theta > 1.0) {
                    return bad(
                        "position.theta",
                        format!("must be finite and > 1, got {theta}"),
                    );
                }
                scaling.check("position.scaling")?;
            }
            Position::Relative {
                buckets,
                max_distance,
            } if *buckets < 2 || *max_distance == 0 => {
                return bad(
                    "position.buckets",
                    "need at least 2 buckets and a positive max_distance".into(),
                )
            }
            _ => {}
        }
        if self.attention.window == Some(0) {
            return bad("attention.window", "must be at least 1".into());
        }
        if let Some(s) = self.attention.scale {
            if !s.is_finite() {
                return bad("attention.scale", format!("must be finite, got {s}"));
            }
        }
        for (field, v) in [
            ("attention.softcap", self.attention.softcap),
            ("logit_softcap", self.logit_softcap),
        ] {
            if v.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                return bad(field, format!("must be finite and > 0, got {v:?}"));
            }
        }
        if matches!(self.residual, Residual::Parallel | Residual::Sandwich)
            && self.kind() == ModelKind::EncoderDecoder
        {
            return bad(
                "residual",
                "parallel and sandwich layers have no place for cross-attention".into(),
            );
        }
        if let Some(t) = self.attention.local_rope_theta {
            if !(t.is_finite() && t > 1.0 && matches!(self.position, Position::Rope { .. })) {
                return bad(
                    "attention.local_rope_theta",
                    format!("a RoPE base, finite and > 1, for a RoPE model; got {t}"),
                );
            }
        }
        if let (Some(flags), Some(d)) = (&self.attention.local_layers, self.decoder) {
            if flags.len() != d.layers {
                return bad(
                    "attention.local_layers",
                    format!("{} flags for {} decoder layers", flags.len(), d.layers),
                );
            }
        }
        if self.src_vocab.is_some() && self.kind() != ModelKind::EncoderDecoder {
            return bad(
                "src_vocab",
                "only an encoder-decoder has a second token table".into(),
            );
        }
        if matches!(self.head, Head::MaskedLm { .. }) && self.kind() != ModelKind::Encoder {
            return bad(
                "head",
                "a masked-LM head sits on an encoder-only model".into(),
            );
        }
        if self.head == Head::None && self.kind() != ModelKind::Encoder {
            return bad(
                "head",
                "a model with a decoder needs a language-model head".into(),
            );
        }
        Ok(())
    }

    /// A decoder-only model with plain token embeddings, a plain LM head (tied or not)
    /// and none of the block options the newer families added (per-head q/k norms,
    /// soft caps, norms scaling by 1 + w, per-layer windows and RoPE bases): what
    /// GPT-2's and Llama's configs can describe.
    pub fn plain_decoder(&self) -> bool {
        self.encoder.is_none()
            && self.decoder.is_some()
            && self.embed == EmbedArch::default()
            && self.head == Head::lm(self.head.tied())
            && self.logit_softcap.is_none()
            && !self.norm.unit_offset
            && !self.attention.qk_norm
            && self.attention.softcap.is_none()
            && self.attention.local_layers.is_none()
            && self.attention.local_rope_theta.is_none()
    }

    /// What kind of model this is.
    pub fn kind(&self) -> ModelKind {
        match (self.encoder.is_some(), self.decoder.is_some()) {
            (true, true) => ModelKind::EncoderDecoder,
            (true, false) => ModelKind::Encoder,
            _ => ModelKind::Decoder,
        }
    }
}

/// The three model kinds an [`Arch`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// A causal stack: tokens → next-token logits (GPT-2, Llama, BLOOM).
    Decoder,
    /// A bidirectional stack: tokens → hidden states or masked-token logits (BERT).
    Encoder,
    /// Source → encoder → memory; target → decoder reading the memory (Marian, T5).
    EncoderDecoder,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Native folders written before the other scalings existed hold `linear_scaling`.
    #[test]
    fn rope_position_reads_the_older_linear_factor_and_the_tagged_scaling() {
        let read = |json: &str| serde_json::from_str::<Position>(json).unwrap();
        let old = read(r#"{"kind": "rope", "theta": 10000.0, "linear_scaling": 2.0}"#);
        let plain = read(r#"{"kind": "rope", "theta": 10000.0, "linear_scaling": 1.0}"#);
        let absent = read(r#"{"kind": "rope", "theta": 10000.0}"#);
        let scaling_of = |p: Position| match p {
            Position::Rope { scaling, .. } => scaling,
            _ => panic!("not RoPE"),
        };
        assert_eq!(scaling_of(old), RopeScaling::Linear { factor: 2.0 });
        assert_eq!(scaling_of(plain), RopeScaling::None);
        assert_eq!(scaling_of(absent), RopeScaling::None);
        let yarn = RopeScaling::Yarn(crate::position::YarnScaling {
            factor: 4.0,
            original_max: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: 1.25,
        });
        let p = Position::Rope {
            theta: 500_000.0,
            scaling: yarn,
            max_len: Some(256),
            rotary_dim: None,
        };
        assert_eq!(read(&serde_json::to_string(&p).unwrap()), p);
    }
}
