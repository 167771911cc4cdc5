//! Every `config.json` key a family's transformers config class knows, and what qkv does
//! with it, so that no key is ignored without a reason:
//!
//! - [`Rule::Read`]: the family's reader (or the loader, the classifier, generate) takes it;
//! - [`Rule::Irrelevant`]: it cannot change what a forward computes (training-only
//!   settings, provenance, what a call returns), with the reason;
//! - [`Rule::Only`]: qkv computes only this value; anything else is refused, naming the key;
//! - [`Rule::Generation`]: a generation setting, never part of a forward: read by
//!   `generate` from `config.json` where the folder has no `generation_config.json`
//!   (`models/generate/config.rs`), which names those it does not apply in a warning
//!   when they are on.
//!
//! A key in no table (a newer transformers' key, a remote-code key) is a warning at load.
//! `tests/config_keys.rs` holds each family's table to the keys transformers 4.57.1 and
//! 5.x list for its config class, so that a key a new release adds fails a test.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// What qkv does with one `config.json` key (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Read,
    Irrelevant(&'static str),
    /// The only value qkv computes, as JSON; absent and null mean the default too.
    Only(&'static str),
    Generation,
}

/// Keys, each with its rule.
pub type KeyRows = &'static [(&'static str, Rule)];

/// One family's keys: its own rows and the shared parts it reads alike.
pub type KeyTable = &'static [KeyRows];

use Rule::{Generation, Irrelevant, Only, Read};

pub(super) const DROPOUT: Rule = Irrelevant("dropout, off at inference");
pub(super) const INIT: Rule =
    Irrelevant("initialisation of fresh weights; a folder brings its own");
pub(super) const CACHE: Rule =
    Irrelevant("whether decoding keeps a KV cache; the numbers are the same");
const KERNEL: Rule =
    Irrelevant("which attention kernel transformers runs; they compute the same numbers");
pub(super) const TRAINING: Rule =
    Irrelevant("a training setting of transformers' heads and losses");

/// The sizes every Llama-like config names alike (`checks::DecoderSizes`, `head_dim`).
pub const DECODER_SIZES: KeyRows = &[
    ("hidden_size", Read),
    ("intermediate_size", Read),
    ("num_hidden_layers", Read),
    ("num_attention_heads", Read),
    ("num_key_value_heads", Read),
    ("head_dim", Read),
];

/// RoPE in either layout (4.x `rope_theta` + `rope_scaling`, 5.x `rope_parameters`).
pub const ROPE_KEYS: KeyRows = &[
    ("rope_theta", Read),
    ("rope_scaling", Read),
    ("rope_parameters", Read),
];

/// What a decoder's config says about training and caching only.
pub const DECODER_TRAINING: KeyRows = &[
    ("attention_dropout", DROPOUT),
    ("initializer_range", INIT),
    ("use_cache", CACHE),
];

