//! Reading a model folder's `config.json` into a family's serde struct, with errors
//! that name the file and the field.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Parses `dir/config.json` as `T`.
pub fn read_config<T: DeserializeOwned>(dir: &Path) -> Result<T> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Config {
        path: path.display().to_string(),
        field: serde_field(&e.to_string()),
        reason: e.to_string(),
    })
}

/// serde_json names the field in "missing field `x`" / "unknown variant" messages;
/// lift it out so the error's field slot is filled where possible.
fn serde_field(msg: &str) -> String {
    msg.split('`').nth(1).unwrap_or("(json)").to_string()
}

/// An error for a field whose value parsed but cannot be used.
pub fn bad_field(dir: &Path, field: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        path: dir.join("config.json").display().to_string(),
        field: field.into(),
        reason: reason.into(),
    }
}
