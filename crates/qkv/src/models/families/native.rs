//! qkv's own folder, for an architecture no Hugging Face class has (ALiBi with
//! post-norm, …): `config.json` holds the [`Arch`] itself under `qkv`, and every tensor
//! is stored under its qkv path.

use std::path::Path;

use serde_json::{json, Value};

use super::def::{as_given, no_aliases, FamilyDef};
use super::names::Name;
use super::special::TokenIds;
use crate::error::Result;
use crate::io::{read_config, Checkpoint};
use crate::models::net::arch::Arch;

/// `architectures[0]` of a qkv folder.
pub const NATIVE_ARCHITECTURE: &str = "QkvTransformer";

pub(crate) static QKV: FamilyDef = FamilyDef {
    name: "qkv",
    architectures: &[NATIVE_ARCHITECTURE],
    read,
    names: no_names,
    prefix: "",
    aliases: no_aliases,
    special: as_given,
    fresh: None,
    native: true,
    classifier: None,
    keys: &[],
    gguf: None,
};

#[derive(serde::Deserialize)]
struct Native {
    qkv: Arch,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn read(dir: &Path, _architecture: &str, _ckpt: &Checkpoint) -> Result<(Arch, TokenIds)> {
    let n: Native = read_config(dir)?;
    Ok((n.qkv, n.tokens))
}

/// Tensors are stored under their qkv paths: no table.
fn no_names(_arch: &Arch) -> Vec<Name> {
    Vec::new()
}

/// The `config.json` of a qkv folder.
pub fn config_json(arch: &Arch) -> Value {
    json!({
        "architectures": [NATIVE_ARCHITECTURE],
        "model_type": "qkv",
        "qkv": arch,
    })
}
