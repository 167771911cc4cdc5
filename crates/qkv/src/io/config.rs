//! Reading a model folder's JSON files (`config.json`, `generation_config.json`,
//! sentence-transformers' configs) into serde structs, with errors that name the file
//! and the field.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The whole of the text file `path`; an error names the file.
pub fn read_text(path: &Path) -> Result<String> {
    super::files::read_regular_text(path)
}

/// Parses the JSON file `path` as `T`. A top-level field set to null counts as absent
/// (transformers 5 writes `null` for unset optional fields), so it takes `T`'s default.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_text(path)?;
    let mut value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| field_error(path, "(json)", e.to_string()))?;
    if let Some(fields) = value.as_object_mut() {
        fields.retain(|_, v| !v.is_null());
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = match e.path().to_string() {
            p if p == "." => top_level_field(&text, &e.inner().to_string()),
            p => p,
        };
        field_error(path, &field, e.inner().to_string())
    })
}

/// Like [`read_json`], with `T::default()` for a file that does not exist.
pub fn read_json_or_default<T: DeserializeOwned + Default>(path: &Path) -> Result<T> {
    if path.is_file() {
        read_json(path)
    } else {
        Ok(T::default())
    }
}

/// Parses `dir/config.json` as `T`.
pub fn read_config<T: DeserializeOwned>(dir: &Path) -> Result<T> {
    read_json(&dir.join("config.json"))
}

/// The field a top-level error is about. serde_json names it only in some messages
/// ("missing field `x`"); others name the bad value ("integer `-32`"), and structs
/// with flattened parts lose the path, so the value is looked up among the file's
/// top-level fields.
fn top_level_field(text: &str, msg: &str) -> String {
    let quoted = msg.split('`').nth(1).unwrap_or("(json)");
    let by_value = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| {
            v.as_object()?
                .iter()
                .find(|(_, value)| serde_json::to_string(value).is_ok_and(|s| s == quoted))
                .map(|(k, _)| k.clone())
        });
    match (msg.starts_with("invalid"), by_value) {
        (true, Some(field)) => field,
        _ => quoted.to_string(),
    }
}

/// An error for a field of the JSON file `path` whose value parsed but cannot be used.
pub fn field_error(path: &Path, field: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        path: path.display().to_string(),
        field: field.into(),
        reason: reason.into(),
    }
}

/// [`field_error`] for a field of `dir/config.json`.
pub fn bad_field(dir: &Path, field: &str, reason: impl Into<String>) -> Error {
    field_error(&dir.join("config.json"), field, reason)
}

/// Errors naming the first of `fields` (name, value) of `dir/config.json` that is zero.
pub fn check_positive(dir: &Path, fields: &[(&str, usize)]) -> Result<()> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((field, _)) => Err(bad_field(dir, field, "must be at least 1")),
        None => Ok(()),
    }
}

/// `N`: the serde default of a size field, `#[serde(default = "crate::io::size::<512>")]`.
pub fn size<const N: usize>() -> usize {
    N
}

/// 10^−D: the serde default of a norm epsilon, `#[serde(default = "crate::io::eps::<6>")]`
/// for 1e-6 (10^D is exact, so its reciprocal is the literal's value).
pub fn eps<const D: i32>() -> f64 {
    1.0 / 10f64.powi(D)
}

/// `true`: the serde default of boolean config fields that default to on.
pub fn yes() -> bool {
    true
}

/// [`check_positive`] over fields of a config struct, each named as in the file:
/// `positive!(dir, cfg; vocab_size, d_ff)`.
#[macro_export]
macro_rules! positive {
    ($dir:expr, $cfg:ident; $($field:ident),+ $(,)?) => {
        $crate::io::check_positive($dir, &[$((stringify!($field), $cfg.$field)),+])
    };
}

/// Errors on `field` of `dir/config.json` unless `heads` (≥ 1) divides `width`, the
/// value of `width_field` (the heads split the width evenly).
pub fn check_heads(
    dir: &Path,
    field: &str,
    heads: usize,
    width_field: &str,
    width: usize,
) -> Result<()> {
    if heads == 0 || !width.is_multiple_of(heads) {
        return Err(bad_field(
            dir,
            field,
            format!("{heads} heads must divide {width_field} = {width}"),
        ));
    }
    Ok(())
}

/// A size that `dir/config.json` may give under its own `name` or under `alias`
/// (`n_embd` or `hidden_size`): the first present, which must be at least `min`.
pub fn aliased_size(
    dir: &Path,
    (name, value): (&str, Option<usize>),
    (alias, alias_value): (&str, Option<usize>),
    min: usize,
) -> Result<usize> {
    match value.or(alias_value) {
        Some(n) if n < min => Err(bad_field(dir, name, format!("must be at least {min}"))),
        Some(n) => Ok(n),
        None => Err(bad_field(
            dir,
            name,
            format!("missing (nor is `{alias}` set)"),
        )),
    }
}

/// A norm's epsilon from `field` of `dir/config.json`: finite and ≥ 0.
pub fn epsilon(dir: &Path, field: &str, value: f64) -> Result<f32> {
    let eps = value as f32;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(bad_field(
            dir,
            field,
            format!("must be finite and ≥ 0, got {value}"),
        ));
    }
    Ok(eps)
}

/// A float as JSON without f32 → f64 noise (1e-5, not 9.999999747378752e-6).
pub fn json_f32(x: f32) -> serde_json::Value {
    let shortest: f64 = x.to_string().parse().expect("f32 Display parses as f64");
    serde_json::json!(shortest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_names_the_path_and_reports_the_os_error_once() {
        let path = std::env::temp_dir().join(format!("qkv-no-such-{}.json", std::process::id()));
        let err = read_text(&path).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        // The io::Error is in the message, not also the source(): a chain printer
        // such as anyhow's `{:#}` would otherwise print the OS message twice.
        assert!(std::error::Error::source(&err).is_none());
        let msg = err.to_string();
        assert!(msg.starts_with(&path.display().to_string()), "{msg}");
        assert!(msg.len() > path.display().to_string().len() + 2, "{msg}");
    }

    #[test]
    fn json_errors_name_file_and_field() {
        #[derive(serde::Deserialize, Debug, Default)]
        #[allow(dead_code)]
        struct Needs {
            size: usize,
        }
        let dir = crate::io::scratch_dir("json");
        let path = dir.join("x.json");
        std::fs::write(&path, "{}").unwrap();
        let msg = read_json::<Needs>(&path).unwrap_err().to_string();
        assert!(
            msg.contains("x.json") && msg.contains("field `size`"),
            "{msg}"
        );
        assert!(read_json_or_default::<Needs>(&dir.join("absent.json")).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