/// PretrainedConfig's keys, every family's (4.57.1 and 5.x).
pub const COMMON: KeyRows = &[
    ("architectures", Read),
    ("model_type", Read),
    (
        "transformers_version",
        Irrelevant("the version that wrote the file"),
    ),
    (
        "_name_or_path",
        Irrelevant("where the folder was loaded from"),
    ),
    (
        "_commit_hash",
        Irrelevant("where the folder was loaded from"),
    ),
    (
        "name_or_path",
        Irrelevant("where the folder was loaded from"),
    ),
    (
        "dtype",
        Irrelevant("the dtype transformers loads in; qkv computes in f32 unless --dtype asks"),
    ),
    (
        "torch_dtype",
        Irrelevant("the dtype transformers loads in; qkv computes in f32 unless --dtype asks"),
    ),
    (
        "use_bfloat16",
        Irrelevant("a TensorFlow-era flag no PyTorch model reads"),
    ),
    (
        "return_dict",
        Irrelevant("the shape of transformers' return value"),
    ),
    (
        "output_attentions",
        Irrelevant("what a call returns; qkv returns maps when asked"),
    ),
    ("output_hidden_states", Irrelevant("what a call returns")),
    (
        "torchscript",
        Irrelevant("tracing; the numbers are the same"),
    ),
    ("use_cache", CACHE),
    (
        "is_encoder_decoder",
        Irrelevant("the model class decides; its code ignores the key"),
    ),
    (
        "cross_attention_hidden_size",
        Irrelevant("used only with add_cross_attention"),
    ),
    (
        "is_decoder",
        Irrelevant("the model class decides whether it is causal (BERT's own table refuses true)"),
    ),
    ("add_cross_attention", Only("false")),
    ("tie_encoder_decoder", Only("false")),
    ("pruned_heads", Only("{}")),
    (
        "chunk_size_feed_forward",
        Irrelevant("the FFN in chunks of rows computes the same numbers"),
    ),
    ("id2label", Read),
    ("label2id", Irrelevant("the inverse of id2label")),
    (
        "num_labels",
        Irrelevant("a classifier's size is its tensors'; id2label names them"),
    ),
    ("problem_type", Read),
    (
        "finetuning_task",
        Irrelevant("a note of the task trained for"),
    ),
    (
        "prefix",
        Irrelevant("a prompt prefix pipelines add; not part of the model"),
    ),
    (
        "task_specific_params",
        Irrelevant("pipelines' settings; not part of the model"),
    ),
    (
        "tokenizer_class",
        Irrelevant("the tokenizer comes from the folder's tokenizer files"),
    ),
    ("tf_legacy_loss", Irrelevant("a TensorFlow loss setting")),
    (
        "sep_token_id",
        Irrelevant("the tokenizer's separator; no forward reads it"),
    ),
    ("bos_token_id", Read),
    ("eos_token_id", Read),
    ("pad_token_id", Read),
    ("decoder_start_token_id", Read),
    ("vocab_size", Read),
    (
        "auto_map",
        Irrelevant("remote code, which transformers runs only with trust_remote_code"),
    ),
    ("_attn_implementation_autoset", KERNEL),
    ("attn_implementation", KERNEL),
    ("_attn_implementation", KERNEL),
    ("quantization_config", Only("null")),
    ("max_length", Generation),
    ("max_new_tokens", Generation),
    ("min_length", Generation),
    ("do_sample", Generation),
    ("early_stopping", Generation),
    ("num_beams", Generation),
    ("num_beam_groups", Generation),
    ("diversity_penalty", Generation),
    ("temperature", Generation),
    ("top_k", Generation),
    ("top_p", Generation),
    ("typical_p", Generation),
    ("repetition_penalty", Generation),
    ("length_penalty", Generation),
    ("no_repeat_ngram_size", Generation),
    ("encoder_no_repeat_ngram_size", Generation),
    ("bad_words_ids", Generation),
    ("num_return_sequences", Generation),
    ("output_scores", Generation),
    ("return_dict_in_generate", Generation),
    ("forced_bos_token_id", Generation),
    ("forced_eos_token_id", Generation),
    ("remove_invalid_values", Generation),
    ("exponential_decay_length_penalty", Generation),
    ("suppress_tokens", Generation),
    ("begin_suppress_tokens", Generation),
    ("renormalize_logits", Generation),
];

/// The keys of `rope_scaling` (4.x) and `rope_parameters` (5.x) that
/// [`crate::position::rope_scaling::HfRopeConfig`] reads.
pub const ROPE: &[&str] = &[
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "short_factor",
    "long_factor",
    "partial_rotary_factor",
];

/// The rule of `key` for a family with `table`: its own row, else PretrainedConfig's.
pub fn rule(table: KeyTable, key: &str) -> Option<Rule> {
    table
        .iter()
        .flat_map(|rows| rows.iter())
        .chain(COMMON)
        .find(|(k, _)| *k == key)
        .map(|&(_, r)| r)
}

