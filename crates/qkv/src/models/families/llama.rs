//! Llama, Mistral, Qwen2 and Qwen3 (`LlamaForCausalLM`, `MistralForCausalLM`,
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM`): a pre-norm decoder with RMSNorm, rotary
//! positions in Hugging Face's half-split layout, grouped-query attention and a SwiGLU
//! feed-forward block. Mistral is the same network with a sliding attention window;
//! Qwen2 has biases on the Q, K and V projections (not on O) and a window on its upper
//! layers when `use_sliding_window` asks for one. Qwen3 drops those biases (unless
//! `attention_bias`), keeps Qwen2's window rule, and normalises each query and key
//! head (RMSNorm over D, `q_norm` / `k_norm`) before RoPE.
//!
//! Config layouts: transformers 4.x writes `rope_theta` and `rope_scaling` at the top
//! level (`rope_scaling` names its kind `type` or `rope_type`); 5.x folds both into
//! `rope_parameters: {rope_type, rope_theta, factor}`. Both are read.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use super::checks::DecoderSizes;
use super::def::{hf_family, FamilyDef, Fresh, ReadConfig};
use super::keys::{KeyTable, Rule::*, DECODER_SIZES, DECODER_TRAINING, ROPE_KEYS};
use super::names::{layer_rows, same, Name};
use super::special::TokenIds;
use crate::error::{Error, Result};
use crate::io::{bad_field, epsilon, read_config};
use crate::models::net::arch::{Arch, Head, Position};
use crate::ops::Activation;
use crate::position::rope_scaling::{HfRopeConfig, RopeParameters, RopeScaling};

pub(crate) static LLAMA: FamilyDef = hf_family(
    "llama",
    &["LlamaForCausalLM"],
    |dir, _, _| read(dir, Variant::Llama),
    |_| names(),
    "model.",
)
.with_keys(KEYS)
.saving_fresh(Fresh { fits, config_json })
.in_gguf("llama");

pub(crate) static MISTRAL: FamilyDef =
    llama_like("mistral", &["MistralForCausalLM"], |dir, _, _| {
        read(dir, Variant::Mistral)
    });

pub(crate) static QWEN2: FamilyDef = llama_like("qwen2", &["Qwen2ForCausalLM"], |dir, _, _| {
    read(dir, Variant::Qwen2)
})
.in_gguf("qwen2");

pub(crate) static QWEN3: FamilyDef = llama_like("qwen3", &["Qwen3ForCausalLM"], |dir, _, _| {
    read(dir, Variant::Qwen3)
})
.in_gguf("qwen3");

/// A family read as Llama with its own `config.json` reader, which a fresh model is
/// never saved as (it saves as Llama).
const fn llama_like(
    name: &'static str,
    architectures: &'static [&'static str],
    read: ReadConfig,
) -> FamilyDef {
    FamilyDef {
        name,
        architectures,
        read,
        fresh: None,
        gguf: None,
        ..LLAMA
    }
}

/// `config.json` of a Llama or Mistral checkpoint, as transformers writes it.
#[derive(Deserialize)]
struct LlamaConfig {
    #[serde(flatten)]
    sizes: DecoderSizes,
    /// Absent or null means hidden_size / num_attention_heads.
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
    max_position_embeddings: Option<usize>,
    /// transformers 4.x
    rope_theta: Option<f64>,
    /// transformers 4.x
    rope_scaling: Option<HfRopeConfig>,
    /// transformers 5.x
    rope_parameters: Option<RopeParameters>,
    /// Mistral: query position p sees key j only when p − j < sliding_window.
    sliding_window: Option<usize>,
    /// Qwen2: the window is used only when this is true …
    #[serde(default)]
    use_sliding_window: bool,
    /// … on layers from this one up (transformers' default: 28) …
    max_window_layers: Option<usize>,
    /// … unless each layer's kind is listed (`full_attention` / `sliding_attention`).
    layer_types: Option<Vec<String>>,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_hidden_act() -> String {
    "silu".into()
}

/// A config's RoPE fields in either layout (transformers 4.x: `rope_theta` +
/// `rope_scaling`; 5.x: `rope_parameters`).
pub(super) struct RopeFields<'c> {
    pub theta: Option<f64>,
    pub scaling: Option<&'c HfRopeConfig>,
    pub parameters: Option<&'c HfRopeConfig>,
    /// the config's top-level `original_max_position_embeddings` (Phi-3), which a
    /// LongRoPE entry without its own reads
    pub original_max: Option<usize>,
    /// R, the dimensions of a head that rotate (LongRoPE has a factor per pair)
    pub rotary_dim: usize,
}

/// The one `rope_parameters` entry of a model whose layers all rotate alike (see
/// [`RopeParameters::single`]); errors name the field.
pub(super) fn single_rope<'c>(
    dir: &Path,
    parameters: Option<&'c RopeParameters>,
) -> Result<Option<&'c HfRopeConfig>> {
    parameters
        .map(RopeParameters::single)
        .transpose()
        .map(Option::flatten)
        .map_err(|e| match e {
            Error::Invalid { field, reason } => {
                bad_field(dir, &format!("rope_parameters.{field}"), reason)
            }
            e => e,
        })
}

/// RoPE as the config describes it, for heads of `head_dim`: base θ and the scaling
/// (see [`rope_settings`]), `rotary_dim` of them rotating, `max_len` the trained context.
pub(super) fn rope_position(
    cfg: RopeFields,
    dir: &Path,
    max_positions: usize,
    head_dim: usize,
    max_len: Option<usize>,
) -> Result<Position> {
    let rotary = cfg.rotary_dim;
    let (theta, scaling) = rope_settings(cfg, dir, max_positions)?;
    Ok(Position::Rope {
        theta,
        scaling,
        max_len,
        rotary_dim: (rotary < head_dim).then_some(rotary),
    })
}

/// Base θ and the scaling from whichever layout the config uses, resolved as
/// transformers' `rope_init_fn`s resolve them. `max_positions` is the config's
/// `max_position_embeddings` (or the family's default when absent).
fn rope_settings(cfg: RopeFields, dir: &Path, max_positions: usize) -> Result<(f32, RopeScaling)> {
    let (field, rope) = match (cfg.parameters, cfg.scaling) {
        (Some(p), _) => ("rope_parameters", Some(p)),
        (None, s) => ("rope_scaling", s),
    };
    let theta = rope
        .and_then(|r| r.rope_theta)
        .or(cfg.theta)
        .unwrap_or(10_000.0);
    if !(theta.is_finite() && theta > 1.0) {
        return Err(bad_field(
            dir,
            "rope_theta",
            format!("must be finite and > 1, got {theta}"),
        ));
    }
    let Some(rope) = rope else {
        return Ok((theta as f32, RopeScaling::None));
    };
    let mut entry = rope.clone();
    if entry.original_max_position_embeddings.is_none() {
        entry.original_max_position_embeddings = cfg.original_max;
    }
    let scaling = entry
        .resolve(max_positions, field == "rope_parameters")
        .and_then(|s| {
            s.check_width("", cfg.rotary_dim)?;
            Ok(s)
        });
    let scaling = scaling.map_err(|e| match e {
        Error::Invalid {
            field: entry,
            reason,
        } => bad_field(dir, &format!("{field}.{entry}"), reason),
        Error::Unsupported(what) => Error::Unsupported(format!(
            "{what} ({}, field `{field}`)",
            dir.join("config.json").display()
        )),
        e => e,
    })?;
    Ok((theta as f32, scaling))
}

/// Which of the four networks a folder holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Variant {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault. Mistral's
/// window applies to Mistral only: transformers ignores the field on Llama, so do we.
pub(super) fn read(dir: &Path, variant: Variant) -> Result<(Arch, TokenIds)> {
    let cfg: LlamaConfig = read_config(dir)?;
    let heads = cfg.sizes.heads(dir)?;
    let (h, c) = (heads.0, cfg.sizes.hidden_size);
    let head_dim = match cfg.head_dim {
        Some(d) => d,
        // Qwen3Config's default, whatever the width
        None if variant == Variant::Qwen3 => 128,
        None if c.is_multiple_of(h) => c / h,
        None => {
            return Err(bad_field(
                dir,
                "hidden_size",
                format!(
                    "{c} is not a multiple of num_attention_heads = {h} (and no head_dim is given)"
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
    // transformers' defaults where the config is silent
    let max_positions = cfg.max_position_embeddings.unwrap_or(match variant {
        Variant::Llama => 2048,
        Variant::Mistral => 4096 * 32,
        Variant::Qwen2 | Variant::Qwen3 => 32768,
    });
    let rope = RopeFields {
        theta: cfg.rope_theta,
        scaling: cfg.rope_scaling.as_ref(),
        parameters: single_rope(dir, cfg.rope_parameters.as_ref())?,
        original_max: None,
        rotary_dim: head_dim,
    };
    let position = rope_position(
        rope,
        dir,
        max_positions,
        head_dim,
        cfg.max_position_embeddings,
    )?;
    let activation = Activation::from_hf_name(&cfg.hidden_act)
        .map_err(|e| bad_field(dir, "hidden_act", e.to_string()))?;
    let mut arch = cfg.sizes.llama(heads, head_dim);
    arch.position = position;
    arch.norm.eps = epsilon(dir, "rms_norm_eps", cfg.rms_norm_eps)?;
    let window = window(&cfg, dir, variant)?;
    arch.attention.qkv_bias = cfg.attention_bias || variant == Variant::Qwen2;
    arch.attention.out_bias = cfg.attention_bias && variant != Variant::Qwen2;
    arch.attention.window = window.size;
    arch.attention.window_from_layer = window.from_layer;
    arch.attention.local_layers = window.layers;
    arch.attention.qk_norm = variant == Variant::Qwen3;
    arch.ffn.activation = activation;
    arch.ffn.bias = cfg.mlp_bias && variant != Variant::Qwen2;
    arch.embed.padding_idx = cfg.tokens.pad();
    arch.head = Head::lm(cfg.tie_word_embeddings);
    Ok((arch, cfg.tokens))
}

/// Where the sliding window applies. Mistral: `sliding_window` on every layer. Qwen2 and
/// Qwen3 (transformers' `layer_types`): only with `use_sliding_window`, on the layers
/// listed as `sliding_attention`, by default those from `max_window_layers` up.
struct Window {
    size: Option<usize>,
    /// the first windowed layer, when they are one top run of layers
    from_layer: usize,
    /// which layers are windowed, when they are not one top run
    layers: Option<Vec<bool>>,
}

fn window(cfg: &LlamaConfig, dir: &Path, variant: Variant) -> Result<Window> {
    let plain = |size| Window {
        size,
        from_layer: 0,
        layers: None,
    };
    let size = match variant {
        Variant::Llama => return Ok(plain(None)),
        Variant::Mistral => cfg.sliding_window,
        Variant::Qwen2 | Variant::Qwen3 if cfg.use_sliding_window => {
            Some(cfg.sliding_window.unwrap_or(4096))
        }
        Variant::Qwen2 | Variant::Qwen3 => None,
    };
    if size == Some(0) {
        return Err(bad_field(dir, "sliding_window", "must be at least 1"));
    }
    if variant == Variant::Mistral || size.is_none() {
        return Ok(plain(size));
    }
    let layers = cfg.sizes.num_hidden_layers;
    let sliding: Vec<bool> = match &cfg.layer_types {
        Some(types) => sliding_layers(dir, types, layers)?,
        None => {
            let from = cfg.max_window_layers.unwrap_or(28);
            (0..layers).map(|l| l >= from).collect()
        }
    };
    let from = sliding.iter().position(|&s| s).unwrap_or(layers);
    let top_run = sliding[from..].iter().all(|&s| s);
    Ok(Window {
        size: if from < layers { size } else { None },
        from_layer: if top_run { from } else { 0 },
        layers: (!top_run).then_some(sliding),
    })
}

/// transformers' `layer_types` (one of `full_attention`, `sliding_attention` per
/// layer) as flags, true for sliding layers; errors name the field.
pub(super) fn sliding_layers(dir: &Path, types: &[String], layers: usize) -> Result<Vec<bool>> {
    if types.len() != layers {
        return Err(bad_field(
            dir,
            "layer_types",
            format!("lists {} layers, the model has {layers}", types.len()),
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "full_attention" => Ok(false),
            "sliding_attention" => Ok(true),
            other => Err(bad_field(
                dir,
                "layer_types",
                format!("unknown layer type `{other}` (full_attention, sliding_attention)"),
            )),
        })
        .collect()
}

/// Whether `arch` is exactly a Llama (so it saves as `LlamaForCausalLM`).
pub(super) fn fits(arch: &Arch) -> bool {
    let a = &arch.attention;
    arch.plain_decoder()
        && matches!(
            arch.position,
            Position::Rope {
                rotary_dim: None,
                ..
            }
        )
        && arch.norm.kind == crate::layers::NormKind::RmsNorm
        && arch.residual == crate::block::Residual::PreNorm
        && a.qkv_bias == a.out_bias
        && a.scale.is_none()
        && !a.scale_by_layer
        && a.window.is_none()
        && arch.ffn.gated
        && arch.ffn.activation == Activation::Silu
        && match &arch.position {
            Position::Rope {
                scaling, max_len, ..
            } => scaling_json(scaling, max_len.unwrap_or(2048)).is_some(),
            _ => false,
        }
}

/// `rope_scaling` as transformers reads it back to the same scaling, for a config whose
/// `max_position_embeddings` is `max_positions`; `None` where no config can say it (a
/// dynamic threshold or a YaRN factor at odds with that length), and `Null` for none.
fn scaling_json(scaling: &RopeScaling, max_positions: usize) -> Option<Value> {
    let f = crate::io::json_f32;
    Some(match scaling {
        RopeScaling::None => Value::Null,
        &RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": f(factor)}),
        RopeScaling::Llama3(l) => json!({
            "rope_type": "llama3",
            "factor": f(l.factor),
            "low_freq_factor": f(l.low_freq_factor),
            "high_freq_factor": f(l.high_freq_factor),
            "original_max_position_embeddings": l.original_max,
        }),
        RopeScaling::Yarn(y) => {
            let mut v = json!({
                "rope_type": "yarn",
                "factor": f(y.factor),
                "beta_fast": f(y.beta_fast),
                "beta_slow": f(y.beta_slow),
                "truncate": y.truncate,
                "attention_factor": f(y.attention_factor),
            });
            // transformers then takes the factor as the ratio of the two lengths
            if y.original_max != max_positions {
                if (max_positions as f64 / y.original_max as f64) as f32 != y.factor {
                    return None;
                }
                v["original_max_position_embeddings"] = json!(y.original_max);
            }
            v
        }
        &RopeScaling::Dynamic { factor, max_len } if max_len == max_positions => {
            json!({"rope_type": "dynamic", "factor": f(factor)})
        }
        // a fresh model with LongRoPE saves as qkv's own folder
        RopeScaling::Dynamic { .. } | RopeScaling::LongRope(_) => return None,
    })
}

/// `config.json` of a Llama folder for `arch` (which [`fits`]).
pub(super) fn config_json(arch: &Arch) -> Value {
    let d = arch.stack();
    let (theta, scaling, max_len) = match &arch.position {
        Position::Rope {
            theta,
            scaling,
            max_len,
            ..
        } => (*theta, scaling.clone(), max_len.unwrap_or(2048)),
        _ => (10_000.0, RopeScaling::None, 2048),
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
        "max_position_embeddings": max_len,
        "rms_norm_eps": crate::io::json_f32(arch.norm.eps),
        "rope_theta": crate::io::json_f32(theta),
        "rope_scaling": scaling_json(&scaling, max_len).unwrap_or(Value::Null),
        "attention_bias": arch.attention.qkv_bias,
        "mlp_bias": arch.ffn.bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": arch.head.tied(),
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": true,
    })
}

/// The name table: qkv's modules → Llama's, Mistral's and the Qwens' (see [`Name`]).
pub(super) fn names() -> Vec<Name> {
    let mut t = model_ends();
    t.extend(layer_rows("decoder", "model.layers.{l}.", &PRE_NORM_ROWS));
    t.extend(layer_rows("decoder", "model.layers.{l}.", &ATTENTION_ROWS));
    t.extend(layer_rows("decoder", "model.layers.{l}.", &GATED_MLP_ROWS));
    t
}

/// The token table, head and final norm of a decoder in Llama's layout (`model.`).
pub(super) fn model_ends() -> Vec<Name> {
    vec![
        same("embed_tokens", "model.embed_tokens"),
        same("head.lm_head", "lm_head"),
        same("decoder.final_norm", "model.norm"),
    ]
}

/// A layer's two norms in Llama's layout, after `model.layers.{l}.`.
pub(super) const PRE_NORM_ROWS: [(&str, &str); 2] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
];

/// A layer's attention in Llama's layout, after `model.layers.{l}.` (the q/k norms
/// exactly where the model has them).
pub(super) const ATTENTION_ROWS: [(&str, &str); 6] = [
    ("attn.q", "self_attn.q_proj"),
    ("attn.k", "self_attn.k_proj"),
    ("attn.v", "self_attn.v_proj"),
    ("attn.o", "self_attn.o_proj"),
    ("attn.q_norm", "self_attn.q_norm"),
    ("attn.k_norm", "self_attn.k_norm"),
];

/// A layer's gated MLP in Llama's layout. FeedForward's `up` is the activated branch:
/// Hugging Face's gate_proj.
pub(super) const GATED_MLP_ROWS: [(&str, &str); 3] = [
    ("ffn.up", "mlp.gate_proj"),
    ("ffn.gate_up", "mlp.up_proj"),
    ("ffn.down", "mlp.down_proj"),
];

/// The keys of `LlamaConfig`, `MistralConfig`, `Qwen2Config` and `Qwen3Config` (one
/// reader; the window keys mean what each variant makes of them), see `keys.rs`.
const KEYS: KeyTable = &[
    DECODER_SIZES,
    ROPE_KEYS,
    DECODER_TRAINING,
    &[
        ("rms_norm_eps", Read),
        ("hidden_act", Read),
        ("attention_bias", Read),
        ("mlp_bias", Read),
        ("tie_word_embeddings", Read),
        ("max_position_embeddings", Read),
        ("sliding_window", Read),
        ("use_sliding_window", Read),
        ("max_window_layers", Read),
        ("layer_types", Read),
        (
            "pretraining_tp",
            Irrelevant("slices of the tensor-parallel product, summed to the same numbers"),
        ),
    ],
];
