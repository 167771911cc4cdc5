//! [`LmConfig`]: what a trainable decoder-only model is made of, with the two presets
//! that correspond to Hugging Face families.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ops::Activation;

/// How token order enters the model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PositionKind {
    /// No position information at all: attention is permutation-equivariant and only
    /// the causal mask tells positions apart.
    None,
    /// The fixed sin/cos table of "Attention Is All You Need" (interleaved layout),
    /// added to the token embeddings; `max_len` rows.
    Sinusoidal,
    /// A trained `[max_len, C]` table added to the token embeddings (GPT-2's `wpe`).
    Learned,
    /// Rotary embedding of q and k (half-split layout, as Hugging Face's Llama).
    Rope { theta: f32 },
    /// Linear distance penalties on the scores, BLOOM's slopes per head.
    Alibi,
}

/// The normalisation layer, with its epsilon.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NormKind {
    /// LayerNorm; it has a bias exactly when [`LmConfig::bias`] is set.
    LayerNorm {
        eps: f32,
    },
    RmsNorm {
        eps: f32,
    },
}

impl NormKind {
    pub fn eps(self) -> f32 {
        match self {
            NormKind::LayerNorm { eps } | NormKind::RmsNorm { eps } => eps,
        }
    }
}

/// The feed-forward block: plain `W₂·act(W₁x)` or gated SwiGLU
/// `W_down·(silu(W_gate x) ⊙ W_up x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FfnKind {
    Relu,
    /// Exact (erf) GELU.
    Gelu,
    /// GPT-2's tanh approximation (`gelu_new`).
    GeluTanh,
    SwiGlu,
}

impl FfnKind {
    /// The activation, and whether the block is gated.
    pub fn activation(self) -> (Activation, bool) {
        match self {
            FfnKind::Relu => (Activation::Relu, false),
            FfnKind::Gelu => (Activation::Gelu, false),
            FfnKind::GeluTanh => (Activation::GeluTanh, false),
            FfnKind::SwiGlu => (Activation::Silu, true),
        }
    }
}

/// The Hugging Face family a configuration can be saved as (and loaded from).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfFamily {
    /// `GPT2LMHeadModel`: learned positions, pre-norm LayerNorm with biases, plain MLP
    /// (ReLU / GELU / GELU tanh) with biases, multi-head attention (G = H).
    Gpt2,
    /// `LlamaForCausalLM`: RoPE, pre-norm RMSNorm, SwiGLU; biases on all projections or
    /// none (`attention_bias` = `mlp_bias`); any G dividing H.
    Llama,
}

/// A decoder-only language model's architecture.
///
/// Per layer, with `norm₁`, `norm₂` of kind [`LmConfig::norm`]:
///
/// ```text
/// pre-norm:   x = x + attn(norm₁(x));   x = x + ffn(norm₂(x))      (final norm before the head)
/// post-norm:  x = norm₁(x + attn(x));   x = norm₂(x + ffn(x))      (no final norm)
/// ```
///
/// Attention is causal, scaled by 1/√D, with H query heads and G key/value heads.
/// There is no dropout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LmConfig {
    /// V
    pub vocab: usize,
    /// C
    pub d_model: usize,
    pub n_layers: usize,
    /// H
    pub n_heads: usize,
    /// G, dividing H
    pub n_kv_heads: usize,
    /// F
    pub ffn_dim: usize,
    /// Longest sequence: the rows of a learned or sinusoidal table (`n_positions`,
    /// `max_position_embeddings`). RoPE, ALiBi and no positions do not enforce it.
    pub max_len: usize,
    pub position: PositionKind,
    pub norm: NormKind,
    pub pre_norm: bool,
    pub ffn: FfnKind,
    /// Biases on every projection (and on LayerNorm).
    pub bias: bool,
    /// The LM head reads the token embedding table (no `lm_head.weight` of its own).
    pub tie_embeddings: bool,
}

impl LmConfig {
    /// GPT-2's architecture: learned positions, pre-norm LayerNorm (eps 1e-5),
    /// a 4·C GELU-tanh (`gelu_new`) MLP, biases everywhere, head tied to the embedding.
    pub fn gpt2_style(
        vocab: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        max_len: usize,
    ) -> Self {
        LmConfig {
            vocab,
            d_model,
            n_layers,
            n_heads,
            n_kv_heads: n_heads,
            ffn_dim: 4 * d_model,
            max_len,
            position: PositionKind::Learned,
            norm: NormKind::LayerNorm { eps: 1e-5 },
            pre_norm: true,
            ffn: FfnKind::GeluTanh,
            bias: true,
            tie_embeddings: true,
        }
    }

