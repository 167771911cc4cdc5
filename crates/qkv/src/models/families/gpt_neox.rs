//! GPT-NeoX (`GPTNeoXForCausalLM`; EleutherAI's Pythia line): a pre-norm decoder with
//! LayerNorm, biases, a GELU MLP, and RoPE over only the first `rotary_pct` of each
//! head's dimensions. Its layers are parallel by default (`use_parallel_residual`):
//! attention and MLP both read the layer's input, x + attn(ln₁(x)) + mlp(ln₂(x));
//! otherwise they run one after the other as in GPT-2.
//!
//! Quirks: the fused `query_key_value` projection interleaves Q, K and V per head
//! (rows `[H, 3, D]`, as BLOOM's), read and written as three parts of one tensor; the
//! head is `embed_out`, untied unless `tie_word_embeddings`.

use std::path::Path;

use serde::Deserialize;

use super::checks;
use super::def::{hf_family, FamilyDef};
use super::keys::{KeyTable, Rule::*, CACHE, DROPOUT, INIT};
use super::llama::{rope_position, single_rope, RopeFields};
use super::names::{layer_rows, same, stored, How, Name};
use super::special::TokenIds;
use crate::block::Residual;
use crate::error::Result;
use crate::io::{bad_field, check_heads, epsilon, read_config};
use crate::models::net::arch::{Arch, Head};
use crate::ops::Activation;
use crate::position::rope_scaling::{HfRopeConfig, RopeParameters};

pub(crate) static GPT_NEOX: FamilyDef = hf_family(
    "gpt_neox",
    &["GPTNeoXForCausalLM"],
    |dir, _, _| read(dir),
    names,
    "gpt_neox.",
)
.with_keys(KEYS);

/// Hugging Face `GPTNeoXConfig`. Released Pythia configs name the rotary share and
/// base `rotary_pct` and `rotary_emb_base`; transformers 4.57 also writes them as
/// `partial_rotary_factor` and `rope_theta`, which win when present.
#[derive(Deserialize)]
struct NeoxConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    rotary_pct: Option<f64>,
    partial_rotary_factor: Option<f64>,
    rotary_emb_base: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeConfig>,
    rope_parameters: Option<RopeParameters>,
    max_position_embeddings: Option<usize>,
    #[serde(default = "crate::io::eps::<5>")]
    layer_norm_eps: f64,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "crate::io::yes")]
    use_parallel_residual: bool,
    #[serde(default = "crate::io::yes")]
    attention_bias: bool,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_act() -> String {
    "gelu".into()
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault.
pub(super) fn read(dir: &Path) -> Result<(Arch, TokenIds)> {
    let cfg: NeoxConfig = read_config(dir)?;
    crate::positive!(dir, cfg; vocab_size, hidden_size, intermediate_size, num_attention_heads)?;
    let (c, heads) = (cfg.hidden_size, cfg.num_attention_heads);
    check_heads(dir, "num_attention_heads", heads, "hidden_size", c)?;
    let head_dim = c / heads;
    let parameters = single_rope(dir, cfg.rope_parameters.as_ref())?;
    // 5.x keeps the share inside rope_parameters
    let nested = parameters.and_then(|p| p.partial_rotary_factor);
    let (share_field, share) = match (cfg.partial_rotary_factor, nested, cfg.rotary_pct) {
        (Some(f), ..) => ("partial_rotary_factor", f),
        (None, Some(f), _) => ("rope_parameters.partial_rotary_factor", f),
        (None, None, Some(p)) => ("rotary_pct", p),
        (None, None, None) => ("rotary_pct", 0.25),
    };
    let rotary = checks::rotary_dims(dir, share_field, head_dim, share)?;
    let max_positions = cfg.max_position_embeddings.unwrap_or(2048);
    let rope = RopeFields {
        theta: cfg.rope_theta.or(cfg.rotary_emb_base),
        scaling: cfg.rope_scaling.as_ref(),
        parameters,
        original_max: None,
        rotary_dim: rotary,
    };
    let position = rope_position(rope, dir, max_positions, head_dim, Some(max_positions))?;
    let mut arch = Arch::gpt2(cfg.vocab_size, c, cfg.num_hidden_layers, heads, 1)
        .with_widths(head_dim, cfg.intermediate_size);
    arch.position = position;
    arch.norm.eps = epsilon(dir, "layer_norm_eps", cfg.layer_norm_eps)?;
    if cfg.use_parallel_residual {
        arch.residual = Residual::Parallel;
    }
    arch.attention.qkv_bias = cfg.attention_bias;
    arch.attention.out_bias = cfg.attention_bias;
    arch.ffn.activation = Activation::from_hf_name(&cfg.hidden_act)
        .map_err(|e| bad_field(dir, "hidden_act", e.to_string()))?;
    arch.head = Head::lm(cfg.tie_word_embeddings);
    Ok((arch, cfg.tokens))
}

/// The name table: qkv's modules → GPT-NeoX's (see [`Name`]).
pub(super) fn names(arch: &Arch) -> Vec<Name> {
    let layer = |m: &str| format!("gpt_neox.layers.{{l}}.{m}");
    let mut t = vec![
        same("embed_tokens", "gpt_neox.embed_in"),
        same("head.lm_head", "embed_out"),
        same("decoder.final_norm", "gpt_neox.final_layer_norm"),
    ];
    t.extend(layer_rows(
        "decoder",
        "gpt_neox.layers.{l}.",
        &[
            ("attn_norm", "input_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
            ("attn.o", "attention.dense"),
            ("ffn.up", "mlp.dense_h_to_4h"),
            ("ffn.down", "mlp.dense_4h_to_h"),
        ],
    ));
    let d = arch.stack().head_dim;
    for (k, p) in ["q", "k", "v"].iter().enumerate() {
        t.push(stored(
            &format!("decoder.layers.{{l}}.attn.{p}"),
            &layer("attention.query_key_value"),
            How::HeadPart(k, d),
        ));
    }
    t
}

/// `GPTNeoXConfig`'s keys, see `keys.rs`.
const KEYS: KeyTable = &[&[
    ("hidden_size", Read),
    ("num_hidden_layers", Read),
    ("num_attention_heads", Read),
    ("intermediate_size", Read),
    ("hidden_act", Read),
    ("rotary_pct", Read),
    ("partial_rotary_factor", Read),
    ("rotary_emb_base", Read),
    ("rope_theta", Read),
    ("rope_scaling", Read),
    ("rope_parameters", Read),
    ("max_position_embeddings", Read),
    ("layer_norm_eps", Read),
    ("tie_word_embeddings", Read),
    ("use_parallel_residual", Read),
    ("attention_bias", Read),
    ("attention_dropout", DROPOUT),
    ("hidden_dropout", DROPOUT),
    ("classifier_dropout", DROPOUT),
    ("initializer_range", INIT),
    ("use_cache", CACHE),
]];
