//! What a folder says about generating: `generation_config.json`, or where a folder has
//! none, the same fields in `config.json` (transformers' `from_model_config`). Read are
//! the fields that change which tokens come out: lengths, beams and their scoring, the
//! banned and forced tokens, and whether to sample.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::{field_error, read_json};
use crate::models::families::keys::same_value;
use crate::models::families::special::Ids;

use super::penalties::Penalties;

/// When beam search stops (transformers' `early_stopping`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EarlyStopping {
    /// `false`: stop when no running beam can beat the worst finished one, judged at
    /// the current length.
    #[default]
    Heuristic,
    /// `true`: stop as soon as there are as many finished hypotheses as beams.
    Done,
    /// `"never"`: the canonical rule, judged at the longest length a beam may reach.
    Never,
}

/// Sampling settings a folder asks for (`do_sample: true`), with transformers'
/// defaults for what it leaves out (temperature 1, top-k 50, top-p 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleSettings {
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    /// transformers' `min_p`: tokens less likely than this fraction of the likeliest
    /// one are dropped (after temperature, top-k and top-p).
    pub min_p: Option<f32>,
}

/// How tokens are searched for and constrained, besides greedy choice or sampling:
/// beams and their scoring, banned and forced tokens, penalties on repeats.
#[derive(Clone, Debug, PartialEq)]
pub struct Search {
    /// Beam search with this many beams when above 1.
    pub num_beams: usize,
    /// Beam scores are divided by the generated length to this power.
    pub length_penalty: f32,
    pub early_stopping: EarlyStopping,
    /// Token sequences never to produce: the last token of one is banned after the
    /// others (OPUS-MT bans its pad id; a single EOS is not banned, as in transformers).
    pub bad_words: Vec<Vec<usize>>,
    /// The only tokens allowed at the last step the length allows.
    pub forced_eos: Vec<usize>,
    /// Beam scores log-softmaxed again after the banned and forced tokens.
    pub renormalize_logits: bool,
    /// The repetition penalty (a folder's), OpenAI's presence and frequency penalties
    /// and logit biases (a request's).
    pub penalties: Penalties,
}

impl Default for Search {
    fn default() -> Self {
        Search {
            num_beams: 1,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            bad_words: Vec::new(),
            forced_eos: Vec::new(),
            renormalize_logits: false,
            penalties: Penalties::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenerationConfig {
    /// Prompt (or decoder start) plus new tokens; transformers' default is 20.
    pub max_length: usize,
    pub max_new_tokens: Option<usize>,
    pub search: Search,
    pub sample: Option<SampleSettings>,
    /// The file these settings were read from and the fields it set, so that an error
    /// a setting causes later can name the file and the field the user wrote.
    pub origin: Option<Origin>,
    /// Settings the file gives that change which tokens transformers picks and qkv does
    /// not apply (a repetition penalty, say), each as a warning naming file and field.
    pub unapplied: Vec<String>,
}

/// Where a [`GenerationConfig`] came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Origin {
    pub path: PathBuf,
    /// The fields the file set, by their names in it.
    pub fields: Vec<&'static str>,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_length: 20,
            max_new_tokens: None,
            search: Search::default(),
            sample: None,
            origin: None,
            unapplied: Vec::new(),
        }
    }
}

/// Generation settings transformers applies and qkv does not, each with the value
/// that means "off" (transformers' default).
const UNAPPLIED: &[(&str, &str)] = &[
    ("min_length", "0"),
    ("min_new_tokens", "null"),
    ("encoder_repetition_penalty", "1.0"),
    ("no_repeat_ngram_size", "0"),
    ("encoder_no_repeat_ngram_size", "0"),
    ("typical_p", "1.0"),
    ("epsilon_cutoff", "0.0"),
    ("eta_cutoff", "0.0"),
    ("num_beam_groups", "1"),
    ("diversity_penalty", "0.0"),
    ("penalty_alpha", "null"),
    ("exponential_decay_length_penalty", "null"),
    ("suppress_tokens", "null"),
    ("begin_suppress_tokens", "null"),
    ("forced_bos_token_id", "null"),
    ("sequence_bias", "null"),
    ("guidance_scale", "null"),
];