    /// Llama's architecture: RoPE (θ = 10 000), pre-norm RMSNorm (eps 1e-6, the
    /// `LlamaConfig` default), SwiGLU with F = 8C/3 rounded up to a multiple of 8, no
    /// biases, `n_kv_heads` key/value heads (GQA), untied head. Set `tie_embeddings`
    /// for a tied one.
    pub fn llama_style(
        vocab: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        n_kv_heads: usize,
        max_len: usize,
    ) -> Self {
        LmConfig {
            vocab,
            d_model,
            n_layers,
            n_heads,
            n_kv_heads,
            ffn_dim: (8 * d_model).div_ceil(3).div_ceil(8) * 8,
            max_len,
            position: PositionKind::Rope { theta: 10_000.0 },
            norm: NormKind::RmsNorm { eps: 1e-6 },
            pre_norm: true,
            ffn: FfnKind::SwiGlu,
            bias: false,
            tie_embeddings: false,
        }
    }

    /// D = C / H.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Errors on the first inconsistent field, naming it.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab", self.vocab),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("ffn_dim", self.ffn_dim),
            ("max_len", self.max_len),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(Error::invalid(field, "must be at least 1"));
            }
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(Error::invalid(
                "n_heads",
                format!(
                    "{} heads do not divide d_model = {}",
                    self.n_heads, self.d_model
                ),
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(Error::invalid(
                "n_kv_heads",
                format!(
                    "{} key/value heads do not divide n_heads = {}",
                    self.n_kv_heads, self.n_heads
                ),
            ));
        }
        let eps = self.norm.eps();
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::invalid(
                "norm.eps",
                format!("must be finite and ≥ 0, got {eps}"),
            ));
        }
        if let PositionKind::Rope { theta } = self.position {
            if !(theta.is_finite() && theta > 1.0) {
                return Err(Error::invalid(
                    "position.theta",
                    format!("must be finite and > 1, got {theta}"),
                ));
            }
            if !self.head_dim().is_multiple_of(2) {
                return Err(Error::invalid(
                    "n_heads",
                    format!(
                        "RoPE rotates pairs of dimensions: head width {} must be even",
                        self.head_dim()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The Hugging Face family this architecture is exactly expressible in, if any.
    pub fn hf_family(&self) -> Option<HfFamily> {
        let plain_ffn = matches!(self.ffn, FfnKind::Relu | FfnKind::Gelu | FfnKind::GeluTanh);
        match (self.position, self.norm) {
            (PositionKind::Learned, NormKind::LayerNorm { .. })
                if self.pre_norm && plain_ffn && self.bias && self.n_kv_heads == self.n_heads =>
            {
                Some(HfFamily::Gpt2)
            }
            (PositionKind::Rope { .. }, NormKind::RmsNorm { .. })
                if self.pre_norm && self.ffn == FfnKind::SwiGlu =>
            {
                Some(HfFamily::Llama)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_map_to_their_families() {
        let g = LmConfig::gpt2_style(64, 32, 2, 4, 16);
        g.validate().unwrap();
        assert_eq!(g.hf_family(), Some(HfFamily::Gpt2));
        let l = LmConfig::llama_style(64, 32, 2, 4, 2, 16);
        l.validate().unwrap();
        assert_eq!(l.ffn_dim, 88);
        assert_eq!(l.hf_family(), Some(HfFamily::Llama));
        let mut post = g.clone();
        post.pre_norm = false;
        assert_eq!(post.hf_family(), None);
        let mut gqa = g.clone();
        gqa.n_kv_heads = 2;
        assert_eq!(gqa.hf_family(), None);
    }

    #[test]
    fn bad_fields_are_named() {
        let mut c = LmConfig::gpt2_style(64, 30, 2, 4, 16);
        assert!(c.validate().unwrap_err().to_string().contains("n_heads"));
        c.d_model = 32;
        c.n_kv_heads = 3;
        assert!(c.validate().unwrap_err().to_string().contains("n_kv_heads"));
        let mut r = LmConfig::llama_style(64, 12, 1, 4, 4, 8);
        assert!(r.validate().unwrap_err().to_string().contains("even"));
        r.d_model = 16;
        r.norm = NormKind::RmsNorm { eps: f32::NAN };
        assert!(r.validate().unwrap_err().to_string().contains("eps"));
    }

    #[test]
    fn serde_round_trip() {
        let mut c = LmConfig::llama_style(10, 8, 1, 2, 1, 4);
        c.position = PositionKind::Alibi;
        let s = serde_json::to_string(&c).unwrap();
        assert!(s.contains("\"kind\":\"alibi\""), "{s}");
        assert_eq!(serde_json::from_str::<LmConfig>(&s).unwrap(), c);
    }
}