/// Checks the keys of `config` (`dir/config.json`, read by the family `family` whose
/// table is `table`): a key whose value qkv does not compute is an error naming it; the
/// returned warnings name keys no table knows. Null counts as absent.
pub fn check(
    dir: &Path,
    family: &str,
    table: KeyTable,
    config: &Map<String, Value>,
) -> Result<Vec<String>> {
    let path = dir.join("config.json");
    let mut warnings = Vec::new();
    for (key, value) in config {
        if value.is_null() {
            continue;
        }
        match rule(table, key) {
            Some(Only(default)) => {
                let want: Value = serde_json::from_str(default).expect("a rule's default is JSON");
                if !same_value(value, &want) {
                    let only = match default {
                        "null" => "without it".to_string(),
                        d => format!("with {d}"),
                    };
                    return Err(Error::Unsupported(format!(
                        "{}: field `{key}` is {value}; qkv computes {family} models only {only}",
                        path.display()
                    )));
                }
            }
            Some(Read | Irrelevant(_) | Generation) => {}
            None => warnings.push(format!(
                "{}: field `{key}` is not one qkv's {family} reader knows; it is ignored, and transformers may use it",
                path.display()
            )),
        }
        if matches!(key.as_str(), "rope_scaling" | "rope_parameters") {
            rope_warnings(&path, key, value, &mut warnings);
        }
    }
    Ok(warnings)
}

/// Warnings for keys of a RoPE entry (`field`) that [`ROPE`] does not list: transformers
/// warns about and ignores them too. 5.x nests an entry per layer type.
fn rope_warnings(path: &Path, field: &str, value: &Value, warnings: &mut Vec<String>) {
    let Some(entry) = value.as_object() else {
        return;
    };
    for (key, inner) in entry {
        if ROPE.contains(&key.as_str()) {
            continue;
        }
        if inner.is_object() {
            rope_warnings(path, &format!("{field}.{key}"), inner, warnings);
        } else {
            warnings.push(format!(
                "{}: field `{field}.{key}` is not a RoPE setting qkv knows; it is ignored, as transformers ignores it",
                path.display()
            ));
        }
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
pub(crate) fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TABLE: KeyTable = &[&[("hidden_size", Read), ("is_decoder", Only("false"))]];

    fn run(config: Value) -> Result<Vec<String>> {
        let Value::Object(map) = config else {
            unreachable!()
        };
        check(Path::new("/m"), "bert", TABLE, &map)
    }

    #[test]
    fn known_keys_pass_unknown_ones_warn_and_non_defaults_are_refused() {
        assert!(
            run(json!({"hidden_size": 8, "dtype": "bfloat16", "is_decoder": false}))
                .unwrap()
                .is_empty()
        );
        let w = run(json!({"hidden_size": 8, "new_knob": 3})).unwrap();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("`new_knob`") && w[0].contains("bert"),
            "{w:?}"
        );
        let e = run(json!({"is_decoder": true})).unwrap_err().to_string();
        assert!(
            e.contains("field `is_decoder` is true") && e.contains("/m/config.json"),
            "{e}"
        );
        assert!(
            run(json!({"is_decoder": null})).unwrap().is_empty(),
            "null is absent"
        );
        assert!(run(json!({"pruned_heads": {}})).unwrap().is_empty());
        assert!(run(json!({"pruned_heads": {"0": [1]}})).is_err());
        let e = run(json!({"quantization_config": {"quant_method": "gptq"}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("field `quantization_config`") && e.contains("only without it"),
            "{e}"
        );
    }

    #[test]
    fn unknown_rope_keys_warn_at_any_depth() {
        let w = run(
            json!({"rope_scaling": {"rope_type": "linear", "factor": 2, "mrope_section": [1]}}),
        )
        .unwrap();
        assert!(
            w.len() == 2 && w[1].contains("rope_scaling.mrope_section"),
            "{w:?}"
        );
        let w = run(json!({"rope_parameters": {"full_attention": {"rope_theta": 1e6, "odd": 1}}}))
            .unwrap();
        assert!(
            w.iter()
                .any(|m| m.contains("rope_parameters.full_attention.odd")),
            "{w:?}"
        );
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(same_value(&json!(1), &json!(1.0)));
        assert!(!same_value(&json!([1, 2]), &json!([1])));
    }
}
