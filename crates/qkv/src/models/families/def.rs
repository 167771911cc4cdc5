//! What a family file gives the rest of the crate: one [`FamilyDef`], a table row of
//! everything that is the family's own. Adding a family is a new file with its
//! definition and one row in `registry.rs`.

use std::path::Path;

use serde_json::Value;

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
