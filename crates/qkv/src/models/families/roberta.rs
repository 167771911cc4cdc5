//! RoBERTa and XLM-RoBERTa (`RobertaModel`, `RobertaForMaskedLM`, `XLMRobertaModel`,
//! `XLMRobertaForMaskedLM`; multilingual-e5 and bge-m3 are XLM-R): BERT's encoder with
//! two differences in what it reads.
//!
//! - Positions count real tokens from `padding_idx + 1`, and padding sits at
//!   `padding_idx` (transformers' `create_position_ids_from_input_ids`), so a padded
//!   row is computed as if alone and the position table has `padding_idx + 1` rows
//!   more than the longest input.
//! - The masked-LM head is `lm_head` (dense, GELU, `layer_norm`, the tied word
//!   embeddings and a bias), the encoder under `roberta.`.
//!
//! The config is BERT's (`RobertaConfig` subclasses its fields); one token type.

use std::path::Path;

use super::def::{hf_family, ClassifierLayout, FamilyDef, PoolActivation};
use super::names::Name;
use super::special::TokenIds;
use crate::error::Result;
use crate::io::{bad_field, Checkpoint};
use crate::models::net::arch::{Arch, Head};

pub(crate) static ROBERTA: FamilyDef = hf_family(
    "roberta",
    &[
        "RobertaForMaskedLM",
        "RobertaModel",
        "RobertaForSequenceClassification",
    ],
    |dir, architecture, ckpt| read(dir, architecture, ckpt, "RobertaForMaskedLM"),
    names,
    "roberta.",
)
.with_keys(super::bert::KEYS)
.classifying(ROBERTA_HEAD);

pub(crate) static XLM_ROBERTA: FamilyDef = hf_family(
    "xlm-roberta",
    &[
        "XLMRobertaForMaskedLM",
        "XLMRobertaModel",
        "XLMRobertaForSequenceClassification",
    ],
    |dir, architecture, ckpt| read(dir, architecture, ckpt, "XLMRobertaForMaskedLM"),
    names,
    "roberta.",
)
.with_keys(super::bert::KEYS)
.classifying(ROBERTA_HEAD);

/// `RobertaClassificationHead`: the head's own dense layer and tanh on `<s>`.
const ROBERTA_HEAD: ClassifierLayout = ClassifierLayout {
    dense: "classifier.dense",
    activation: PoolActivation::Tanh,
    norm: None,
    out: "classifier.out_proj",
};

/// BERT's reading, with RoBERTa's positions; a masked-LM folder keeps its head when
/// the checkpoint has it.
fn read(
    dir: &Path,
    architecture: &str,
    ckpt: &Checkpoint,
    masked: &str,
) -> Result<(Arch, TokenIds)> {
    let head = architecture == masked && ckpt.has("lm_head.dense.weight");
    let (mut arch, tokens) = super::bert::read(dir, head)?;
    let pad = tokens.pad().ok_or_else(|| {
        bad_field(
            dir,
            "pad_token_id",
            "RoBERTa's positions start after the padding id: it must be given",
        )
    })?;
    arch.embed.slot_positions = false;
    arch.embed.position_offset = pad + 1;
    Ok((arch, tokens))
}

/// The name table: qkv's modules → RoBERTa's (see [`Name`]). A masked-LM model keeps
/// the encoder under `roberta.`.
fn names(arch: &Arch) -> Vec<Name> {
    let b = if matches!(arch.head, Head::MaskedLm { .. }) {
        "roberta."
    } else {
        ""
    };
    let head = [
        ("head", "lm_head"),
        ("head.dense", "lm_head.dense"),
        ("head.norm", "lm_head.layer_norm"),
    ];
    super::bert::encoder_names(b, head)
}
