//! Phi-3 and Phi-3.5 (`Phi3ForCausalLM`): Llama's layout with the projections fused
//! (`qkv_proj`: the Q, K and V rows one block after another, `gate_up_proj`: the
//! activated half first), RoPE over the first `partial_rotary_factor` of each head, a
//! sliding window on every layer when `sliding_window` is set, and LongRoPE
//! (`rope_scaling.type = "longrope"`, also spelled `su`): one factor per frequency,
//! `short_factor` while a call stays within `original_max_position_embeddings` and
//! `long_factor` past it, with cos and sin scaled by the attention factor.

use std::path::Path;

use serde::Deserialize;

use super::def::{as_given, no_aliases, FamilyDef};
use super::llama::{rope_settings, RopeFields};
use super::names::{same, stored, How, Name};
use super::special::TokenIds;
use crate::error::Result;
use crate::io::{bad_field, epsilon, read_config};
use crate::models::net::arch::{Arch, Head, Position, StackDims};
use crate::ops::Activation;
use crate::position::rope_scaling::HfRopeConfig;

pub(crate) static PHI3: FamilyDef = FamilyDef {
    name: "phi3",
    architectures: &["Phi3ForCausalLM"],
    read: |dir, _, _| read(dir),
    names,
    prefix: "model.",
    aliases: no_aliases,
    special: as_given,
    fresh: None,
    native: false,
};

/// Hugging Face `Phi3Config`, with its defaults where the file is silent.
#[derive(Deserialize)]
struct Phi3Config {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
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
    rope_parameters: Option<HfRopeConfig>,
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
    crate::positive!(dir, cfg; vocab_size, hidden_size, intermediate_size, num_attention_heads)?;
    let (c, heads, layers) = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_hidden_layers,
    );
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(bad_field(
            dir,
            "num_key_value_heads",
            format!("{kv_heads} key/value heads must divide num_attention_heads = {heads}"),
        ));
    }
    let head_dim = cfg.head_dim.unwrap_or(c / heads);
    let share = cfg.partial_rotary_factor.unwrap_or(1.0);
    // transformers: int(head_dim * partial_rotary_factor)
    let rotary = (head_dim as f64 * share) as usize;
    if !(share > 0.0 && share <= 1.0) || rotary < 2 || !rotary.is_multiple_of(2) {
        return Err(bad_field(
            dir,
            "partial_rotary_factor",
            format!("{share} of a head of {head_dim} rotates {rotary} dimensions: RoPE needs an even number, at least 2"),
        ));
    }
    // Phi3Config reads the kinds `su` and `yarn` of its first releases as LongRoPE
    for entry in [&mut cfg.rope_scaling, &mut cfg.rope_parameters]
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
        parameters: cfg.rope_parameters.as_ref(),
        original_max: Some(cfg.original_max_position_embeddings.unwrap_or(4096)),
        rotary_dim: rotary,
    };
    let (theta, scaling) = rope_settings(rope, dir, max_positions)?;
    let mut arch = Arch::llama(cfg.vocab_size, c, layers, heads, kv_heads, 0);
    arch.decoder = Some(StackDims {
        layers,
        heads,
        kv_heads,
        head_dim,
        ffn_dim: cfg.intermediate_size,
    });
    arch.position = Position::Rope {
        theta,
        scaling,
        max_len: Some(max_positions),
        rotary_dim: (rotary < head_dim).then_some(rotary),
    };
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
    let mut t = vec![
        same("embed_tokens", "model.embed_tokens"),
        same("head.lm_head", "lm_head"),
        same("decoder.final_norm", "model.norm"),
        same("decoder.layers.{l}.attn_norm", &layer("input_layernorm")),
        same(
            "decoder.layers.{l}.ffn_norm",
            &layer("post_attention_layernorm"),
        ),
        same("decoder.layers.{l}.attn.o", &layer("self_attn.o_proj")),
        same("decoder.layers.{l}.ffn.down", &layer("mlp.down_proj")),
    ];
    // qkv_proj: H, then G, then G heads of rows
    let qkv_shares = [s.heads, s.kv_heads, s.kv_heads];
    for (k, p) in ["q", "k", "v"].iter().enumerate() {
        t.push(stored(
            &format!("decoder.layers.{{l}}.attn.{p}"),
            &layer("self_attn.qkv_proj"),
            How::Blocks(k, qkv_shares),
        ));
    }
    // gate_up_proj: the activated half (FeedForward's `up`), then the gating one
    for (k, p) in ["up", "gate_up"].iter().enumerate() {
        t.push(stored(
            &format!("decoder.layers.{{l}}.ffn.{p}"),
            &layer("mlp.gate_up_proj"),
            How::Blocks(k, [1, 1, 0]),
        ));
    }
    t
}