/// Warnings for the settings of `file` (`path`'s JSON object) that [`UNAPPLIED`]
/// lists, set to something other than off.
fn unapplied(path: &Path, file: &serde_json::Map<String, Value>) -> Vec<String> {
    let off = |v: &Value, default: &str| {
        let d: Value = serde_json::from_str(default).expect("a default is JSON");
        v.is_null() || v.as_array().is_some_and(Vec::is_empty) || same_value(v, &d)
    };
    UNAPPLIED
        .iter()
        .filter_map(|&(field, default)| {
            let v = file.get(field).filter(|v| !off(v, default))?;
            Some(format!(
                "{}: field `{field}` is {v}: transformers applies it when generating, qkv does not",
                path.display()
            ))
        })
        .collect()
}

/// The fields as written; every one optional.
#[derive(Deserialize, Default)]
struct Raw {
    max_length: Option<usize>,
    max_new_tokens: Option<usize>,
    num_beams: Option<usize>,
    length_penalty: Option<f32>,
    early_stopping: Option<Value>,
    bad_words_ids: Option<Vec<Vec<i64>>>,
    forced_eos_token_id: Option<Ids>,
    renormalize_logits: Option<bool>,
    do_sample: Option<bool>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// The folder's settings; errors name the file and the field. A GGUF file holds
    /// none: transformers' defaults.
    pub fn read(dir: &Path) -> Result<Self> {
        if crate::io::gguf::is_gguf(dir) {
            return Ok(GenerationConfig::default());
        }
        let file = match dir.join("generation_config.json") {
            p if p.is_file() => "generation_config.json",
            _ => "config.json",
        };
        let path = dir.join(file);
        let raw: Raw = read_json(&path)?;
        let whole: serde_json::Map<String, Value> = read_json(&path)?;
        let bad = |field: &str, why: String| field_error(&path, field, why);
        let mut c = GenerationConfig {
            unapplied: unapplied(&path, &whole),
            origin: Some(Origin {
                path: path.clone(),
                fields: raw.fields(),
            }),
            ..GenerationConfig::default()
        };
        if let Some(n) = raw.max_length {
            c.max_length = n;
        }
        c.max_new_tokens = raw.max_new_tokens;
        if let Some(n) = raw.num_beams {
            if n == 0 {
                return Err(bad("num_beams", "must be at least 1".into()));
            }
            c.search.num_beams = n;
        }
        if let Some(p) = raw.length_penalty {
            if !p.is_finite() {
                return Err(bad("length_penalty", format!("must be finite, got {p}")));
            }
            c.search.length_penalty = p;
        }
        c.search.early_stopping = match raw.early_stopping {
            None | Some(Value::Bool(false)) | Some(Value::Null) => EarlyStopping::Heuristic,
            Some(Value::Bool(true)) => EarlyStopping::Done,
            Some(Value::String(s)) if s == "never" => EarlyStopping::Never,
            Some(other) => {
                return Err(bad(
                    "early_stopping",
                    format!("must be true, false or \"never\", got {other}"),
                ))
            }
        };
        for seq in raw.bad_words_ids.unwrap_or_default() {
            let ids: Vec<usize> = seq
                .iter()
                .filter_map(|&i| usize::try_from(i).ok())
                .collect();
            if ids.is_empty() || ids.len() != seq.len() {
                return Err(bad(
                    "bad_words_ids",
                    format!("each entry must be a non-empty list of token ids, got {seq:?}"),
                ));
            }
            c.search.bad_words.push(ids);
        }
        c.search.forced_eos = raw
            .forced_eos_token_id
            .map(|i| i.valid())
            .unwrap_or_default();
        c.search.renormalize_logits = raw.renormalize_logits.unwrap_or(false);
        if let Some(r) = raw.repetition_penalty {
            if !(r.is_finite() && r > 0.0) {
                return Err(bad(
                    "repetition_penalty",
                    format!("must be a positive number, got {r}"),
                ));
            }
            c.search.penalties.repetition = r;
        }
        if raw.do_sample == Some(true) {
            let temperature = raw.temperature.unwrap_or(1.0);
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(bad(
                    "temperature",
                    format!("must be > 0, got {temperature}"),
                ));
            }
            // the rule of the `top_p` keyword; a top_k of 0 means none, as in
            // transformers (the keyword asks for at least 1)
            if let Some(p) = raw.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
                return Err(bad("top_p", format!("must be in (0, 1], got {p}")));
            }
            if let Some(p) = raw.min_p.filter(|p| !(0.0..=1.0).contains(p)) {
                return Err(bad("min_p", format!("must be in [0, 1], got {p}")));
            }
            c.sample = Some(SampleSettings {
                temperature,
                top_k: Some(raw.top_k.unwrap_or(50)).filter(|&k| k > 0),
                top_p: raw.top_p.filter(|&p| p < 1.0),
                min_p: raw.min_p.filter(|&p| p > 0.0),
            });
        }
        Ok(c)
    }

    /// Where `field`'s value came from: the file, when it set that field.
    pub fn file_of(&self, field: &str) -> Option<&Path> {
        self.origin
            .as_ref()
            .filter(|o| o.fields.contains(&field))
            .map(|o| o.path.as_path())
    }

    /// Checks every token id the settings name (banned words, forced EOS) is inside a
    /// vocabulary of `vocab`; an error names the field and the file.
    pub fn check_vocab(&self, vocab: usize) -> Result<()> {
        let banned = self.search.bad_words.iter().flatten();
        let fields = [
            ("bad_words_ids", banned.copied().collect::<Vec<_>>()),
            ("forced_eos_token_id", self.search.forced_eos.clone()),
        ];
        for (field, ids) in fields {
            if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                let why = format!("token id {bad} is outside the vocabulary of {vocab}");
                return Err(match self.file_of(field) {
                    Some(path) => field_error(path, field, why),
                    None => Error::invalid(field, why),
                });
            }
        }
        Ok(())
    }
}

