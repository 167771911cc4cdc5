//! Llama and Mistral (`LlamaForCausalLM`, `MistralForCausalLM`): a pre-norm decoder with
//! RMSNorm, rotary positions in Hugging Face's half-split layout, grouped-query
//! attention and a SwiGLU feed-forward block. Mistral is the same network with a
//! sliding attention window.
//!
//! Per layer, for x: [B, T, C]:
//!
//! ```text
//! x = x + o_proj(attn(rope(q_proj(rms(x))), rope(k_proj(rms(x))), v_proj(rms(x))))
//! x = x + down_proj(silu(gate_proj(rms(x))) ⊙ up_proj(rms(x)))
//! ```
//!
//! then a final RMSNorm and `lm_head` (or the embedding table when tied).
//!
//! Config layouts: transformers 4.x writes `rope_theta` and `rope_scaling` at the top
//! level (`rope_scaling` names its kind `type` or `rope_type`); 5.x folds both into
//! `rope_parameters: {rope_type, rope_theta, factor}`. Both are read.

use std::path::Path;

use serde::Deserialize;

use super::head::{lm_logits, load_lm_head};
use super::special::{special_tokens, TokenIds};
use super::{ffn_label, CausalLm, KvCache, Model, ModelInfo, SpecialTokens, TokenBatch, Weights};
use crate::attention::MultiHeadAttention;
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::{Error, Result};
use crate::io::{bad_field, check_positive, epsilon, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, Linear, RmsNorm};
use crate::ops::Activation;
use crate::position::{Rope, RopeLayout};
use crate::tensor::Tensor;

/// `config.json` of a Llama or Mistral checkpoint, as transformers writes it.
#[derive(Deserialize)]
pub(crate) struct LlamaConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    pub(crate) vocab_size: usize,
    pub(crate) hidden_size: usize,
    pub(crate) intermediate_size: usize,
    pub(crate) num_hidden_layers: usize,
    num_attention_heads: usize,
    /// Absent means multi-head attention (G = H).
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    /// Absent or null means hidden_size / num_attention_heads.
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_hidden_act")]
    pub(crate) hidden_act: String,
    /// Bias on q/k/v/o projections (Llama only; Mistral has none).
    #[serde(default)]
    pub(crate) attention_bias: bool,
    /// Bias on gate/up/down projections.
    #[serde(default)]
    pub(crate) mlp_bias: bool,
    /// Both Llama and Mistral default to separate input and output matrices.
    #[serde(default)]
    pub(crate) tie_word_embeddings: bool,
    #[serde(default)]
    pub(crate) max_position_embeddings: Option<usize>,
    /// transformers 4.x
    #[serde(default)]
    rope_theta: Option<f64>,
    /// transformers 4.x
    #[serde(default)]
    rope_scaling: Option<RopeConfig>,
    /// transformers 5.x
    #[serde(default)]
    pub(crate) rope_parameters: Option<RopeConfig>,
    /// Mistral: query position p sees key j only when p − j < sliding_window.
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

fn default_hidden_act() -> String {
    "silu".into()
}

/// `rope_scaling` (4.x) or `rope_parameters` (5.x). Kept as separate fields rather than
/// serde aliases because 4.x configs often carry both `type` and `rope_type`, which an
/// alias would reject as a duplicate.
#[derive(Deserialize)]
pub(crate) struct RopeConfig {
    #[serde(default)]
    rope_type: Option<String>,
    #[serde(default, rename = "type")]
    legacy_type: Option<String>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    factor: Option<f64>,
}

/// How RoPE's frequencies are scaled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RopeScaling {
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear(f32),
}

/// Base θ and scaling from whichever layout the config uses.
pub(crate) fn rope_settings(cfg: &LlamaConfig, dir: &Path) -> Result<(f32, RopeScaling)> {
    let (field, rope) = match (&cfg.rope_parameters, &cfg.rope_scaling) {
        (Some(p), _) => ("rope_parameters", Some(p)),
        (None, s) => ("rope_scaling", s.as_ref()),
    };
    let theta = rope
        .and_then(|r| r.rope_theta)
        .or(cfg.rope_theta)
        .unwrap_or(10_000.0);
    if !(theta.is_finite() && theta > 1.0) {
        return Err(bad_field(
            dir,
            "rope_theta",
            format!("must be finite and > 1, got {theta}"),
        ));
    }
    let kind = rope.and_then(|r| r.rope_type.as_deref().or(r.legacy_type.as_deref()));
    let scaling = match kind {
        None | Some("default") => RopeScaling::None,
        Some("linear") => {
            let factor = rope.and_then(|r| r.factor).ok_or_else(|| {
                bad_field(
                    dir,
                    &format!("{field}.factor"),
                    "linear RoPE scaling needs a factor",
                )
            })?;
            if !(factor.is_finite() && factor > 0.0) {
                return Err(bad_field(
                    dir,
                    &format!("{field}.factor"),
                    format!("must be finite and > 0, got {factor}"),
                ));
            }
            RopeScaling::Linear(factor as f32)
        }
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "RoPE scaling type `{other}` ({}, field `{field}`); supported: default, linear",
                dir.join("config.json").display()
            )))
        }
    };
    Ok((theta as f32, scaling))
}

