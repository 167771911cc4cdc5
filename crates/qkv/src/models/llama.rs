//! Llama and Mistral (`LlamaForCausalLM`, `MistralForCausalLM`): a pre-norm decoder with
//! RMSNorm, rotary positions in Hugging Face's half-split layout, grouped-query
//! attention and a SwiGLU feed-forward block. Mistral is the same network with a
//! sliding attention window.
//!
//! Config layouts: transformers 4.x writes `rope_theta` and `rope_scaling` at the top
//! level (`rope_scaling` names its kind `type` or `rope_type`); 5.x folds both into
//! `rope_parameters: {rope_type, rope_theta, factor}`. Both are read.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use super::arch::{Arch, Head, Position, StackDims};
use super::names::{same, Name};
use super::special::TokenIds;
use crate::error::{Error, Result};
use crate::io::{bad_field, epsilon, read_config};
use crate::ops::Activation;

/// `config.json` of a Llama or Mistral checkpoint, as transformers writes it.
#[derive(Deserialize)]
struct LlamaConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    /// Absent means multi-head attention (G = H).
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    /// Absent or null means hidden_size / num_attention_heads.
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default = "crate::io::eps::<6>")]
    rms_norm_eps: f64,
    #[serde(default = "default_hidden_act")]
    hidden_act: String,
    /// Bias on q/k/v/o projections (Llama only; Mistral has none).
    #[serde(default)]
    attention_bias: bool,
    /// Bias on gate/up/down projections.
    #[serde(default)]
    mlp_bias: bool,
    /// Both Llama and Mistral default to separate input and output matrices.
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    max_position_embeddings: Option<usize>,
    /// transformers 4.x
    #[serde(default)]
    rope_theta: Option<f64>,
    /// transformers 4.x
    #[serde(default)]
    rope_scaling: Option<RopeConfig>,
    /// transformers 5.x
    #[serde(default)]
    rope_parameters: Option<RopeConfig>,
    /// Mistral: query position p sees key j only when p − j < sliding_window.
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_hidden_act() -> String {
    "silu".into()
}

/// `rope_scaling` (4.x) or `rope_parameters` (5.x). Kept as separate fields rather than
/// serde aliases because 4.x configs often carry both `type` and `rope_type`, which an
/// alias would reject as a duplicate.
#[derive(Deserialize)]
struct RopeConfig {
    #[serde(default)]
    rope_type: Option<String>,
    #[serde(default, rename = "type")]
    legacy_type: Option<String>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    factor: Option<f64>,
}

/// Base θ and the linear scaling factor (1: none) from whichever layout the config uses.
fn rope_settings(cfg: &LlamaConfig, dir: &Path) -> Result<(f32, f32)> {
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
    let factor = match kind {
        None | Some("default") => 1.0,
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
            factor
        }
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "RoPE scaling type `{other}` ({}, field `{field}`); supported: default, linear",
                dir.join("config.json").display()
            )))
        }
    };
    Ok((theta as f32, factor as f32))
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault. Mistral's
/// window applies to Mistral only: transformers ignores the field on Llama, so do we.
pub(super) fn read(dir: &Path, mistral: bool) -> Result<(Arch, TokenIds)> {
    let cfg: LlamaConfig = read_config(dir)?;
    crate::positive!(dir, cfg; vocab_size, hidden_size, intermediate_size, num_attention_heads)?;
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
    if mistral && cfg.sliding_window == Some(0) {
        return Err(bad_field(dir, "sliding_window", "must be at least 1"));
    }
    let (theta, linear_scaling) = rope_settings(&cfg, dir)?;
    let activation = Activation::from_hf_name(&cfg.hidden_act)
        .map_err(|e| bad_field(dir, "hidden_act", e.to_string()))?;
    let mut arch = Arch::llama(
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        heads,
        kv_heads,
        cfg.max_position_embeddings.unwrap_or(0),
    );
    arch.decoder = Some(StackDims {
        layers: cfg.num_hidden_layers,
        heads,
        kv_heads,
        head_dim,
        ffn_dim: cfg.intermediate_size,
    });
    arch.position = Position::Rope {
        theta,
        linear_scaling,
        max_len: cfg.max_position_embeddings,
    };
    arch.norm.eps = epsilon(dir, "rms_norm_eps", cfg.rms_norm_eps)?;
    arch.attention.qkv_bias = cfg.attention_bias;
    arch.attention.out_bias = cfg.attention_bias;
    arch.attention.window = if mistral { cfg.sliding_window } else { None };
    arch.ffn.activation = activation;
    arch.ffn.bias = cfg.mlp_bias;
    arch.embed.padding_idx = cfg.tokens.pad();
    arch.head = Head::lm(cfg.tie_word_embeddings);
    Ok((arch, cfg.tokens))
}

/// Whether `arch` is exactly a Llama (so it saves as `LlamaForCausalLM`).
pub(super) fn fits(arch: &Arch) -> bool {
    let a = &arch.attention;
    arch.plain_decoder()
        && matches!(arch.position, Position::Rope { .. })
        && arch.norm.kind == crate::layers::NormKind::RmsNorm
        && arch.residual == crate::block::Residual::PreNorm
        && a.qkv_bias == a.out_bias
        && a.scale.is_none()
        && !a.scale_by_layer
        && a.window.is_none()
        && arch.ffn.gated
        && arch.ffn.activation == Activation::Silu
}

/// `config.json` of a Llama folder for `arch` (which [`fits`]).
pub(super) fn config_json(arch: &Arch) -> Value {
    let d = arch.stack();
    let (theta, factor, max_len) = match arch.position {
        Position::Rope {
            theta,
            linear_scaling,
            max_len,
        } => (theta, linear_scaling, max_len),
        _ => (10_000.0, 1.0, None),
    };
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": arch.vocab,
        "hidden_size": arch.d_model,
        "intermediate_size": d.ffn_dim,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_len.unwrap_or(2048),
        "rms_norm_eps": super::json_f32(arch.norm.eps),
        "rope_theta": super::json_f32(theta),
        "rope_scaling": if factor == 1.0 {
            Value::Null
        } else {
            json!({"rope_type": "linear", "factor": super::json_f32(factor)})
        },
        "attention_bias": arch.attention.qkv_bias,
        "mlp_bias": arch.ffn.bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": arch.head.tied(),
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": true,
    })
}

/// The name table: qkv's modules → Llama's and Mistral's (see [`Name`]).
pub(super) fn names() -> Vec<Name> {
    let mut t = vec![
        same("embed_tokens", "model.embed_tokens"),
        same("head.lm_head", "lm_head"),
        same("decoder.final_norm", "model.norm"),
    ];
    let layer = [
        ("attn_norm", "input_layernorm"),
        ("ffn_norm", "post_attention_layernorm"),
        ("attn.q", "self_attn.q_proj"),
        ("attn.k", "self_attn.k_proj"),
        ("attn.v", "self_attn.v_proj"),
        ("attn.o", "self_attn.o_proj"),
        // FeedForward's `up` is the activated branch: Hugging Face's gate_proj
        ("ffn.up", "mlp.gate_proj"),
        ("ffn.gate_up", "mlp.up_proj"),
        ("ffn.down", "mlp.down_proj"),
    ];
    for (qkv, hf) in layer {
        t.push(same(
            &format!("decoder.layers.{{l}}.{qkv}"),
            &format!("model.layers.{{l}}.{hf}"),
        ));
    }
    t
}
