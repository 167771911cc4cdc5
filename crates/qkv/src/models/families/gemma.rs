//! Gemma, Gemma 2 and Gemma 3's text model (`GemmaForCausalLM`, `Gemma2ForCausalLM`,
//! `Gemma3ForCausalLM`): a Llama-like decoder with its own choices at almost every step.
//!
//! - token embeddings multiplied by √C;
//! - RMSNorm scaling by 1 + w (its weights start at 0);
//! - GeGLU in the feed-forward block, a head width of 256 and a tied head by default;
//!
//! the first Gemma stops there (pre-norm, D^−½, every layer global). Gemma 2 and 3 add
//!
//! - a norm before and after each sub-layer (`input_layernorm`, `post_attention_layernorm`,
//!   `pre_feedforward_layernorm`, `post_feedforward_layernorm`);
//! - scores scaled by `query_pre_attn_scalar`^−½ rather than D^−½;
//! - local (sliding-window) and global layers by `layer_types`, alternating in Gemma 2
//!   and five local to one global in Gemma 3;
//! - Gemma 2 soft-caps the attention scores (`attn_logit_softcapping`) and the final
//!   logits (`final_logit_softcapping`);
//! - Gemma 3 normalises each query and key head (`q_norm`, `k_norm`, also 1 + w) and
//!   rotates local layers with their own base (`rope_local_base_freq`, unscaled), global
//!   ones with `rope_theta` and `rope_scaling`. transformers 5.x writes both as
//!   `rope_parameters: {"full_attention": {…}, "sliding_attention": {…}}`.

use std::path::Path;

use serde::Deserialize;

use super::checks::DecoderSizes;
use super::def::{hf_family, FamilyDef};
use super::keys::{KeyTable, Rule::*, CACHE, DECODER_SIZES, DECODER_TRAINING, ROPE_KEYS};
use super::llama::{
    model_ends, rope_position, single_rope, sliding_layers, RopeFields, ATTENTION_ROWS,
    GATED_MLP_ROWS, PRE_NORM_ROWS,
};
use super::names::{layer_rows, Name};
use super::special::TokenIds;
use crate::block::Residual;
use crate::error::{Error, Result};
use crate::io::{bad_field, epsilon, read_config};
use crate::models::net::arch::{Arch, Head};
use crate::ops::Activation;
use crate::position::rope_scaling::{HfRopeConfig, RopeParameters};

pub(crate) static GEMMA: FamilyDef = hf_family(
    "gemma",
    &["GemmaForCausalLM"],
    |dir, _, _| read(dir, Version::One),
    names,
    "model.",
)
.with_keys(GEMMA_KEYS)
.in_gguf("gemma");

pub(crate) static GEMMA2: FamilyDef = hf_family(
    "gemma2",
    &["Gemma2ForCausalLM"],
    |dir, _, _| read(dir, Version::Two),
    names,
    "model.",
)
.with_keys(KEYS)
.in_gguf("gemma2");

pub(crate) static GEMMA3: FamilyDef = hf_family(
    "gemma3_text",
    &["Gemma3ForCausalLM"],
    |dir, _, _| read(dir, Version::Three),
    names,
    "model.",
)
.with_keys(KEYS)
.in_gguf("gemma3");

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    One,
    Two,
    Three,
}

