//! The files of a sentence-transformers folder: `modules.json` (which pipeline),
//! `sentence_bert_config.json`, the Pooling module's `config.json` in either layout, and
//! what the tokenizer's config says about padding and lengths.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::pooling::PoolingMode;
use crate::error::{Error, Result};
use crate::io::{field_error, read_json};

/// An entry of `modules.json`.
#[derive(Deserialize)]
pub(super) struct ModuleEntry {
    #[serde(default)]
    pub(super) path: String,
    #[serde(rename = "type")]
    pub(super) kind: String,
}

/// `sentence_bert_config.json`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TransformerConfig {
    pub(super) max_seq_length: Option<usize>,
    pub(super) do_lower_case: bool,
}

/// `pooling_mode` in current sentence-transformers configs: one name or a list.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum ModeNames {
    One(String),
    Many(Vec<String>),
}

/// The Pooling module's `config.json`, in the current layout (`embedding_dimension`,
/// `pooling_mode`) or the legacy one (`word_embedding_dimension`, `pooling_mode_*`
/// flags); `pooling_mode`, when present, wins over the flags, as in sentence-transformers.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PoolingConfig {
    #[serde(alias = "word_embedding_dimension")]
    pub(super) embedding_dimension: Option<usize>,
    pub(super) pooling_mode: Option<ModeNames>,
    pub(super) pooling_mode_cls_token: bool,
    pub(super) pooling_mode_max_tokens: bool,
    pub(super) pooling_mode_mean_tokens: bool,
    pub(super) pooling_mode_mean_sqrt_len_tokens: bool,
    pub(super) pooling_mode_weightedmean_tokens: bool,
    pub(super) pooling_mode_lasttoken: bool,
}

