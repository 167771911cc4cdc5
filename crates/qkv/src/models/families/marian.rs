//! Marian (`MarianMTModel`, the OPUS-MT translation models): the original encoder-decoder
//! Transformer of "Attention Is All You Need", nearly as the paper draws it.
//!
//! - Token embeddings shared by encoder, decoder and LM head (unless the config says
//!   otherwise), multiplied by √d_model when `scale_embedding`, plus fixed sinusoidal
//!   positions in Marian's split layout (all sines, then all cosines), with no offset.
//! - Post-norm layers: the encoder has self-attention and a feed-forward block; the
//!   decoder has causal self-attention, cross-attention over the encoder output, and a
//!   feed-forward block. No final stack norm, no embedding norm.
//! - Logits = h · Eᵀ + `final_logits_bias`, a fixed buffer saved with the checkpoint
//!   (zeros when absent, as Hugging Face initialises it).
//!
//! Positions count real tokens (`cumsum(mask) − 1`). Hugging Face numbers the source
//! 0..S whatever the mask; for right padding, the tokenizer's side, the two agree, and
//! for left padding ours equals running each row alone.

use std::path::Path;

use serde::Deserialize;

use super::def::{hf_family, FamilyDef};
use super::keys::{KeyTable, Rule, Rule::*, CACHE, DROPOUT, INIT};
use super::names::{same, Name};
use super::special::{Ids, TokenIds};
use crate::block::Residual;
use crate::error::Result;
use crate::io::{bad_field, check_heads, check_positive, read_config};
use crate::models::net::arch::{Arch, Head, Position, StackDims};
use crate::ops::Activation;
use crate::position::SinusoidalLayout;

pub(crate) static MARIAN: FamilyDef = hf_family(
    "marian",
    &["MarianMTModel"],
    |dir, _, _| read(dir),
    names,
    "model.",
)
.with_keys(KEYS)
.with_aliases(shared_table);

/// Older Marian checkpoints keep the shared table under the encoder.
fn shared_table(name: &str) -> Vec<String> {
    match name == "model.shared.weight" {
        true => vec![
            "model.encoder.embed_tokens.weight".into(),
            "encoder.embed_tokens.weight".into(),
        ],
        false => Vec::new(),
    }
}

/// Hugging Face `MarianConfig`, with its defaults for absent fields and the
/// `attribute_map` names (`hidden_size`, `num_attention_heads`) as aliases.
#[derive(Deserialize)]
struct MarianConfig {
    #[serde(default = "crate::io::size::<58101>")]
    vocab_size: usize,
    /// Target vocabulary when it differs from the source one (`None`: the same).
    decoder_vocab_size: Option<usize>,
    #[serde(default = "crate::io::size::<1024>", alias = "hidden_size")]
    d_model: usize,
    #[serde(default = "crate::io::size::<12>")]
    encoder_layers: usize,
    #[serde(default = "crate::io::size::<12>")]
    decoder_layers: usize,
    #[serde(default = "crate::io::size::<16>", alias = "num_attention_heads")]
    encoder_attention_heads: usize,
    #[serde(default = "crate::io::size::<16>")]
    decoder_attention_heads: usize,
    #[serde(default = "crate::io::size::<4096>")]
    encoder_ffn_dim: usize,
    #[serde(default = "crate::io::size::<4096>")]
    decoder_ffn_dim: usize,
    #[serde(default = "crate::io::size::<1024>")]
    max_position_embeddings: usize,
    #[serde(default = "default_activation")]
    activation_function: String,
    #[serde(default)]
    scale_embedding: bool,
    #[serde(default = "crate::io::yes")]
    share_encoder_decoder_embeddings: bool,
    #[serde(default = "crate::io::yes")]
    tie_word_embeddings: bool,
    /// The special ids default as `MarianConfig` has them (an explicit `null` is unset
    /// and taken from generation_config.json), so they are not the shared flattened
    /// [`TokenIds`].
    #[serde(default = "default_pad")]
    pad_token_id: Option<Ids>,
    #[serde(default = "default_eos")]
    eos_token_id: Option<Ids>,
    bos_token_id: Option<Ids>,
    #[serde(default = "default_pad")]
    decoder_start_token_id: Option<Ids>,
}

