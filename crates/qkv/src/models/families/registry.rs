//! Every family qkv reads, in one table, and the lookups over it: by the name a folder
//! gives, for a freshly built model, and by name. Nothing else in the crate matches
//! over families.

use serde_json::Value;

use super::def::FamilyDef;
use super::names::{self, Loc};
use super::{
    bert, bloom, distilbert, gemma, gpt2, gpt_neox, llama, marian, modernbert, native, phi3,
    roberta, t5,
};
use crate::error::Result;
use crate::models::net::arch::Arch;

/// The families, in the order `SUPPORTED` lists their architectures.
static FAMILIES: [&FamilyDef; 19] = [
    &bert::BERT,
    &roberta::ROBERTA,
    &roberta::XLM_ROBERTA,
    &distilbert::DISTILBERT,
    &modernbert::MODERNBERT,
    &gpt2::GPT2,
    &llama::LLAMA,
    &llama::MISTRAL,
    &llama::QWEN2,
    &llama::QWEN3,
    &gemma::GEMMA,
    &gemma::GEMMA2,
    &gemma::GEMMA3,
    &phi3::PHI3,
    &bloom::BLOOM,
    &gpt_neox::GPT_NEOX,
    &marian::MARIAN,
    &t5::T5,
    &native::QKV,
];

/// A checkpoint family: how a model is named and laid out on disk.
#[derive(Clone, Copy)]
pub struct Family(&'static FamilyDef);

impl PartialEq for Family {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Family {}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Family({})", self.0.name)
    }
}

/// The architectures [`crate::models::load`] accepts, for error messages and `--help`.
pub fn supported() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.architectures)
        .copied()
        .collect()
}

impl Family {
    /// The family that reads the folder naming itself `name` (its `architectures[0]`,
    /// or its `model_type`).
    pub fn reading(name: &str) -> Option<Family> {
        let reads = |f: &&&FamilyDef| f.architectures.contains(&name) || f.name == name;
        FAMILIES.iter().find(reads).map(|&f| Family(f))
    }

    /// The family whose GGUF files are named `gguf` (`general.architecture`).
    pub fn in_gguf(gguf: &str) -> Option<Family> {
        let named = |f: &&&FamilyDef| f.gguf == Some(gguf);
        FAMILIES.iter().find(named).map(|&f| Family(f))
    }

    /// The family a freshly built `arch` saves as: the first that it fits exactly
    /// (GPT-2, Llama), else qkv's own.
    pub fn of_fresh(arch: &Arch) -> Family {
        let fits = |f: &&&FamilyDef| f.fresh.as_ref().is_some_and(|fresh| (fresh.fits)(arch));
        Family(FAMILIES.iter().find(fits).copied().unwrap_or(&native::QKV))
    }

    /// `bert`, `roberta`, `xlm-roberta`, `distilbert`, `modernbert`, `gpt2`, `llama`, `mistral`, `qwen2`, `qwen3`, `gemma`, `gemma2`, `gemma3_text`, `phi3`, `bloom`, `gpt_neox`, `marian`, `t5`, `qkv`.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    pub(crate) fn def(self) -> &'static FamilyDef {
        self.0
    }

    /// What this family's reader does with the `config.json` key `key` (`None`: a key
    /// no table knows, which loading names in a warning).
    pub fn key_rule(self, key: &str) -> Option<super::keys::Rule> {
        super::keys::rule(self.0.keys, key)
    }

    /// The architecture a folder of this family is saved as.
    pub fn architecture(self) -> &'static str {
        self.0.architectures[0]
    }

    /// Where each parameter path lives in this family's checkpoints.
    pub(crate) fn locator(self, arch: &Arch) -> impl Fn(&str) -> Result<Loc> {
        let table = (self.0.names)(arch);
        move |path: &str| match self.0.native {
            true => Ok(Loc::Same(path.to_string())),
            false => names::locate(&table, self.0.name, path),
        }
    }

    /// Other names a checkpoint may store the tensor `name` under: without the task
    /// model's prefix (checkpoints saved from the base model) or with it, and the
    /// family's old spellings of those.
    pub(crate) fn aliases(self, name: &str) -> Vec<String> {
        let prefix = self.0.prefix;
        let other = match name.strip_prefix(prefix) {
            _ if prefix.is_empty() => None,
            Some(bare) => Some(bare.to_string()),
            None => Some(format!("{prefix}{name}")),
        };
        let mut out: Vec<String> = other.into_iter().collect();
        let spelled: Vec<String> = std::iter::once(name)
            .chain(out.iter().map(String::as_str))
            .flat_map(self.0.aliases)
            .collect();
        out.extend(spelled);
        out
    }

    /// `config.json` for a model of this family built from scratch.
    pub(crate) fn config_json(self, arch: &Arch) -> Value {
        match &self.0.fresh {
            Some(fresh) => (fresh.config_json)(arch),
            None => native::config_json(arch),
        }
    }
}
