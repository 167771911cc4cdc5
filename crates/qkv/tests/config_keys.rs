//! No silent ignore: every key transformers' config class of a family knows — in
//! 4.57.1 and in the current 5.x, as `tools/fixtures/gen_config_keys.py` listed them
//! from the classes themselves (`to_dict()` with its defaults, the `__init__`
//! parameters, the `attribute_map` aliases) — is classified by the family's key table
//! (`models/families/keys.rs`): read, irrelevant to a forward with a reason, refused
//! unless it holds its default, or a generation setting. A key a new release adds
//! fails here until it is classified.
//!
//! And the tables hold: a refused key's value in qkv's table is transformers' own
//! default, and every fixture folder (written by transformers) loads without a warning
//! about an unknown key.

#![cfg(feature = "models")]

use std::path::{Path, PathBuf};

use qkv::models::families::keys::Rule;
use qkv::models::Family;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The key lists of each transformers version, `(version, classes)`.
fn key_lists() -> Vec<(String, serde_json::Map<String, Value>)> {
    let dir = fixtures().join("config_keys");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let version = doc["transformers"].as_str().unwrap().to_string();
        out.push((version, doc["classes"].as_object().unwrap().clone()));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let versions: Vec<&str> = out.iter().map(|(v, _)| v.as_str()).collect();
    assert!(
        versions.contains(&"4.57.1") && versions.iter().any(|v| v.starts_with("5.")),
        "config_keys/ must list transformers 4.57.1 and a 5.x, has {versions:?}"
    );
    out
}

/// Every key a class lists: `to_dict()`'s, the `__init__` parameters, the aliases.
fn class_keys(class: &Value) -> Vec<String> {
    let mut keys: Vec<String> = class["keys"].as_object().unwrap().keys().cloned().collect();
    for k in class["init"].as_array().unwrap() {
        keys.push(k.as_str().unwrap().to_string());
    }
    keys.extend(class["aliases"].as_object().unwrap().keys().cloned());
    keys.sort();
    keys.dedup();
    keys
}

#[test]
fn every_key_of_every_family_class_is_classified_in_both_versions() {
    let mut unclassified = Vec::new();
    let mut checked = 0;
    for (version, classes) in key_lists() {
        for (family_name, class) in &classes {
            let family = Family::reading(family_name)
                .unwrap_or_else(|| panic!("no family `{family_name}` (transformers {version})"));
            assert_eq!(family.name(), family_name);
            for key in class_keys(class) {
                checked += 1;
                if family.key_rule(&key).is_none() {
                    unclassified.push(format!(
                        "{family_name} ({}, transformers {version}): `{key}`",
                        class["class"].as_str().unwrap()
                    ));
                }
            }
        }
    }
    assert!(checked > 2000, "only {checked} keys checked");
    assert!(
        unclassified.is_empty(),
        "{} keys no table classifies:\n{}",
        unclassified.len(),
        unclassified.join("\n")
    );
}

#[test]
fn refused_keys_hold_transformers_own_default() {
    for (version, classes) in key_lists() {
        for (family_name, class) in &classes {
            let family = Family::reading(family_name).unwrap();
            for (key, default) in class["keys"].as_object().unwrap() {
                let Some(Rule::Only(only)) = family.key_rule(key) else {
                    continue;
                };
                let only: Value = serde_json::from_str(only).unwrap();
                let same = match (default, &only) {
                    (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
                    _ => default == &only,
                };
                assert!(
                    same,
                    "{family_name} `{key}`: qkv computes only {only}, transformers {version}'s default is {default}"
                );
            }
        }
    }
}

/// Every `config.json` under `dir`, recursively.
fn configs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            configs(&path, out);
        } else if path.file_name().is_some_and(|n| n == "config.json") {
            out.push(path);
        }
    }
}

#[test]
fn every_fixture_folder_loads_without_a_key_warning() {
    let mut found = Vec::new();
    configs(&fixtures(), &mut found);
    let mut loaded = 0;
    for config in found {
        let dir = config.parent().unwrap();
        // sentence-transformers folders keep the model's config beside modules.json;
        // folders of other files (tokenizers) have no model to load
        let has_weights = ["model.safetensors", "model.safetensors.index.json"]
            .iter()
            .any(|f| dir.join(f).is_file());
        if !has_weights {
            continue;
        }
        let model = match qkv::models::load(dir) {
            Ok(l) => l.model,
            Err(e) => panic!("{}: {e}", dir.display()),
        };
        let keys: Vec<&String> = model
            .load_warnings
            .iter()
            .filter(|w| w.contains("reader knows") || w.contains("RoPE setting"))
            .collect();
        assert!(keys.is_empty(), "{}: {keys:?}", dir.display());
        loaded += 1;
    }
    assert!(loaded >= 40, "only {loaded} fixture folders loaded");
}
