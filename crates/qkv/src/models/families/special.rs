//! Special token ids (EOS, BOS, padding, decoder start) as Hugging Face folders write
//! them: in `config.json`, and again in `generation_config.json`, which fills what the
//! config leaves unset.
//!
//! Each field is one id, a list (several EOS ids), or a negative number for "none"
//! (some converted Llama configs write `pad_token_id: -1`). Every id of a list is an
//! EOS; for the other fields the first valid id counts.

use std::path::Path;

use serde::Deserialize;

use crate::error::Result;
use crate::io::{field_error, read_json_or_default};

/// Token ids with special meaning for generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub eos: Vec<usize>,
    pub pad: Option<usize>,
    pub bos: Option<usize>,
    /// First decoder token of an encoder-decoder.
    pub decoder_start: Option<usize>,
}

impl SpecialTokens {
    /// Writes the ids into a `config.json` object under transformers' keys (one EOS as a
    /// number, several as a list). An id the model does not have keeps what the object
    /// says (the source folder's value, an id outside the vocabulary left out at load),
    /// or is written as null where it says nothing.
    pub(crate) fn write_into(&self, config: &mut serde_json::Map<String, serde_json::Value>) {
        use serde_json::{json, Value};
        let eos = match self.eos.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        for (key, value) in [
            ("eos_token_id", eos),
            ("bos_token_id", json!(self.bos)),
            ("pad_token_id", json!(self.pad)),
            ("decoder_start_token_id", json!(self.decoder_start)),
        ] {
            match (value.is_null(), config.contains_key(key)) {
                (false, _) => {
                    config.insert(key.into(), value);
                }
                (true, false) if key == "eos_token_id" => {
                    config.insert(key.into(), value);
                }
                (true, _) => {}
            }
        }
    }
}

/// A token id field: one id or a list; negative ids mean none.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Ids {
    One(i64),
    Many(Vec<i64>),
}

impl Ids {
    /// The valid (non-negative) ids, in order.
    pub(crate) fn valid(&self) -> Vec<usize> {
        let all = match self {
            Ids::One(id) => std::slice::from_ref(id),
            Ids::Many(ids) => ids.as_slice(),
        };
        all.iter()
            .filter_map(|&id| usize::try_from(id).ok())
            .collect()
    }
}

/// The special-token fields of `config.json` and `generation_config.json`. Families
/// `#[serde(flatten)]` it into their config struct.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TokenIds {
    pub eos_token_id: Option<Ids>,
    pub bos_token_id: Option<Ids>,
    pub pad_token_id: Option<Ids>,
    pub decoder_start_token_id: Option<Ids>,
}

