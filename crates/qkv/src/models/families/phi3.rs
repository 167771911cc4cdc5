//! Phi-3 and Phi-3.5 (`Phi3ForCausalLM`): Llama's layout with the projections fused
//! (`qkv_proj`: the Q, K and V rows one block after another, `gate_up_proj`: the
//! activated half first), RoPE over the first `partial_rotary_factor` of each head, a
//! sliding window on every layer when `sliding_window` is set, and LongRoPE
//! (`rope_scaling.type = "longrope"`, also spelled `su`): one factor per frequency,
//! `short_factor` while a call stays within `original_max_position_embeddings` and
//! `long_factor` past it, with cos and sin scaled by the attention factor.

use std::path::Path;

use serde::Deserialize;

use super::checks::{self, DecoderSizes};
use super::def::{hf_family, FamilyDef};
use super::keys::{KeyTable, Rule::*, DECODER_SIZES, DECODER_TRAINING, DROPOUT, ROPE_KEYS};
use super::llama::{model_ends, rope_position, single_rope, RopeFields, PRE_NORM_ROWS};
use super::names::{fused_gated_rows, fused_qkv_rows, layer_rows, Name};
use super::special::TokenIds;
use crate::error::Result;
use crate::io::{bad_field, epsilon, read_config};
use crate::models::net::arch::{Arch, Head};
use crate::ops::Activation;
use crate::position::rope_scaling::{HfRopeConfig, RopeParameters};

pub(crate) static PHI3: FamilyDef = hf_family(
    "phi3",
    &["Phi3ForCausalLM"],
    |dir, _, _| read(dir),
    names,
    "model.",
)
.with_keys(KEYS)
.in_gguf("phi3");

/// Hugging Face `Phi3Config`, with its defaults where the file is silent.
#[derive(Deserialize)]
struct Phi3Config {
    #[serde(flatten)]
    sizes: DecoderSizes,
    head_dim: Option<usize>,
    #[serde(default = "default_act")]
    hidden_act: String,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
    #[serde(default = "crate::io::eps::<5>")]
    rms_norm_eps: f64,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeConfig>,
    rope_parameters: Option<RopeParameters>,
    partial_rotary_factor: Option<f64>,
    sliding_window: Option<usize>,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_act() -> String {
    "silu".into()
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault.
fn read(dir: &Path) -> Result<(Arch, TokenIds)> {
    let mut cfg: Phi3Config = read_config(dir)?;
    let heads = cfg.sizes.heads(dir)?;
    let head_dim = cfg.head_dim.unwrap_or(cfg.sizes.hidden_size / heads.0);
    let mut parameters = single_rope(dir, cfg.rope_parameters.as_ref())?.cloned();
    // 5.x keeps the share inside rope_parameters (Phi-4-mini: 0.75, with LongRoPE
    // factors for each of the rotating pairs)
    let (share_field, share) = match (
        cfg.partial_rotary_factor,
        parameters.as_ref().and_then(|p| p.partial_rotary_factor),
    ) {
        (Some(f), _) => ("partial_rotary_factor", f),
        (None, Some(f)) => ("rope_parameters.partial_rotary_factor", f),
        (None, None) => ("partial_rotary_factor", 1.0),
    };
    let rotary = checks::rotary_dims(dir, share_field, head_dim, share)?;
    // Phi3Config reads the kinds `su` and `yarn` of its first releases as LongRoPE
    for entry in [&mut cfg.rope_scaling, &mut parameters]
        .into_iter()
        .flatten()
    {
        if matches!(entry.legacy_type.as_deref(), Some("su" | "yarn")) {
            entry.rope_type = Some("longrope".into());
        }
    }
    let max_positions = cfg.max_position_embeddings.unwrap_or(4096);
    let rope = RopeFields {
        theta: cfg.rope_theta,
        scaling: cfg.rope_scaling.as_ref(),
        parameters: parameters.as_ref(),
        original_max: Some(cfg.original_max_position_embeddings.unwrap_or(4096)),
        rotary_dim: rotary,
    };
    let position = rope_position(rope, dir, max_positions, head_dim, Some(max_positions))?;
    let mut arch = cfg.sizes.llama(heads, head_dim);
    arch.position = position;
    arch.norm.eps = epsilon(dir, "rms_norm_eps", cfg.rms_norm_eps)?;
    if cfg.sliding_window == Some(0) {
        return Err(bad_field(dir, "sliding_window", "must be at least 1"));
    }
    arch.attention.window = cfg.sliding_window;
    arch.ffn.activation = Activation::from_hf_name(&cfg.hidden_act)
        .map_err(|e| bad_field(dir, "hidden_act", e.to_string()))?;
    arch.embed.padding_idx = cfg.tokens.pad();
    arch.head = Head::lm(cfg.tie_word_embeddings);
    Ok((arch, cfg.tokens))
}

/// The name table: qkv's modules → Phi-3's (see [`Name`]).
fn names(arch: &Arch) -> Vec<Name> {
    let s = arch.stack();
    let layer = |m: &str| format!("model.layers.{{l}}.{m}");
    let mut t = model_ends();
    t.extend(layer_rows("decoder", "model.layers.{l}.", &PRE_NORM_ROWS));
    t.extend(layer_rows(
        "decoder",
        "model.layers.{l}.",
        &[
            ("attn.o", "self_attn.o_proj"),
            ("ffn.down", "mlp.down_proj"),
        ],
    ));
    t.extend(fused_qkv_rows(
        "decoder",
        &layer("self_attn.qkv_proj"),
        s.heads,
        s.kv_heads,
    ));
    t.extend(fused_gated_rows("decoder", &layer("mlp.gate_up_proj")));
    t
}

/// `Phi3Config`'s keys, see `keys.rs`.
const KEYS: KeyTable = &[
    DECODER_SIZES,
    ROPE_KEYS,
    DECODER_TRAINING,
    &[
        ("hidden_act", Read),
        ("max_position_embeddings", Read),
        ("original_max_position_embeddings", Read),
        ("rms_norm_eps", Read),
        ("tie_word_embeddings", Read),
        ("partial_rotary_factor", Read),
        ("sliding_window", Read),
        ("embd_pdrop", DROPOUT),
        ("resid_pdrop", DROPOUT),
    ],
];
