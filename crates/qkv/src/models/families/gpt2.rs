//! GPT-2 (Radford et al., 2019): a decoder-only Transformer. Token embeddings plus
//! learned absolute positions (`wpe`), pre-norm blocks with causal self-attention, a
//! final `ln_f`, and an LM head tied to the token embeddings.
//!
//! The family's quirk is OpenAI's `Conv1D`: it computes `x·W + b` with W stored
//! `[in, out]`, the transpose of `nn.Linear`. The attention's Q, K and V projections are
//! fused into one `c_attn` of width 3C whose three column blocks are the three parallel
//! maps W_Q, W_K, W_V; the name table reads and writes them as parts of that tensor.
//!
//! Checkpoints of `GPT2LMHeadModel` name tensors `transformer.h.0.attn.c_attn.weight`;
//! those saved from the base `GPT2Model` (OpenAI's original `gpt2`) lack the
//! `transformer.` prefix. Both load.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use super::def::{hf_family, FamilyDef, Fresh};
use super::keys::{KeyRows, KeyTable, Rule, Rule::*, CACHE, DROPOUT, INIT};
use super::names::{same, stored, How, Name};
use super::special::TokenIds;
use crate::error::Result;
use crate::io::{aliased_size, bad_field, check_heads, check_positive, epsilon, read_config};
use crate::models::net::arch::{Arch, Head, Position, StackDims};
use crate::ops::Activation;

pub(crate) static GPT2: FamilyDef = hf_family(
    "gpt2",
    &["GPT2LMHeadModel", "GPT2Model"],
    |dir, _, _| read(dir),
    |_| names(),
    "transformer.",
)
.with_keys(KEYS)
.saving_fresh(Fresh { fits, config_json });

/// Hugging Face `GPT2Config`. Sizes are required; the alternative names are those of
/// `attribute_map` (`hidden_size` → `n_embd`, …), which some tools write instead.
#[derive(Deserialize)]
struct Gpt2Config {
    #[serde(flatten)]
    sizes: Sizes,
    n_positions: Option<usize>,
    max_position_embeddings: Option<usize>,
    vocab_size: usize,
    /// `None` (or absent) means 4·C.
    n_inner: Option<usize>,
    #[serde(default = "crate::io::eps::<5>")]
    layer_norm_epsilon: f64,
    #[serde(default = "default_activation")]
    activation_function: String,
    /// Divide scores by √D (always true in released checkpoints).
    #[serde(default = "crate::io::yes")]
    scale_attn_weights: bool,
    /// Also divide layer l's scores by l + 1 (off in OpenAI's checkpoints).
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
    #[serde(default = "crate::io::yes")]
    tie_word_embeddings: bool,
    #[serde(flatten)]
    tokens: TokenIds,
}

/// Width, heads and layers under each name GPT-2-style configs use (`attribute_map`
/// aliases, and BLOOM's `n_embed`): the first present wins.
#[derive(Deserialize)]
pub(super) struct Sizes {
    n_embd: Option<usize>,
    n_embed: Option<usize>,
    hidden_size: Option<usize>,
    n_head: Option<usize>,
    num_attention_heads: Option<usize>,
    n_layer: Option<usize>,
    num_hidden_layers: Option<usize>,
}

impl Sizes {
    /// (C, H, layers), checked: H divides C. Errors name `width` (the config's own
    /// name for C), `n_head` or `n_layer`.
    pub(super) fn read(&self, dir: &Path, width: &str) -> Result<(usize, usize, usize)> {
        let c = self.n_embd.or(self.n_embed);
        let c = aliased_size(dir, (width, c), ("hidden_size", self.hidden_size), 1)?;
        let h = ("num_attention_heads", self.num_attention_heads);
        let heads = aliased_size(dir, ("n_head", self.n_head), h, 1)?;
        check_heads(dir, "n_head", heads, width, c)?;
        let l = ("num_hidden_layers", self.num_hidden_layers);
        let layers = aliased_size(dir, ("n_layer", self.n_layer), l, 0)?;
        Ok((c, heads, layers))
    }
}