impl TokenIds {
    /// Each field by its name in the file.
    fn fields(&self) -> [(&'static str, Option<&Ids>); 4] {
        [
            ("eos_token_id", self.eos_token_id.as_ref()),
            ("bos_token_id", self.bos_token_id.as_ref()),
            ("pad_token_id", self.pad_token_id.as_ref()),
            (
                "decoder_start_token_id",
                self.decoder_start_token_id.as_ref(),
            ),
        ]
    }

    /// `config.json`'s pad id, as a model's `padding_idx` (None when unset or negative).
    pub fn pad(&self) -> Option<usize> {
        self.pad_token_id
            .as_ref()
            .and_then(|ids| ids.valid().first().copied())
    }
}

/// The special tokens of the folder `dir`: each field from `from_config` (what
/// config.json says), or where config.json leaves it unset, from
/// `dir/generation_config.json` when the folder has one. A field set to a negative id
/// counts as set: it means "none" and is not filled from the other file. An id at or
/// past `vocab` (a `GPT2Config(vocab_size=…)` keeps 50256 whatever the vocabulary) is
/// left out, as transformers runs such folders too, with a warning naming the field and
/// the file: the model can never produce it, nor read it.
pub fn special_tokens(
    dir: &Path,
    from_config: TokenIds,
    vocab: usize,
) -> Result<(SpecialTokens, Vec<String>)> {
    let generation_path = dir.join("generation_config.json");
    let generation: TokenIds = read_json_or_default(&generation_path)?;
    let config_path = dir.join("config.json");
    // every id either file gives is checked, the one that loses to the other too: a
    // file that names a token the model lacks is named wherever it is read
    let mut warnings = Vec::new();
    let mut named = std::collections::HashSet::new();
    for (ids, path) in [
        (&from_config, &config_path),
        (&generation, &generation_path),
    ] {
        for (field, value) in ids.fields() {
            let ids = value.map(Ids::valid).unwrap_or_default();
            for &bad in ids.iter().filter(|&&id| id >= vocab) {
                // generation_config.json repeats config.json's ids: named once
                if !named.insert((field, bad)) {
                    continue;
                }
                let effect = match field {
                    "eos_token_id" => {
                        "the model can never produce it, so generation never stops at it"
                    }
                    _ => "the model can never read it, so it is left unset",
                };
                warnings.push(
                    field_error(
                        path,
                        field,
                        format!("token id {bad} is outside the vocabulary of {vocab}: {effect}"),
                    )
                    .to_string(),
                );
            }
        }
    }
    let inside = |ids: Ids| {
        ids.valid()
            .into_iter()
            .filter(|&id| id < vocab)
            .collect::<Vec<_>>()
    };
    let pick = |own: Option<Ids>, fallback: Option<Ids>| own.or(fallback).map(inside);
    let first = |own, fallback| pick(own, fallback).and_then(|ids| ids.first().copied());
    let special = SpecialTokens {
        eos: pick(from_config.eos_token_id, generation.eos_token_id).unwrap_or_default(),
        bos: first(from_config.bos_token_id, generation.bos_token_id),
        pad: first(from_config.pad_token_id, generation.pad_token_id),
        decoder_start: first(
            from_config.decoder_start_token_id,
            generation.decoder_start_token_id,
        ),
    };
    Ok((special, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(json: &str) -> TokenIds {
        serde_json::from_str(json).unwrap()
    }

    /// A scratch folder, with a generation_config.json when `generation` is given.
    fn folder(tag: &str, generation: Option<&str>) -> std::path::PathBuf {
        let dir = crate::io::scratch_dir(&format!("special-{tag}"));
        if let Some(text) = generation {
            std::fs::write(dir.join("generation_config.json"), text).unwrap();
        }
        dir
    }

    #[test]
    fn config_wins_and_generation_config_fills_the_rest() {
        let dir = folder(
            "fill",
            Some(
                r#"{"eos_token_id": 9, "bos_token_id": 8, "pad_token_id": 7, "decoder_start_token_id": 6}"#,
            ),
        );
        let (s, _) = special_tokens(
            &dir,
            ids(r#"{"eos_token_id": [2, 3], "bos_token_id": 1}"#),
            10,
        )
        .unwrap();
        assert_eq!(
            s,
            SpecialTokens {
                eos: vec![2, 3],
                bos: Some(1),
                pad: Some(7),
                decoder_start: Some(6),
            }
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn negative_ids_mean_none_and_are_not_filled() {
        let dir = folder("negative", Some(r#"{"pad_token_id": 0}"#));
        let (s, _) = special_tokens(
            &dir,
            ids(r#"{"pad_token_id": -1, "eos_token_id": [-1, 4], "bos_token_id": [5, 6]}"#),
            10,
        )
        .unwrap();
        assert_eq!((s.pad, s.eos, s.bos), (None, vec![4], Some(5)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_generation_config_only_the_config_counts() {
        let dir = folder("absent", None);
        let (s, warnings) = special_tokens(&dir, TokenIds::default(), 10).unwrap();
        assert_eq!(s, SpecialTokens::default());
        assert!(warnings.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_broken_generation_config_is_named() {
        let dir = folder("broken", Some(r#"{"eos_token_id": "x"}"#));
        let msg = special_tokens(&dir, TokenIds::default(), 10)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("generation_config.json"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_left_out_with_a_warning_naming_field_and_file() {
        // GPT2Config(vocab_size=99) keeps bos = eos = 50256; transformers runs such folders
        let dir = folder("outside", Some(r#"{"decoder_start_token_id": 5000}"#));
        let (s, warnings) = special_tokens(
            &dir,
            ids(r#"{"eos_token_id": [1, 100], "bos_token_id": 100}"#),
            100,
        )
        .unwrap();
        assert_eq!((s.eos, s.bos, s.decoder_start), (vec![1], None, None));
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(
            warnings[0].contains("config.json: field `eos_token_id`")
                && warnings[0].contains("token id 100 is outside the vocabulary of 100")
                && warnings[0].contains("never stops at it"),
            "{warnings:?}"
        );
        assert!(
            warnings[2].contains("generation_config.json")
                && warnings[2].contains("decoder_start_token_id")
                && warnings[2].contains("token id 5000"),
            "{warnings:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
