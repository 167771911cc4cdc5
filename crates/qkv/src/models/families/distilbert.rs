//! DistilBERT (`DistilBertModel`, `DistilBertForMaskedLM`): BERT's encoder, halved by
//! distillation, under its own names: no token types, learned positions in slots
//! 0..T, post-norm layers (`sa_layer_norm`, `output_layer_norm`), LayerNorm eps fixed
//! at 1e-12, and a masked-LM head of `vocab_transform`, the activation,
//! `vocab_layer_norm` and the tied `vocab_projector` with its bias.

use std::path::Path;

use serde::Deserialize;

use super::def::{hf_family, ClassifierLayout, FamilyDef, PoolActivation};
use super::keys::{KeyTable, Rule::*, DROPOUT, INIT};
use super::names::{same, Name};
use super::special::TokenIds;
use crate::error::Result;
use crate::io::{bad_field, check_heads, read_config, Checkpoint};
use crate::models::net::arch::{Arch, Head};
use crate::ops::Activation;

pub(crate) static DISTILBERT: FamilyDef = hf_family(
    "distilbert",
    &[
        "DistilBertForMaskedLM",
        "DistilBertModel",
        "DistilBertForSequenceClassification",
    ],
    read_folder,
    names,
    "distilbert.",
)
.with_keys(KEYS)
.classifying(ClassifierLayout {
    dense: "pre_classifier",
    activation: PoolActivation::Relu,
    norm: None,
    out: "classifier",
});

/// `DistilBertConfig`, with its defaults (distilbert-base) where the file is silent.
#[derive(Deserialize)]
#[serde(default)]
struct DistilConfig {
    vocab_size: usize,
    max_position_embeddings: usize,
    #[serde(alias = "num_hidden_layers")]
    n_layers: usize,
    #[serde(alias = "num_attention_heads")]
    n_heads: usize,
    #[serde(alias = "hidden_size")]
    dim: usize,
    hidden_dim: usize,
    activation: String,
    #[serde(flatten)]
    tokens: TokenIds,
}

impl Default for DistilConfig {
    fn default() -> Self {
        DistilConfig {
            vocab_size: 30522,
            max_position_embeddings: 512,
            n_layers: 6,
            n_heads: 12,
            dim: 768,
            hidden_dim: 3072,
            activation: "gelu".into(),
            tokens: TokenIds::default(),
        }
    }
}

/// A masked-LM folder keeps its head when the checkpoint has it.
fn read_folder(dir: &Path, architecture: &str, ckpt: &Checkpoint) -> Result<(Arch, TokenIds)> {
    let cfg: DistilConfig = read_config(dir)?;
    check_heads(dir, "n_heads", cfg.n_heads, "dim", cfg.dim)?;
    crate::positive!(dir, cfg; vocab_size, hidden_dim, max_position_embeddings)?;
    // `sinusoidal_pos_embds` fills the position table with fixed sinusoids, which the
    // checkpoint stores like a learned table: read as one, it gives the same numbers
    let activation = Activation::from_hf_name(&cfg.activation)
        .map_err(|e| bad_field(dir, "activation", e.to_string()))?;
    let (c, heads) = (cfg.dim, cfg.n_heads);
    let mut arch = Arch::bert(
        cfg.vocab_size,
        c,
        cfg.n_layers,
        heads,
        cfg.hidden_dim,
        cfg.max_position_embeddings,
        activation,
        1e-12,
    );
    arch.embed.padding_idx = cfg.tokens.pad();
    let masked = architecture == "DistilBertForMaskedLM" && ckpt.has("vocab_transform.weight");
    arch.head = match masked {
        true => Head::MaskedLm {
            activation,
            dense_bias: true,
        },
        false => Head::None,
    };
    Ok((arch, cfg.tokens))
}

/// The name table: qkv's modules → DistilBERT's (see [`Name`]). A masked-LM model keeps
/// the encoder under `distilbert.`.
fn names(arch: &Arch) -> Vec<Name> {
    let b = match arch.head {
        Head::MaskedLm { .. } => "distilbert.",
        _ => "",
    };
    let mut t = vec![
        same("embed_tokens", &format!("{b}embeddings.word_embeddings")),
        same(
            "encoder.embed_positions",
            &format!("{b}embeddings.position_embeddings"),
        ),
        same("encoder.embed_norm", &format!("{b}embeddings.LayerNorm")),
        same("head", "vocab_projector"),
        same("head.dense", "vocab_transform"),
        same("head.norm", "vocab_layer_norm"),
    ];
    let layer = [
        ("attn.q", "attention.q_lin"),
        ("attn.k", "attention.k_lin"),
        ("attn.v", "attention.v_lin"),
        ("attn.o", "attention.out_lin"),
        // post-norm: the norm after each residual
        ("attn_norm", "sa_layer_norm"),
        ("ffn.up", "ffn.lin1"),
        ("ffn.down", "ffn.lin2"),
        ("ffn_norm", "output_layer_norm"),
    ];
    for (qkv, hf) in layer {
        t.push(same(
            &format!("encoder.layers.{{l}}.{qkv}"),
            &format!("{b}transformer.layer.{{l}}.{hf}"),
        ));
    }
    t
}

/// `DistilBertConfig`'s keys, see `keys.rs`.
const KEYS: KeyTable = &[&[
    ("max_position_embeddings", Read),
    (
        "sinusoidal_pos_embds",
        Irrelevant(
            "fills the position table with sinusoids, which the checkpoint stores: read as learned",
        ),
    ),
    ("n_layers", Read),
    ("num_hidden_layers", Read),
    ("n_heads", Read),
    ("num_attention_heads", Read),
    ("dim", Read),
    ("hidden_size", Read),
    ("hidden_dim", Read),
    ("activation", Read),
    ("tie_word_embeddings", Only("true")),
    ("dropout", DROPOUT),
    ("attention_dropout", DROPOUT),
    ("qa_dropout", DROPOUT),
    ("seq_classif_dropout", DROPOUT),
    ("initializer_range", INIT),
]];