/// Runtime sizes after validation.
pub(crate) struct Dims {
    pub(crate) hidden: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) ffn: usize,
    pub(crate) vocab: usize,
    pub(crate) eps: f32,
}

/// The sizes and epsilon of `cfg`, checked; errors name the field of
/// `dir/config.json` at fault.
pub(crate) fn validate(cfg: &LlamaConfig, dir: &Path) -> Result<Dims> {
    check_positive(
        dir,
        &[
            ("vocab_size", cfg.vocab_size),
            ("hidden_size", cfg.hidden_size),
            ("intermediate_size", cfg.intermediate_size),
            ("num_attention_heads", cfg.num_attention_heads),
        ],
    )?;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(bad_field(
            dir,
            "num_key_value_heads",
            format!("{kv_heads} key/value heads must divide num_attention_heads = {heads}"),
        ));
    }
    let head_dim = match cfg.head_dim {
        Some(d) => d,
        None if cfg.hidden_size.is_multiple_of(heads) => cfg.hidden_size / heads,
        None => {
            return Err(bad_field(
                dir,
                "hidden_size",
                format!(
                "{} is not a multiple of num_attention_heads = {heads} (and no head_dim is given)",
                cfg.hidden_size
            ),
            ))
        }
    };
    // RoPE rotates pairs of dimensions.
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(bad_field(
            dir,
            "head_dim",
            format!("RoPE needs an even, non-zero head width, got {head_dim}"),
        ));
    }
    let eps = epsilon(dir, "rms_norm_eps", cfg.rms_norm_eps)?;
    if cfg.sliding_window == Some(0) {
        return Err(bad_field(dir, "sliding_window", "must be at least 1"));
    }
    Ok(Dims {
        hidden: cfg.hidden_size,
        heads,
        kv_heads,
        head_dim,
        ffn: cfg.intermediate_size,
        vocab: cfg.vocab_size,
        eps,
    })
}

struct DecoderLayer {
    input_norm: RmsNorm,
    attn: AttentionLayer,
    post_attention_norm: RmsNorm,
    /// `up` is HF's gate_proj (the activated branch), `gate_up` its up_proj.
    mlp: FeedForward,
}

pub struct Llama {
    info: ModelInfo,
    special: SpecialTokens,
    /// [V, C]
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// C → V; `None` when tied to the embedding table.
    lm_head: Option<Linear>,
    window: Option<usize>,
}

