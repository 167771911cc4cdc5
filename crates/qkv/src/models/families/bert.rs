//! BERT (`BertModel`, `BertForMaskedLM`, and the encoder inside
//! `BertForSequenceClassification` checkpoints): the Transformer's encoder stack as
//! Devlin et al. trained it.
//!
//! - Embeddings: word + learned absolute position (slots 0..T, padding or not, as HF's
//!   `position_ids = arange(T)`) + token type (segment A/B), summed, then LayerNorm.
//! - Post-norm layers: x = LN(x + Attn(x)); x = LN(x + FFN(x)); bidirectional attention
//!   with padding removed as keys only.
//! - `BertForMaskedLM` adds the masked-LM head (`cls.predictions`): dense, activation,
//!   LayerNorm, then the word embeddings (tied) plus a bias. Without that head (the
//!   other architectures), the output is `last_hidden_state`; pooler and task heads are
//!   not read.

use std::path::Path;

use serde::Deserialize;

use super::def::{hf_family, ClassifierLayout, FamilyDef, PoolActivation};
use super::keys::{KeyTable, Rule::*, CACHE, DROPOUT, INIT};
use super::names::{same, Name};
use super::special::TokenIds;
use crate::error::{Error, Result};
use crate::io::Checkpoint;
use crate::io::{bad_field, check_heads, read_config};
use crate::models::net::arch::{Arch, Head, Position};
use crate::ops::Activation;

pub(crate) static BERT: FamilyDef = hf_family(
    "bert",
    &[
        "BertForMaskedLM",
        "BertModel",
        "BertForSequenceClassification",
    ],
    read_folder,
    names,
    "bert.",
)
.with_keys(KEYS)
.with_aliases(tensorflow_names)
.classifying(ClassifierLayout {
    dense: "bert.pooler.dense",
    activation: PoolActivation::Tanh,
    norm: None,
    out: "classifier",
});

/// A masked-LM folder keeps its head when the checkpoint has it.
fn read_folder(dir: &Path, architecture: &str, ckpt: &Checkpoint) -> Result<(Arch, TokenIds)> {
    let head =
        architecture == "BertForMaskedLM" && ckpt.has("cls.predictions.transform.dense.weight");
    read(dir, head)
}

/// TensorFlow conversions of BERT name LayerNorm parameters gamma and beta.
fn tensorflow_names(name: &str) -> Vec<String> {
    match name.contains("LayerNorm.") {
        true => vec![name.replace(".weight", ".gamma").replace(".bias", ".beta")],
        false => Vec::new(),
    }
}

/// `config.json` as `BertConfig` writes it. A missing field takes `BertConfig`'s
/// default (BERT-base), as transformers itself does when loading the file.
#[derive(Deserialize)]
#[serde(default)]
struct BertConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    hidden_act: String,
    max_position_embeddings: usize,
    type_vocab_size: usize,
    layer_norm_eps: f64,
    /// Dropped from `BertConfig` in transformers 5 (absolute is then the only kind).
    position_embedding_type: Option<String>,
    is_decoder: bool,
    #[serde(flatten)]
    tokens: TokenIds,
}

impl Default for BertConfig {
    fn default() -> Self {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: "gelu".into(),
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            position_embedding_type: None,
            is_decoder: false,
            tokens: TokenIds::default(),
        }
    }
}

