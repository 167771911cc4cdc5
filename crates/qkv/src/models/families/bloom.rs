//! BLOOM (BigScience, 2022): a decoder-only Transformer with no position vectors at
//! all. Position enters only through ALiBi, a per-head linear penalty on the scores,
//! so there is no maximum length. Token embeddings pass through their own LayerNorm
//! (`word_embeddings_layernorm`), then pre-norm blocks, a final `ln_f` and an LM head
//! tied to the embeddings.
//!
//! Quirks: the fused `query_key_value` projection interleaves Q, K and V per head (rows
//! `[H, 3, D]`, as Hugging Face's `_reshape` views them), read and written as three
//! parts of one tensor; `apply_residual_connection_post_layernorm` takes the residual
//! after the norm; the MLP's GELU is the tanh approximation (`bloom_gelu_forward`).

use std::path::Path;

use serde::Deserialize;

use super::def::{hf_family, FamilyDef};
use super::keys::{KeyTable, Rule, Rule::*, CACHE, DROPOUT, INIT};
use super::names::{same, stored, How, Name};
use super::special::TokenIds;
use crate::block::Residual;
use crate::error::Result;
use crate::io::{check_positive, epsilon, read_config};
use crate::models::net::arch::{Arch, Head, Position};

pub(crate) static BLOOM: FamilyDef = hf_family(
    "bloom",
    &["BloomForCausalLM"],
    |dir, _, _| read(dir),
    names,
    "transformer.",
)
.with_keys(KEYS);

/// Hugging Face `BloomConfig`. Released configs disagree on names (`bloom-560m` writes
/// `hidden_size` and `n_head`, the 176B model `n_embed` and `num_attention_heads`), so
/// each size is read under every name and the first present wins.
#[derive(Deserialize)]
struct BloomConfig {
    #[serde(flatten)]
    sizes: super::gpt2::Sizes,
    vocab_size: usize,
    #[serde(default = "crate::io::eps::<5>")]
    layer_norm_epsilon: f64,
    #[serde(default)]
    apply_residual_connection_post_layernorm: bool,
    #[serde(default = "crate::io::yes")]
    tie_word_embeddings: bool,
    #[serde(flatten)]
    tokens: TokenIds,
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault.
pub(super) fn read(dir: &Path) -> Result<(Arch, TokenIds)> {
    let cfg: BloomConfig = read_config(dir)?;
    let (c, heads, layers) = cfg.sizes.read(dir, "hidden_size")?;
    check_positive(dir, &[("vocab_size", cfg.vocab_size)])?;
    let mut arch = Arch::gpt2(cfg.vocab_size, c, layers, heads, 1);
    arch.position = Position::Alibi;
    arch.norm.eps = epsilon(dir, "layer_norm_epsilon", cfg.layer_norm_epsilon)?;
    if cfg.apply_residual_connection_post_layernorm {
        arch.residual = Residual::PreNormFromNormed;
    }
    arch.embed.norm = true;
    arch.head = Head::lm(cfg.tie_word_embeddings);
    Ok((arch, cfg.tokens))
}

/// The name table: qkv's modules → BLOOM's (see [`Name`]).
pub(super) fn names(arch: &Arch) -> Vec<Name> {
    let h = |m: &str| format!("transformer.h.{{l}}.{m}");
    let mut t = vec![
        same("embed_tokens", "transformer.word_embeddings"),
        same("head.lm_head", "lm_head"),
        same(
            "decoder.embed_norm",
            "transformer.word_embeddings_layernorm",
        ),
        same("decoder.final_norm", "transformer.ln_f"),
        same("decoder.layers.{l}.attn_norm", &h("input_layernorm")),
        same(
            "decoder.layers.{l}.ffn_norm",
            &h("post_attention_layernorm"),
        ),
        same("decoder.layers.{l}.attn.o", &h("self_attention.dense")),
        same("decoder.layers.{l}.ffn.up", &h("mlp.dense_h_to_4h")),
        same("decoder.layers.{l}.ffn.down", &h("mlp.dense_4h_to_h")),
    ];
    let d = arch.stack().head_dim;
    for (k, p) in ["q", "k", "v"].iter().enumerate() {
        let qkv = format!("decoder.layers.{{l}}.attn.{p}");
        t.push(stored(
            &qkv,
            &h("self_attention.query_key_value"),
            How::HeadPart(k, d),
        ));
    }
    t
}

/// `BloomConfig`'s keys, and the Megatron-DeepSpeed ones the published checkpoints
/// carry, which transformers ignores (see `keys.rs`).
const KEYS: KeyTable = &[
    super::gpt2::SIZE_KEYS,
    &[
        ("layer_norm_epsilon", Read),
        ("apply_residual_connection_post_layernorm", Read),
        ("tie_word_embeddings", Read),
        ("attention_dropout", DROPOUT),
        ("hidden_dropout", DROPOUT),
        ("initializer_range", INIT),
        ("use_cache", CACHE),
        ("pretraining_tp", TP),
        ("slow_but_exact", TP),
        ("attention_softmax_in_fp32", MEGATRON),
        ("bias_dropout_fusion", MEGATRON),
        ("masked_softmax_fusion", MEGATRON),
        ("offset_alibi", MEGATRON),
        ("skip_bias_add", MEGATRON),
        ("skip_bias_add_qkv", MEGATRON),
        ("seq_length", MEGATRON),
        (
            "unk_token_id",
            Irrelevant("the tokenizer's; no forward reads it"),
        ),
    ],
];

const TP: Rule = Irrelevant("slices of the tensor-parallel product, summed to the same numbers");
const MEGATRON: Rule = Irrelevant("a Megatron-DeepSpeed training setting transformers ignores");