/// Loads a `LlamaForCausalLM` or `MistralForCausalLM` folder.
pub fn load(dir: &Path, ckpt: &Checkpoint) -> Result<Model> {
    let cfg: LlamaConfig = read_config(dir)?;
    let dims = validate(&cfg, dir)?;
    let (theta, scaling) = rope_settings(&cfg, dir)?;
    let activation = Activation::from_hf_name(&cfg.hidden_act)
        .map_err(|e| bad_field(dir, "hidden_act", e.to_string()))?;
    let architecture = cfg
        .architectures
        .first()
        .cloned()
        .or_else(|| cfg.model_type.clone())
        .unwrap_or_default();
    let mistral =
        architecture == "MistralForCausalLM" || cfg.model_type.as_deref() == Some("mistral");
    // Llama has no sliding window: transformers ignores the field there, so do we.
    let window = if mistral { cfg.sliding_window } else { None };

    let mut rope = Rope::new(dims.head_dim, theta, RopeLayout::HalfSplit)?;
    if let RopeScaling::Linear(factor) = scaling {
        rope = rope.with_linear_scaling(factor)?;
    }

    // Checkpoints saved from the bare `LlamaModel` lack the `model.` prefix.
    let w = Weights::detect(ckpt, &["model.", ""], "embed_tokens.weight");
    let (c, h, g, d, f) = (
        dims.hidden,
        dims.heads,
        dims.kv_heads,
        dims.head_dim,
        dims.ffn,
    );
    let embed = w.embedding("embed_tokens", dims.vocab, c)?;
    let layers = (0..cfg.num_hidden_layers)
        .map(|l| {
            let p = format!("layers.{l}");
            let eps = dims.eps;
            let bias = cfg.attention_bias;
            let mha = MultiHeadAttention::new(
                w.linear(&format!("{p}.self_attn.q_proj"), h * d, c, bias)?,
                w.linear(&format!("{p}.self_attn.k_proj"), g * d, c, bias)?,
                w.linear(&format!("{p}.self_attn.v_proj"), g * d, c, bias)?,
                w.linear(&format!("{p}.self_attn.o_proj"), c, h * d, bias)?,
                h,
                g,
            )?;
            let mb = cfg.mlp_bias;
            Ok(DecoderLayer {
                input_norm: w.rms_norm(&format!("{p}.input_layernorm"), c, eps)?,
                attn: AttentionLayer {
                    mha,
                    rope: Some(rope.clone()),
                },
                post_attention_norm: w.rms_norm(
                    &format!("{p}.post_attention_layernorm"),
                    c,
                    eps,
                )?,
                mlp: FeedForward::new(
                    w.linear(&format!("{p}.mlp.gate_proj"), f, c, mb)?,
                    Some(w.linear(&format!("{p}.mlp.up_proj"), f, c, mb)?),
                    w.linear(&format!("{p}.mlp.down_proj"), c, f, mb)?,
                    activation,
                )?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let norm = w.rms_norm("norm", c, dims.eps)?;
    // A tied checkpoint stores no lm_head; an untied one without it can only mean the
    // embedding table is the head.
    let tied = cfg.tie_word_embeddings || !ckpt.has("lm_head.weight");
    let lm_head = load_lm_head(ckpt, tied, dims.vocab, c)?;
    let special = special_tokens(dir, cfg.tokens)?;

    let mut position = format!("RoPE (half-split, θ={theta})");
    if let RopeScaling::Linear(factor) = scaling {
        position.push_str(&format!(", linear scaling ×{factor}"));
    }
    if let Some(w) = window {
        position.push_str(&format!(", sliding window {w}"));
    }
    let info = ModelInfo {
        family: if mistral { "mistral" } else { "llama" }.into(),
        architecture,
        layers: layers.len(),
        decoder_layers: None,
        hidden: c,
        heads: h,
        kv_heads: g,
        head_dim: d,
        ffn_dim: f,
        vocab: dims.vocab,
        max_positions: cfg.max_position_embeddings,
        position,
        norm: format!("RMSNorm, pre-norm, eps {}", cfg.rms_norm_eps),
        ffn: ffn_label(activation, true),
    };
    Ok(Model::Causal(Box::new(Llama {
        info,
        special,
        embed,
        layers,
        norm,
        lm_head,
        window,
    })))
}

impl CausalLm for Llama {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// tokens: [B, T] → logits [B, T, V]. Positions are counted over real tokens, so a
    /// left-padded row is computed as if alone. `max_position_embeddings` is not a
    /// limit: RoPE extends to any position, and transformers does not reject longer
    /// inputs either (quality beyond the trained length is the user's concern).
    fn forward_cached(&self, tokens: &TokenBatch, cache: &mut KvCache) -> Result<Tensor> {
        tokens.check_vocab(self.info.vocab)?;
        cache.check_layers(self.layers.len())?;
        let step = cache.begin_step(&tokens.mask, tokens.len, None)?;
        let (b, t, c) = (tokens.batch, tokens.len, self.info.hidden);
        let mut x = self.embed.forward(&tokens.ids)?.reshape(&[b, t, c])?;
        let opts = AttendOpts {
            positions: &step.positions,
            key_padding: Some(&step.key_padding),
            causal: true,
            window: self.window,
            ..Default::default()
        };
        for (layer, kv) in self.layers.iter().zip(cache.layers.iter_mut()) {
            let h = layer.input_norm.forward(&x)?;
            let a = layer.attn.self_attention(&h, &opts, Some(kv))?;
            x.add_assign(&a);
            let h = layer.post_attention_norm.forward(&x)?;
            let m = layer.mlp.forward(&h)?;
            x.add_assign(&m);
        }
        let h = self.norm.forward(&x)?;
        lm_logits(&h, self.lm_head.as_ref(), &self.embed.table, 1.0)
    }
}
