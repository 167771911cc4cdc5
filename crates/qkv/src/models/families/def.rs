//! What a family file gives the rest of the crate: one [`FamilyDef`], a table row of
//! everything that is the family's own. Adding a family is a new file with its
//! definition and one row in `registry.rs`.

use std::path::Path;

use serde_json::Value;

use super::keys::KeyTable;
use super::names::Name;
use super::special::{SpecialTokens, TokenIds};
use crate::error::Result;
use crate::io::Checkpoint;
use crate::models::net::arch::Arch;

/// One checkpoint family: how its `config.json` becomes an [`Arch`], where its tensors
/// live, and its quirks.
pub(crate) struct FamilyDef {
    /// `bert`, `gpt2`, …: the family's `model_type` in `config.json` (read when
    /// `architectures` is absent), and what `qkv inspect` prints.
    pub name: &'static str,
    /// The `architectures[0]` values read as this family (the first is what a folder of
    /// it is saved as).
    pub architectures: &'static [&'static str],
    /// `config.json` → the architecture and the special ids it names; `architecture`
    /// is the name the folder gave and `ckpt` its weights, for the families whose
    /// reading depends on them (BERT's head, T5's tied head).
    pub read: ReadConfig,
    /// The name table: each qkv parameter path's checkpoint name and how it is stored.
    pub names: fn(&Arch) -> Vec<Name>,
    /// The prefix of the task model's tensors (`transformer.`, `model.`, `bert.`): a
    /// checkpoint of the base model stores them without it.
    pub prefix: &'static str,
    /// Other names this family's checkpoints store the tensor `name` under (old
    /// spellings), besides the prefix's.
    pub aliases: fn(name: &str) -> Vec<String>,
    /// The special tokens as this family's models use them.
    pub special: fn(SpecialTokens) -> SpecialTokens,
    /// For families a freshly built model can be saved as: whether `arch` is exactly
    /// one of this family, and its `config.json`.
    pub fresh: Option<Fresh>,
    /// qkv's own folder: the [`Arch`] itself in `config.json` and every tensor under
    /// its qkv path; no Hugging Face config to keep.
    pub native: bool,
    /// Where the family's `…ForSequenceClassification` checkpoints keep their head.
    pub classifier: Option<ClassifierLayout>,
    /// What the reader does with each `config.json` key (`keys.rs`); qkv's own folder
    /// has none to check.
    pub keys: KeyTable,
    /// The GGUF architecture (`general.architecture`, as llama.cpp's converter names
    /// it) whose files this family's tensors read and write, where qkv reads them.
    pub gguf: Option<&'static str>,
}

/// A sequence-classification head as BERT-family checkpoints store it: the first
/// token's last hidden state `[C]` (or the mean over the real tokens, where the
/// config's `classifier_pooling` says `mean`) → `dense` (C→C) → `activation` → `norm`
/// where there is one → `out` (C→labels). BERT's `dense` is its pooler; RoBERTa's,
/// DistilBERT's and ModernBERT's are the head's own.
#[derive(Clone, Copy, Debug)]
pub struct ClassifierLayout {
    /// The dense layer's checkpoint name (`bert.pooler.dense`), without `.weight`.
    pub dense: &'static str,
    pub activation: PoolActivation,
    /// A LayerNorm after the activation (ModernBERT's `head.norm`, with the encoder's
    /// `norm_eps`), without `.weight`.
    pub norm: Option<&'static str>,
    /// The output layer's checkpoint name (`classifier`).
    pub out: &'static str,
}

/// A family's `config.json` reader: the folder, the architecture name it gave, and its
/// weights → the architecture and the special ids the config names.
pub(crate) type ReadConfig =
    fn(dir: &Path, architecture: &str, ckpt: &Checkpoint) -> Result<(Arch, TokenIds)>;

/// How a family writes a model built from scratch.
pub(crate) struct Fresh {
    pub fits: fn(&Arch) -> bool,
    pub config_json: fn(&Arch) -> Value,
}

/// A Hugging Face family with no quirks beyond its reader and names: no old spellings,
/// the special tokens as given, never what a fresh model is saved as.
pub(crate) const fn hf_family(
    name: &'static str,
    architectures: &'static [&'static str],
    read: ReadConfig,
    names: fn(&Arch) -> Vec<Name>,
    prefix: &'static str,
) -> FamilyDef {
    FamilyDef {
        name,
        architectures,
        read,
        names,
        prefix,
        aliases: no_aliases,
        special: as_given,
        fresh: None,
        native: false,
        classifier: None,
        keys: &[],
        gguf: None,
    }
}

/// The activation after a classification head's dense layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolActivation {
    /// BERT's pooler, RoBERTa's head.
    Tanh,
    /// DistilBERT's `pre_classifier`.
    Relu,
    /// The one `config.json`'s `classifier_activation` names (ModernBERT's head).
    Configured,
}

impl FamilyDef {
    /// This family with `keys` as its table of `config.json` keys.
    pub(crate) const fn with_keys(self, keys: KeyTable) -> FamilyDef {
        FamilyDef { keys, ..self }
    }

    /// This family with other spellings of its tensors' names.
    pub(crate) const fn with_aliases(self, aliases: fn(&str) -> Vec<String>) -> FamilyDef {
        FamilyDef { aliases, ..self }
    }

    /// This family with its own reading of the special tokens.
    pub(crate) const fn with_special(
        self,
        special: fn(SpecialTokens) -> SpecialTokens,
    ) -> FamilyDef {
        FamilyDef { special, ..self }
    }

    /// This family as what a freshly built model that `fresh` fits is saved as.
    pub(crate) const fn saving_fresh(self, fresh: Fresh) -> FamilyDef {
        FamilyDef {
            fresh: Some(fresh),
            ..self
        }
    }

    /// This family with its GGUF files named `gguf` (`general.architecture`).
    pub(crate) const fn in_gguf(self, gguf: &'static str) -> FamilyDef {
        FamilyDef {
            gguf: Some(gguf),
            ..self
        }
    }

    /// This family with its sequence-classification head stored as `layout` says.
    pub(crate) const fn classifying(self, layout: ClassifierLayout) -> FamilyDef {
        FamilyDef {
            classifier: Some(layout),
            ..self
        }
    }
}

/// A family without other spellings of its tensors' names.
pub(crate) fn no_aliases(_name: &str) -> Vec<String> {
    Vec::new()
}

/// A family that uses the special tokens as its files give them.
pub(crate) fn as_given(special: SpecialTokens) -> SpecialTokens {
    special
}