fn default_activation() -> String {
    "gelu".into()
}
fn default_pad() -> Option<Ids> {
    Some(Ids::One(58100))
}
fn default_eos() -> Option<Ids> {
    Some(Ids::One(0))
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault.
pub(super) fn read(dir: &Path) -> Result<(Arch, TokenIds)> {
    let cfg: MarianConfig = read_config(dir)?;
    let c = cfg.d_model;
    check_positive(dir, &[("d_model", c)])?;
    for (field, heads) in [
        ("encoder_attention_heads", cfg.encoder_attention_heads),
        ("decoder_attention_heads", cfg.decoder_attention_heads),
    ] {
        check_heads(dir, field, heads, "d_model", c)?;
    }
    crate::positive!(dir, cfg; encoder_ffn_dim, decoder_ffn_dim, vocab_size, max_position_embeddings)?;
    let tgt_vocab = cfg.decoder_vocab_size.unwrap_or(cfg.vocab_size);
    if cfg.share_encoder_decoder_embeddings && tgt_vocab != cfg.vocab_size {
        return Err(bad_field(
            dir,
            "decoder_vocab_size",
            format!(
                "{tgt_vocab} differs from vocab_size = {} while share_encoder_decoder_embeddings is true",
                cfg.vocab_size
            ),
        ));
    }
    let activation = Activation::from_hf_name(&cfg.activation_function)
        .map_err(|e| bad_field(dir, "activation_function", e.to_string()))?;
    let stack = |layers, heads: usize, ffn_dim| StackDims {
        layers,
        heads,
        kv_heads: heads,
        head_dim: c / heads,
        ffn_dim,
    };
    let mut arch = Arch::vaswani(tgt_vocab, c, 0, 1, cfg.max_position_embeddings);
    arch.src_vocab = (!cfg.share_encoder_decoder_embeddings).then_some(cfg.vocab_size);
    arch.encoder = Some(stack(
        cfg.encoder_layers,
        cfg.encoder_attention_heads,
        cfg.encoder_ffn_dim,
    ));
    arch.decoder = Some(stack(
        cfg.decoder_layers,
        cfg.decoder_attention_heads,
        cfg.decoder_ffn_dim,
    ));
    arch.position = Position::Sinusoidal {
        max_len: cfg.max_position_embeddings,
        layout: SinusoidalLayout::Split,
    };
    debug_assert_eq!(arch.residual, Residual::PostNorm);
    arch.ffn.activation = activation;
    arch.embed.scale = cfg.scale_embedding;
    arch.embed.padding_idx = cfg
        .pad_token_id
        .as_ref()
        .and_then(|i| i.valid().first().copied());
    arch.head = Head::Lm {
        tied: cfg.tie_word_embeddings,
        rescale: false,
        logits_bias: true,
    };
    let tokens = TokenIds {
        eos_token_id: cfg.eos_token_id,
        bos_token_id: cfg.bos_token_id,
        pad_token_id: cfg.pad_token_id,
        decoder_start_token_id: cfg.decoder_start_token_id,
    };
    Ok((arch, tokens))
}

/// The name table: qkv's modules → Marian's (see [`Name`]).
pub(super) fn names(arch: &Arch) -> Vec<Name> {
    let mut t = vec![
        same("head.lm_head", "lm_head"),
        same("src_embed_tokens", "model.encoder.embed_tokens"),
        match arch.src_vocab {
            None => same("embed_tokens", "model.shared"),
            Some(_) => same("embed_tokens", "model.decoder.embed_tokens"),
        },
    ];
    let layer = [
        ("attn_norm", "self_attn_layer_norm"),
        ("cross_norm", "encoder_attn_layer_norm"),
        ("ffn_norm", "final_layer_norm"),
        ("ffn.up", "fc1"),
        ("ffn.down", "fc2"),
    ];
    for stack in ["encoder", "decoder"] {
        let projections = [("q", "q"), ("k", "k"), ("v", "v"), ("o", "out")];
        let attention = [("attn", "self_attn"), ("cross", "encoder_attn")]
            .into_iter()
            .flat_map(|(a, h)| {
                projections.map(|(p, q)| (format!("{a}.{p}"), format!("{h}.{q}_proj")))
            });
        let modules = layer
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .chain(attention);
        for (qkv, hf) in modules {
            t.push(same(
                &format!("{stack}.layers.{{l}}.{qkv}"),
                &format!("model.{stack}.layers.{{l}}.{hf}"),
            ));
        }
    }
    t
}

/// `MarianConfig`'s keys, and the BART-era ones of the first OPUS-MT conversions, which
/// `MarianConfig` ignores (see `keys.rs`).
const KEYS: KeyTable = &[&[
    ("decoder_vocab_size", Read),
    ("d_model", Read),
    ("hidden_size", Read),
    ("encoder_layers", Read),
    ("decoder_layers", Read),
    ("encoder_attention_heads", Read),
    ("num_attention_heads", Read),
    ("decoder_attention_heads", Read),
    ("encoder_ffn_dim", Read),
    ("decoder_ffn_dim", Read),
    ("max_position_embeddings", Read),
    ("activation_function", Read),
    ("scale_embedding", Read),
    ("share_encoder_decoder_embeddings", Read),
    ("tie_word_embeddings", Read),
    (
        "num_hidden_layers",
        Irrelevant("MarianConfig's copy of encoder_layers; the model reads encoder_layers"),
    ),
    ("dropout", DROPOUT),
    ("attention_dropout", DROPOUT),
    ("activation_dropout", DROPOUT),
    ("classif_dropout", DROPOUT),
    ("classifier_dropout", DROPOUT),
    ("encoder_layerdrop", DROPOUT),
    ("decoder_layerdrop", DROPOUT),
    ("init_std", INIT),
    ("use_cache", CACHE),
    (
        "gradient_checkpointing",
        Irrelevant("recomputes activations in training; the same numbers"),
    ),
    ("normalize_before", BART),
    ("normalize_embedding", BART),
    ("static_position_embeddings", BART),
    ("add_bias_logits", BART),
    ("add_final_layer_norm", BART),
    ("extra_pos_embeddings", BART),
]];

const BART: Rule =
    Irrelevant("a BART-era key of the first OPUS-MT conversions, which MarianConfig ignores");
