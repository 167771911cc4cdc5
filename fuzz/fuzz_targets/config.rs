//! `config.json` → model construction, over every family: the first byte picks one of
//! the tiny fixture models (its `model.safetensors` and `generation_config.json` are
//! linked into a scratch folder), the rest is written as that folder's `config.json`,
//! and `qkv::models::load` reads it. A model that loads must run: two tokens through
//! it (as source and target for an encoder-decoder) must give a result, unless the
//! model has fewer than two positions or a vocabulary too small for them.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use qkv::models::TokenBatch;

/// The fixture folders under crates/qkv/tests/fixtures/models/, in first-byte order
/// (the corpus seeds are named after them).
const FAMILIES: &[&str] = &[
    "bert",
    "gpt2",
    "llama_gqa",
    "mistral",
    "bloom",
    "marian",
    "t5",
    "t5_gated",
    "llama_mqa_tied",
    "llama_bf16",
];

/// One scratch folder per fixture, holding links to its weights.
fn folders() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        FAMILIES
            .iter()
            .map(|name| {
                let dir = qkv_fuzz::scratch(&format!("config/{name}"));
                let src = qkv_fuzz::fixture(&format!("models/{name}"));
                for file in ["model.safetensors", "generation_config.json"] {
                    if src.join(file).is_file() {
                        let target = src.join(file).canonicalize().expect("fixture path");
                        qkv_fuzz::link(&target, &dir.join(file));
                    }
                }
                dir
            })
            .collect()
    })
}

fuzz_target!(init: qkv_fuzz::init(), |data: &[u8]| {
    let Some((&pick, config)) = data.split_first() else {
        return;
    };
    let dir = &folders()[pick as usize % FAMILIES.len()];
    qkv_fuzz::write(&dir.join("config.json"), config);
    let loaded = match qkv::models::load(dir) {
        Ok(l) => l,
        Err(e) => return qkv_fuzz::note("load", &e),
    };
    let model = loaded.model;
    let info = model.info();
    let enough_positions = info.max_positions.is_none_or(|m| m >= 2);
    if info.vocab < 3 || !enough_positions {
        return;
    }
    let tokens = TokenBatch::new(vec![1, 2], None, 1, 2).expect("a 1×2 batch");
    qkv_fuzz::note("loaded and ran", &info.architecture);
    if let Err(e) = qkv_fuzz::forward(&model, &tokens, None, Some(&tokens)) {
        panic!("a model that loaded does not run on two tokens: {e}");
    }
});