fn default_activation() -> String {
    "gelu_new".into()
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault.
pub(super) fn read(dir: &Path) -> Result<(Arch, TokenIds)> {
    let cfg: Gpt2Config = read_config(dir)?;
    let (c, heads, layers) = cfg.sizes.read(dir, "n_embd")?;
    let positions = aliased_size(
        dir,
        ("n_positions", cfg.n_positions),
        ("max_position_embeddings", cfg.max_position_embeddings),
        1,
    )?;
    let ffn = cfg.n_inner.unwrap_or(4 * c);
    check_positive(dir, &[("vocab_size", cfg.vocab_size), ("n_inner", ffn)])?;
    let mut arch = Arch::gpt2(cfg.vocab_size, c, layers, heads, positions);
    arch.decoder = Some(StackDims {
        ffn_dim: ffn,
        ..arch.stack()
    });
    arch.norm.eps = epsilon(dir, "layer_norm_epsilon", cfg.layer_norm_epsilon)?;
    arch.ffn.activation = Activation::from_hf_name(&cfg.activation_function)
        .map_err(|e| bad_field(dir, "activation_function", e.to_string()))?;
    arch.attention.scale = (!cfg.scale_attn_weights).then_some(1.0);
    arch.attention.scale_by_layer = cfg.scale_attn_by_inverse_layer_idx;
    arch.head = Head::lm(cfg.tie_word_embeddings);
    Ok((arch, cfg.tokens))
}

/// Whether `arch` is exactly a GPT-2 (so it saves as `GPT2LMHeadModel`).
pub(super) fn fits(arch: &Arch) -> bool {
    let (a, f) = (&arch.attention, &arch.ffn);
    let plain = |d: StackDims| d.kv_heads == d.heads && d.heads * d.head_dim == arch.d_model;
    arch.plain_decoder()
        && arch.decoder.is_some_and(plain)
        && matches!(arch.position, Position::Learned { .. })
        && arch.norm.kind == crate::layers::NormKind::LayerNorm
        && arch.norm.bias
        && arch.residual == crate::block::Residual::PreNorm
        && a.qkv_bias
        && a.out_bias
        && a.window.is_none()
        && a.scale.is_none_or(|s| s == 1.0)
        && !f.gated
        && f.bias
        && f.activation != Activation::Silu
}

/// `config.json` of a GPT-2 folder for `arch` (which [`fits`]).
pub(super) fn config_json(arch: &Arch) -> Value {
    let d = arch.stack();
    json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": arch.vocab,
        "n_positions": arch.max_positions(),
        "n_embd": arch.d_model,
        "n_layer": d.layers,
        "n_head": d.heads,
        "n_inner": d.ffn_dim,
        "activation_function": match arch.ffn.activation {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::GeluTanh | Activation::Silu => "gelu_new",
        },
        "layer_norm_epsilon": crate::io::json_f32(arch.norm.eps),
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "summary_first_dropout": 0.0,
        "scale_attn_weights": arch.attention.scale.is_none(),
        "scale_attn_by_inverse_layer_idx": arch.attention.scale_by_layer,
        "reorder_and_upcast_attn": false,
        "tie_word_embeddings": arch.head.tied(),
        "initializer_range": 0.02,
        "use_cache": true,
    })
}

/// The name table: qkv's modules → GPT-2's (see [`Name`]).
pub(super) fn names() -> Vec<Name> {
    let h = |m: &str| format!("transformer.h.{{l}}.{m}");
    let mut t = vec![
        same("embed_tokens", "transformer.wte"),
        same("head.lm_head", "lm_head"),
        same("decoder.embed_positions", "transformer.wpe"),
        same("decoder.final_norm", "transformer.ln_f"),
        same("decoder.layers.{l}.attn_norm", &h("ln_1")),
        same("decoder.layers.{l}.ffn_norm", &h("ln_2")),
        stored("decoder.layers.{l}.attn.o", &h("attn.c_proj"), How::Conv1d),
        stored("decoder.layers.{l}.ffn.up", &h("mlp.c_fc"), How::Conv1d),
        stored("decoder.layers.{l}.ffn.down", &h("mlp.c_proj"), How::Conv1d),
    ];
    for (k, p) in ["q", "k", "v"].iter().enumerate() {
        let qkv = format!("decoder.layers.{{l}}.attn.{p}");
        t.push(stored(&qkv, &h("attn.c_attn"), How::Conv1dPart(k)));
    }
    t
}

/// `GPT2Config`'s keys, see `keys.rs`.
const KEYS: KeyTable = &[
    SIZE_KEYS,
    &[
        ("n_positions", Read),
        ("max_position_embeddings", Read),
        ("n_inner", Read),
        ("layer_norm_epsilon", Read),
        ("activation_function", Read),
        ("scale_attn_weights", Read),
        ("scale_attn_by_inverse_layer_idx", Read),
        ("tie_word_embeddings", Read),
        (
            "reorder_and_upcast_attn",
            Irrelevant("computes the scores in f32 for half-precision training; qkv's are f32"),
        ),
        (
            "n_ctx",
            Irrelevant("an old copy of n_positions that transformers does not read"),
        ),
        ("attn_pdrop", DROPOUT),
        ("embd_pdrop", DROPOUT),
        ("resid_pdrop", DROPOUT),
        ("summary_first_dropout", DROPOUT),
        ("summary_type", DOUBLE_HEADS),
        ("summary_use_proj", DOUBLE_HEADS),
        ("summary_activation", DOUBLE_HEADS),
        ("summary_proj_to_labels", DOUBLE_HEADS),
        ("initializer_range", INIT),
        ("use_cache", CACHE),
    ],
];

/// The sizes GPT-2's and BLOOM's configs give under either name (`Sizes`).
pub(super) const SIZE_KEYS: KeyRows = &[
    ("n_embd", Read),
    ("n_embed", Read),
    ("hidden_size", Read),
    ("n_head", Read),
    ("num_attention_heads", Read),
    ("n_layer", Read),
    ("num_hidden_layers", Read),
];

const DOUBLE_HEADS: Rule = Irrelevant("GPT2DoubleHeadsModel's multiple-choice head, not loaded");