/// The pad token as `tokenizer_config.json` names it: a string or an AddedToken object.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum TokenName {
    Plain(String),
    Added { content: String },
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TokenizerConfig {
    pub(super) pad_token: Option<TokenName>,
    pub(super) model_max_length: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PadOnly {
    pub(super) pad_token_id: Option<usize>,
}

/// The Transformer folder, the Pooling folder and whether a Normalize module follows,
/// from `modules.json`, which must list Transformer, then Pooling, then optionally
/// Normalize: the pipelines qkv can run.
pub(super) fn read_modules(
    dir: &Path,
    modules_path: &Path,
) -> Result<(PathBuf, Option<PathBuf>, bool)> {
    let modules: Vec<ModuleEntry> = read_json(modules_path)?;
    let kinds: Vec<&str> = modules
        .iter()
        .map(|m| m.kind.rsplit('.').next().unwrap_or(&m.kind))
        .collect();
    let (normalize, expected) = match kinds.as_slice() {
        ["Transformer", "Pooling"] => (false, true),
        ["Transformer", "Pooling", "Normalize"] => (true, true),
        _ => (false, false),
    };
    if !expected {
        let listed: Vec<&str> = modules.iter().map(|m| m.kind.as_str()).collect();
        return Err(Error::Unsupported(format!(
            "{}: modules [{}]; qkv runs Transformer → Pooling (→ Normalize) only",
            modules_path.display(),
            listed.join(", ")
        )));
    }
    Ok((
        crate::io::inside(dir, &modules[0].path, modules_path)?,
        Some(crate::io::inside(dir, &modules[1].path, modules_path)?),
        normalize,
    ))
}

/// The Pooling module's modes from its `config.json`; `hidden` is the encoder's width,
/// which the config's embedding dimension must equal.
pub(super) fn read_pooling(path: &Path, hidden: usize) -> Result<Vec<PoolingMode>> {
    let cfg: PoolingConfig = read_json(path)?;
    if let Some(d) = cfg.embedding_dimension {
        if d != hidden {
            return Err(field_error(
                path,
                "word_embedding_dimension",
                format!("{d} but the encoder's hidden size is {hidden}"),
            ));
        }
    }
    let modes = match cfg.pooling_mode {
        Some(names) => {
            let names = match names {
                ModeNames::One(n) => vec![n],
                ModeNames::Many(ns) => ns,
            };
            if names.is_empty() {
                // sentence-transformers accepts it, then fails concatenating no vectors
                return Err(field_error(
                    path,
                    "pooling_mode",
                    "an empty list: name at least one mode".to_string(),
                ));
            }
            names
                .iter()
                .map(|n| {
                    PoolingMode::from_name(n).ok_or_else(|| {
                        field_error(
                            path,
                            "pooling_mode",
                            format!("unknown mode `{n}` (known: cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken)"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?
        }
        None => {
            let flags = [
                cfg.pooling_mode_cls_token,
                cfg.pooling_mode_max_tokens,
                cfg.pooling_mode_mean_tokens,
                cfg.pooling_mode_mean_sqrt_len_tokens,
                cfg.pooling_mode_weightedmean_tokens,
                cfg.pooling_mode_lasttoken,
            ];
            let on: Vec<PoolingMode> = PoolingMode::FLAG_ORDER
                .iter()
                .zip(flags)
                .filter(|(_, on)| *on)
                .map(|(&m, _)| m)
                .collect();
            // with no flag set, sentence-transformers (5.7, `_convert_legacy_pooling_kwargs`)
            // pools by mean, so the same folder gives the same vectors here
            match on.is_empty() {
                true => vec![PoolingMode::Mean],
                false => on,
            }
        }
    };
    Ok(modes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn pooling_config_layouts() {
        let dir = crate::io::scratch_dir("pooling");
        let legacy = write(
            &dir,
            "legacy.json",
            r#"{"word_embedding_dimension": 4, "pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#,
        );
        assert_eq!(
            read_pooling(&legacy, 4).unwrap(),
            [PoolingMode::Cls, PoolingMode::Mean]
        );
        let current = write(
            &dir,
            "current.json",
            r#"{"embedding_dimension": 4, "pooling_mode": ["mean", "cls"], "include_prompt": true}"#,
        );
        assert_eq!(
            read_pooling(&current, 4).unwrap(),
            [PoolingMode::Mean, PoolingMode::Cls]
        );
        let one = write(&dir, "one.json", r#"{"pooling_mode": "lasttoken"}"#);
        assert_eq!(read_pooling(&one, 4).unwrap(), [PoolingMode::LastToken]);
        let none = write(&dir, "none.json", r#"{"word_embedding_dimension": 4}"#);
        assert_eq!(read_pooling(&none, 4).unwrap(), [PoolingMode::Mean]);
        // every legacy flag false: mean, as sentence-transformers 5.7 gives
        // (`Pooling(4, pooling_mode_mean_tokens=False, …).get_config_dict()` → "mean")
        let all_false = write(
            &dir,
            "all_false.json",
            r#"{"word_embedding_dimension": 4, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}"#,
        );
        assert_eq!(read_pooling(&all_false, 4).unwrap(), [PoolingMode::Mean]);
        let empty = write(&dir, "empty.json", r#"{"pooling_mode": []}"#);
        let msg = read_pooling(&empty, 4).unwrap_err().to_string();
        assert!(
            msg.contains("pooling_mode") && msg.contains("empty"),
            "{msg}"
        );

        let msg = read_pooling(&legacy, 8).unwrap_err().to_string();
        assert!(msg.contains("word_embedding_dimension"), "{msg}");
        let bad = write(&dir, "bad.json", r#"{"pooling_mode": "median"}"#);
        let msg = read_pooling(&bad, 4).unwrap_err().to_string();
        assert!(
            msg.contains("pooling_mode") && msg.contains("median"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modules_must_be_a_pipeline_qkv_runs() {
        let dir = crate::io::scratch_dir("modules");
        let entry = |kind: &str, path: &str| {
            format!(
                r#"{{"idx": 0, "name": "x", "path": "{path}", "type": "sentence_transformers.models.{kind}"}}"#
            )
        };
        let ok = write(
            &dir,
            "ok.json",
            &format!(
                "[{}, {}, {}]",
                entry("Transformer", ""),
                entry("Pooling", "1_Pooling"),
                entry("Normalize", "2_Normalize")
            ),
        );
        let (t, p, n) = read_modules(&dir, &ok).unwrap();
        assert_eq!((t, p, n), (dir.join(""), Some(dir.join("1_Pooling")), true));
        let dense = write(
            &dir,
            "dense.json",
            &format!(
                "[{}, {}, {}]",
                entry("Transformer", ""),
                entry("Pooling", "1_Pooling"),
                entry("Dense", "2_Dense")
            ),
        );
        let msg = read_modules(&dir, &dense).unwrap_err().to_string();
        assert!(msg.contains("sentence_transformers.models.Dense"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