/// `dir/config.json` as an [`Arch`]; `masked_lm` adds the masked-LM head.
pub(super) fn read(dir: &Path, masked_lm: bool) -> Result<(Arch, TokenIds)> {
    let cfg: BertConfig = read_config(dir)?;
    let (c, heads) = (cfg.hidden_size, cfg.num_attention_heads);
    check_heads(dir, "num_attention_heads", heads, "hidden_size", c)?;
    crate::positive!(dir, cfg; vocab_size, intermediate_size, max_position_embeddings, type_vocab_size)?;
    match cfg.position_embedding_type.as_deref() {
        None | Some("absolute") => {}
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "{}: field `position_embedding_type` is `{other}`; only `absolute` BERT positions are implemented",
                dir.join("config.json").display()
            )))
        }
    }
    if cfg.is_decoder {
        return Err(Error::Unsupported(format!(
            "{}: field `is_decoder` is true; BERT is loaded as a bidirectional encoder only",
            dir.join("config.json").display()
        )));
    }
    let activation = Activation::from_hf_name(&cfg.hidden_act)
        .map_err(|e| bad_field(dir, "hidden_act", e.to_string()))?;
    let mut arch = Arch::bert(
        cfg.vocab_size,
        c,
        cfg.num_hidden_layers,
        heads,
        cfg.intermediate_size,
        cfg.max_position_embeddings,
        activation,
        cfg.layer_norm_eps as f32,
    );
    arch.embed.token_types = cfg.type_vocab_size;
    arch.embed.padding_idx = cfg.tokens.pad();
    arch.head = if masked_lm {
        Head::MaskedLm {
            activation,
            dense_bias: true,
        }
    } else {
        Head::None
    };
    debug_assert!(matches!(arch.position, Position::Learned { .. }));
    Ok((arch, cfg.tokens))
}

/// The name table: qkv's modules → BERT's (see [`Name`]). A masked-LM model keeps the
/// encoder under `bert.`.
pub(super) fn names(arch: &Arch) -> Vec<Name> {
    let b = if matches!(arch.head, Head::MaskedLm { .. }) {
        "bert."
    } else {
        ""
    };
    let head = [
        ("head", "cls.predictions"),
        ("head.dense", "cls.predictions.transform.dense"),
        ("head.norm", "cls.predictions.transform.LayerNorm"),
    ];
    encoder_names(b, head)
}

/// BERT's layout of an encoder under the prefix `b`, with a masked-LM head's modules
/// (`head`: its bias, `head.dense`, `head.norm`) where `head` says (RoBERTa's is
/// BERT's with its own head).
pub(super) fn encoder_names(b: &str, head: [(&str, &str); 3]) -> Vec<Name> {
    let mut t = vec![
        same("embed_tokens", &format!("{b}embeddings.word_embeddings")),
        same(
            "encoder.embed_positions",
            &format!("{b}embeddings.position_embeddings"),
        ),
        same(
            "encoder.embed_types",
            &format!("{b}embeddings.token_type_embeddings"),
        ),
        same("encoder.embed_norm", &format!("{b}embeddings.LayerNorm")),
    ];
    t.extend(head.map(|(qkv, hf)| same(qkv, hf)));
    t.extend(layer_names(b));
    t
}

/// The encoder layers' rows of the name table, under the prefix `b`.
fn layer_names(b: &str) -> Vec<Name> {
    let layer = [
        ("attn.q", "attention.self.query"),
        ("attn.k", "attention.self.key"),
        ("attn.v", "attention.self.value"),
        ("attn.o", "attention.output.dense"),
        // post-norm: the norm after the attention's residual
        ("attn_norm", "attention.output.LayerNorm"),
        ("ffn.up", "intermediate.dense"),
        ("ffn.down", "output.dense"),
        ("ffn_norm", "output.LayerNorm"),
    ];
    layer
        .iter()
        .map(|(qkv, hf)| {
            same(
                &format!("encoder.layers.{{l}}.{qkv}"),
                &format!("{b}encoder.layer.{{l}}.{hf}"),
            )
        })
        .collect()
}

/// `BertConfig`'s keys (RoBERTa's and XLM-R's are the same), see `keys.rs`.
pub(super) const KEYS: KeyTable = &[&[
    ("hidden_size", Read),
    ("num_hidden_layers", Read),
    ("num_attention_heads", Read),
    ("intermediate_size", Read),
    ("hidden_act", Read),
    ("max_position_embeddings", Read),
    ("type_vocab_size", Read),
    ("layer_norm_eps", Read),
    ("position_embedding_type", Read),
    ("is_decoder", Only("false")),
    ("tie_word_embeddings", Only("true")),
    ("hidden_dropout_prob", DROPOUT),
    ("attention_probs_dropout_prob", DROPOUT),
    ("classifier_dropout", DROPOUT),
    ("initializer_range", INIT),
    ("use_cache", CACHE),
    (
        "gradient_checkpointing",
        Irrelevant("recomputes activations in training; the same numbers"),
    ),
]];
