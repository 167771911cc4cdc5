//! BLOOM against its Hugging Face fixture (`tests/fixtures/models/bloom`, made by
//! tools/fixtures/gen_models.py): logits with right and left padding (ALiBi from the
//! mask in HF, the relative form here), cached decoding, greedy generation; the
//! bigscience layout without the `transformer.` prefix; no length limit; and the
//! errors a user's input can cause.

#![cfg(feature = "models")]

mod common;

use std::path::{Path, PathBuf};

use common::models::{assert_real_close, batch, check_causal, load_causal, model_dir, reference};
use qkv::models::{self, TokenBatch, Transformer};
use qkv::Error;

fn forward(m: &Transformer, tokens: &TokenBatch) -> qkv::Result<qkv::Tensor> {
    m.forward_cached(tokens, &mut m.new_cache(tokens.batch))
}

#[test]
fn bloom_matches_hf() {
    check_causal("bloom");

    let f = reference("bloom");
    let m = load_causal("bloom");
    let mut worst = 0.0f32;
    for (ids, mask, logits) in [
        ("input_ids", "attention_mask", "logits"),
        ("left_input_ids", "left_attention_mask", "left_logits"),
    ] {
        let tokens = batch(&f, ids, Some(mask));
        let got = forward(&m, &tokens).unwrap();
        let want = f.t(logits);
        let v = got.last_dim();
        for (p, _) in tokens.mask.iter().enumerate().filter(|(_, &real)| real) {
            for (a, b) in got.data()[p * v..][..v]
                .iter()
                .zip(&want.data()[p * v..][..v])
            {
                worst = worst.max((a - b).abs());
            }
        }
    }
    println!("bloom: max |logits diff| over real positions = {worst:e}");
}

#[test]
fn info_and_special_tokens() {
    let m = load_causal("bloom");
    let info = m.info();
    assert_eq!(
        (info.family.as_str(), info.architecture.as_str()),
        ("bloom", "BloomForCausalLM")
    );
    assert_eq!(
        (
            info.layers,
            info.hidden,
            info.heads,
            info.kv_heads,
            info.head_dim
        ),
        (2, 32, 4, 4, 8)
    );
    assert_eq!(
        (info.ffn_dim, info.vocab, info.max_positions),
        (128, 99, None)
    );
    assert_eq!(info.position, "ALiBi");
    assert_eq!(info.ffn, "GELU (tanh approximation)");
    let special = m.special_tokens();
    assert_eq!(
        (special.eos.as_slice(), special.bos, special.pad),
        (&[2][..], Some(1), Some(0))
    );
}

/// ALiBi has no table of positions: a sequence far longer than any other fixture's
/// position limit runs, and its prefix is unchanged by what follows (causality).
#[test]
fn no_position_limit() {
    let m = load_causal("bloom");
    let ids: Vec<usize> = (0..300).map(|i| 3 + i * 7 % 96).collect();
    let long = forward(&m, &TokenBatch::single(ids.clone()).unwrap()).unwrap();
    let short = forward(&m, &TokenBatch::single(ids[..20].to_vec()).unwrap()).unwrap();
    let v = long.last_dim();
    common::assert_close(
        "prefix of a long sequence",
        &long.data()[..20 * v],
        short.data(),
        1e-5,
        1e-4,
    );
}

#[test]
fn token_id_past_vocabulary_is_out_of_range() {
    let m = load_causal("bloom");
    let v = m.info().vocab;
    let err = forward(&m, &TokenBatch::single(vec![3, 4, v + 7]).unwrap()).unwrap_err();
    match err {
        Error::OutOfRange { index, size, .. } => assert_eq!((index, size), (v + 7, v)),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
}

/// A scratch copy of the `bloom` fixture folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("qkv-bloom-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["config.json", "generation_config.json", "model.safetensors"] {
            std::fs::copy(model_dir("bloom").join(name), dir.join(name)).unwrap();
        }
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn edit_config(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = self.0.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut cfg);
        std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bigscience releases were saved from `BloomModel`: no `transformer.` prefix,
/// and the 176B config names sizes `n_embed` and `num_attention_heads`.
#[test]
fn bigscience_layout_and_config_names_load() {
    let s = Scratch::new("base");
    let path = s.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name.trim_start_matches("transformer.").to_string(), view))
        .collect();
    std::fs::write(
        &path,
        safetensors::tensor::serialize(renamed, None).unwrap(),
    )
    .unwrap();
    s.edit_config(|c| {
        let cfg = c.as_object_mut().unwrap();
        let hidden = cfg.remove("hidden_size").unwrap();
        let heads = cfg.remove("n_head").unwrap();
        cfg.insert("n_embed".into(), hidden);
        cfg.insert("num_attention_heads".into(), heads);
    });
    let m = models::load(s.path()).unwrap().model;
    let f = reference("bloom");
    let tokens = batch(&f, "left_input_ids", Some("left_attention_mask"));
    let got = forward(&m, &tokens).unwrap();
    assert_real_close(
        "bigscience layout logits",
        &got,
        &f.t("left_logits"),
        &tokens.mask,
    );
}

#[test]
fn bad_config_fields_are_named() {
    for (field, value) in [
        ("n_head", serde_json::json!(3)),
        ("hidden_size", serde_json::json!(0)),
        ("layer_norm_epsilon", serde_json::json!(-1.0)),
    ] {
        let s = Scratch::new(field);
        s.edit_config(|c| c[field] = value);
        match models::load(s.path()).err().expect("bad config loaded") {
            Error::Config { field: f, .. } => assert_eq!(f, field),
            other => panic!("expected a config error naming `{field}`, got {other:?}"),
        }
    }
}