/// `config.json` of Gemma 2 (`Gemma2Config`) or Gemma 3's text model
/// (`Gemma3TextConfig`), with transformers' defaults where the file is silent.
#[derive(Deserialize)]
struct GemmaConfig {
    #[serde(flatten)]
    sizes: DecoderSizes,
    #[serde(default = "default_head_dim")]
    head_dim: usize,
    /// Gemma 2 and 3 read this; the published configs' `hidden_act` beside it is unused
    hidden_activation: Option<String>,
    /// the first Gemma reads this (transformers 4.57 and 5.x alike)
    hidden_act: Option<String>,
    max_position_embeddings: Option<usize>,
    #[serde(default = "crate::io::eps::<6>")]
    rms_norm_eps: f64,
    #[serde(default = "crate::io::yes")]
    tie_word_embeddings: bool,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeConfig>,
    rope_parameters: Option<RopeParameters>,
    rope_local_base_freq: Option<f64>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default = "default_head_dim")]
    query_pre_attn_scalar: usize,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    /// Gemma 3's period of local and global layers when `layer_types` is absent
    sliding_window_pattern: Option<usize>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    /// Absent and null mean false (5.x writes null).
    #[serde(default)]
    use_bidirectional_attention: bool,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_head_dim() -> usize {
    256
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault.
fn read(dir: &Path, version: Version) -> Result<(Arch, TokenIds)> {
    let cfg: GemmaConfig = read_config(dir)?;
    crate::positive!(dir, cfg; head_dim, query_pre_attn_scalar)?;
    if cfg.use_bidirectional_attention {
        return Err(Error::Unsupported(format!(
            "bidirectional Gemma 3 (EmbeddingGemma) ({}, field `use_bidirectional_attention`)",
            dir.join("config.json").display()
        )));
    }
    let heads = cfg.sizes.heads(dir)?;
    let layers = cfg.sizes.num_hidden_layers;
    if !cfg.head_dim.is_multiple_of(2) {
        return Err(bad_field(
            dir,
            "head_dim",
            format!("RoPE needs an even head width, got {}", cfg.head_dim),
        ));
    }
    let max_positions = cfg.max_position_embeddings.unwrap_or(match version {
        Version::One | Version::Two => 8192,
        Version::Three => 131_072,
    });
    // Gemma 3's global layers rotate by the `full_attention` entry, its local ones by
    // `sliding_attention` (5.x); the others rotate every layer alike
    let (global, local_entry) = match (&cfg.rope_parameters, version) {
        (Some(p @ RopeParameters::ByLayerType(_)), Version::Three) => (
            p.for_layers("full_attention"),
            p.for_layers("sliding_attention"),
        ),
        (p, _) => (single_rope(dir, p.as_ref())?, None),
    };
    let rope = RopeFields {
        theta: cfg.rope_theta,
        scaling: cfg.rope_scaling.as_ref(),
        parameters: global,
        original_max: None,
        rotary_dim: cfg.head_dim,
    };
    let position = rope_position(rope, dir, max_positions, cfg.head_dim, Some(max_positions))?;
    let mut arch = cfg.sizes.llama(heads, cfg.head_dim);
    arch.position = position;
    arch.norm.eps = epsilon(dir, "rms_norm_eps", cfg.rms_norm_eps)?;
    arch.norm.unit_offset = true;
    arch.embed.scale = true;
    arch.embed.padding_idx = cfg.tokens.pad();
    arch.head = Head::lm(cfg.tie_word_embeddings);
    let act = match version {
        Version::One => ("hidden_act", cfg.hidden_act.as_deref()),
        _ => ("hidden_activation", cfg.hidden_activation.as_deref()),
    };
    arch.ffn.activation = Activation::from_hf_name(act.1.unwrap_or("gelu_pytorch_tanh"))
        .map_err(|e| bad_field(dir, act.0, e.to_string()))?;
    arch.attention.qkv_bias = cfg.attention_bias;
    arch.attention.out_bias = cfg.attention_bias;
    if version == Version::One {
        return Ok((arch, cfg.tokens));
    }
    arch.residual = Residual::Sandwich;
    let a = &mut arch.attention;
    a.scale = Some((cfg.query_pre_attn_scalar as f64).powf(-0.5) as f32);
    let cap = |field: &str, v: Option<f64>| match v {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(bad_field(
            dir,
            field,
            format!("a soft cap must be finite and > 0, got {c}"),
        )),
        v => Ok(v.map(|c| c as f32)),
    };
    a.softcap = cap("attn_logit_softcapping", cfg.attn_logit_softcapping)?;
    arch.logit_softcap = cap("final_logit_softcapping", cfg.final_logit_softcapping)?;
    let local = match (&cfg.layer_types, version) {
        (Some(types), _) => sliding_layers(dir, types, layers)?,
        // transformers' defaults: every other layer from the first (Gemma 2), five of
        // every six (Gemma 3)
        (None, Version::One | Version::Two) => (0..layers).map(|l| (l + 1) % 2 != 0).collect(),
        (None, Version::Three) => {
            let period = cfg.sliding_window_pattern.unwrap_or(6).max(1);
            (0..layers).map(|l| (l + 1) % period != 0).collect()
        }
    };
    let window = cfg.sliding_window.unwrap_or(4096);
    if window == 0 {
        return Err(bad_field(dir, "sliding_window", "must be at least 1"));
    }
    let a = &mut arch.attention;
    a.window = local.contains(&true).then_some(window);
    a.local_layers = Some(local);
    if version == Version::Three {
        a.qk_norm = true;
        let base = match local_entry {
            Some(entry) => local_rope_base(dir, entry)?,
            None => cfg.rope_local_base_freq.unwrap_or(10_000.0),
        };
        if !(base.is_finite() && base > 1.0) {
            return Err(bad_field(
                dir,
                "rope_local_base_freq",
                format!("must be finite and > 1, got {base}"),
            ));
        }
        a.local_rope_theta = Some(base as f32);
    }
    Ok((arch, cfg.tokens))
}

/// The base of Gemma 3's local layers from their own `rope_parameters` entry, which
/// must be unscaled (transformers builds them so).
fn local_rope_base(dir: &Path, entry: &HfRopeConfig) -> Result<f64> {
    let field = "rope_parameters.sliding_attention";
    match entry.rope_type.as_deref().or(entry.legacy_type.as_deref()) {
        None | Some("default") => {}
        Some(kind) => {
            return Err(Error::Unsupported(format!(
                "`{kind}` RoPE scaling on Gemma 3's local layers ({}, field `{field}`)",
                dir.join("config.json").display()
            )))
        }
    }
    Ok(entry.rope_theta.unwrap_or(10_000.0))
}

/// The name table: qkv's modules → Gemma's (see [`Name`]).
fn names(arch: &Arch) -> Vec<Name> {
    let mut t = model_ends();
    if arch.residual != Residual::Sandwich {
        t.extend(layer_rows("decoder", "model.layers.{l}.", &PRE_NORM_ROWS));
        t.extend(layer_rows("decoder", "model.layers.{l}.", &ATTENTION_ROWS));
        t.extend(layer_rows("decoder", "model.layers.{l}.", &GATED_MLP_ROWS));
        return t;
    }
    t.extend(layer_rows(
        "decoder",
        "model.layers.{l}.",
        &[
            ("attn_norm", "input_layernorm"),
            ("attn_post_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("ffn_post_norm", "post_feedforward_layernorm"),
        ],
    ));
    t.extend(layer_rows("decoder", "model.layers.{l}.", &ATTENTION_ROWS));
    t.extend(layer_rows("decoder", "model.layers.{l}.", &GATED_MLP_ROWS));
    t
}

/// The keys of `Gemma2Config` and `Gemma3TextConfig`, see `keys.rs`.
const KEYS: KeyTable = &[
    DECODER_SIZES,
    ROPE_KEYS,
    DECODER_TRAINING,
    &[
        ("hidden_activation", Read),
        (
            "hidden_act",
            Irrelevant(
                "the published checkpoints carry it beside hidden_activation, which Gemma 2 and 3 read",
            ),
        ),
        ("max_position_embeddings", Read),
        ("rms_norm_eps", Read),
        ("tie_word_embeddings", Read),
        ("rope_local_base_freq", Read),
        ("attention_bias", Read),
        ("query_pre_attn_scalar", Read),
        ("sliding_window", Read),
        ("layer_types", Read),
        ("sliding_window_pattern", Read),
        (
            "_sliding_window_pattern",
            Irrelevant("written beside layer_types, which decides"),
        ),
        ("final_logit_softcapping", Read),
        ("attn_logit_softcapping", Read),
        ("use_bidirectional_attention", Read),
        ("cache_implementation", CACHE),
    ],
];

/// `GemmaConfig`'s keys (the first Gemma), see `keys.rs`.
const GEMMA_KEYS: KeyTable = &[
    DECODER_SIZES,
    ROPE_KEYS,
    DECODER_TRAINING,
    &[
        ("hidden_act", Read),
        (
            "hidden_activation",
            Irrelevant("GemmaConfig keeps it; the model reads hidden_act (4.57 and 5.x)"),
        ),
        ("max_position_embeddings", Read),
        ("rms_norm_eps", Read),
        ("tie_word_embeddings", Read),
        ("attention_bias", Read),
        ("use_bidirectional_attention", Read),
    ],
];