impl Raw {
    /// The names of the fields the file set.
    fn fields(&self) -> Vec<&'static str> {
        let set = [
            ("max_length", self.max_length.is_some()),
            ("max_new_tokens", self.max_new_tokens.is_some()),
            ("num_beams", self.num_beams.is_some()),
            ("length_penalty", self.length_penalty.is_some()),
            ("early_stopping", self.early_stopping.is_some()),
            ("bad_words_ids", self.bad_words_ids.is_some()),
            ("forced_eos_token_id", self.forced_eos_token_id.is_some()),
            ("renormalize_logits", self.renormalize_logits.is_some()),
            ("do_sample", self.do_sample.is_some()),
            ("temperature", self.temperature.is_some()),
            ("top_k", self.top_k.is_some()),
            ("top_p", self.top_p.is_some()),
            ("min_p", self.min_p.is_some()),
            ("repetition_penalty", self.repetition_penalty.is_some()),
        ];
        set.into_iter()
            .filter(|(_, on)| *on)
            .map(|(f, _)| f)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_qkv_does_not_apply_are_named_when_on() {
        let dir = crate::io::scratch_dir("generation-unapplied");
        let path = dir.join("generation_config.json");
        std::fs::write(
            &path,
            r#"{"no_repeat_ngram_size": 3, "encoder_no_repeat_ngram_size": 0, "suppress_tokens": [],
                "min_length": 3, "typical_p": 1, "top_k": 5}"#,
        )
        .unwrap();
        let c = GenerationConfig::read(&dir).unwrap();
        assert_eq!(c.unapplied.len(), 2, "{:?}", c.unapplied);
        assert!(
            c.unapplied[0].contains("generation_config.json: field `min_length` is 3")
                && c.unapplied[1].contains("field `no_repeat_ngram_size` is 3"),
            "{:?}",
            c.unapplied
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
