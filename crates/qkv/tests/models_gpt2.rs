//! GPT-2 against its Hugging Face fixtures (`tests/fixtures/models/gpt2` and the
//! sharded `gpt2_sharded`, made by tools/fixtures/gen_models.py): logits with right and
//! left padding, cached decoding, greedy generation; the `GPT2Model` layout without the
//! `transformer.` prefix; an untied head; and the errors a user's input can cause.

#![cfg(feature = "models")]

mod common;

use std::path::{Path, PathBuf};

use common::models::{assert_real_close, batch, check_causal, load_causal, model_dir, reference};
use qkv::models::{self, TokenBatch, Transformer};
use qkv::Error;

#[test]
fn gpt2_matches_hf() {
    check_causal("gpt2");
    print_worst_diff("gpt2");
}

#[test]
fn gpt2_sharded_matches_hf() {
    check_causal("gpt2_sharded");
    print_worst_diff("gpt2_sharded");
}

/// Reports the largest |logit − HF logit| over real positions of both padded batches.
fn print_worst_diff(name: &str) {
    let f = reference(name);
    let m = load_causal(name);
    let mut worst = 0.0f32;
    for (ids, mask, logits) in [
        ("input_ids", "attention_mask", "logits"),
        ("left_input_ids", "left_attention_mask", "left_logits"),
    ] {
        let tokens = batch(&f, ids, Some(mask));
        let got = m
            .forward_cached(&tokens, &mut m.new_cache(tokens.batch))
            .unwrap();
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
    println!("{name}: max |logits diff| over real positions = {worst:e}");
}

fn forward(m: &Transformer, tokens: &TokenBatch) -> qkv::Result<qkv::Tensor> {
    m.forward_cached(tokens, &mut m.new_cache(tokens.batch))
}

#[test]
fn info_and_special_tokens() {
    let m = load_causal("gpt2");
    let info = m.info();
    assert_eq!(
        (info.family.as_str(), info.architecture.as_str()),
        ("gpt2", "GPT2LMHeadModel")
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
        (64, 99, Some(64))
    );
    assert_eq!(info.position, "learned absolute");
    assert!(info.norm.contains("pre-norm"), "{}", info.norm);
    assert_eq!(info.ffn, "GELU (tanh approximation)");
    let special = m.special_tokens();
    assert_eq!(
        (special.eos.as_slice(), special.bos, special.pad),
        (&[2][..], Some(1), Some(0))
    );
}

#[test]
fn sequence_longer_than_n_positions_is_out_of_range() {
    let m = load_causal("gpt2");
    let n = m.info().max_positions.unwrap();
    let err = forward(&m, &TokenBatch::single(vec![5; n + 1]).unwrap()).unwrap_err();
    let msg = err.to_string();
    match err {
        Error::OutOfRange { index, size, .. } => assert_eq!((index, size), (n, n)),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    assert!(msg.contains("sequence longer"), "{msg}");

    // Exactly n positions fit, and the limit also holds across cached steps.
    let mut cache = m.new_cache(1);
    m.forward_cached(&TokenBatch::single(vec![5; n]).unwrap(), &mut cache)
        .unwrap();
    let err = m
        .forward_cached(&TokenBatch::single(vec![5]).unwrap(), &mut cache)
        .unwrap_err();
    assert!(
        matches!(err, Error::OutOfRange { index, .. } if index == n),
        "{err}"
    );

    // Padding takes no position: n real tokens after left padding, or followed by
    // right padding, still fit.
    for mask in [
        [vec![false], vec![true; n]].concat(),
        [vec![true; n], vec![false]].concat(),
    ] {
        let tokens = TokenBatch::new(vec![5; n + 1], Some(mask), 1, n + 1).unwrap();
        forward(&m, &tokens).unwrap();
    }
}

#[test]
fn token_id_past_vocabulary_is_out_of_range() {
    let m = load_causal("gpt2");
    let v = m.info().vocab;
    let err = forward(&m, &TokenBatch::single(vec![3, v, 4]).unwrap()).unwrap_err();
    match err {
        Error::OutOfRange { index, size, .. } => assert_eq!((index, size), (v, v)),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
}

/// A scratch copy of the `gpt2` fixture folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("qkv-gpt2-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["config.json", "generation_config.json", "model.safetensors"] {
            std::fs::copy(model_dir("gpt2").join(name), dir.join(name)).unwrap();
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

    /// Rewrites model.safetensors with every tensor renamed by `rename`, plus copies
    /// under the names `extra` gives (new name, existing name).
    fn rewrite_weights(&self, rename: impl Fn(&str) -> String, extra: &[(&str, &str)]) {
        let path = self.0.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut out: Vec<(String, safetensors::tensor::TensorView)> = st
            .tensors()
            .into_iter()
            .map(|(name, view)| (rename(&name), view))
            .collect();
        for (new, old) in extra {
            out.push((new.to_string(), st.tensor(old).unwrap()));
        }
        std::fs::write(&path, safetensors::tensor::serialize(out, None).unwrap()).unwrap();
    }

    fn causal(&self) -> Transformer {
        models::load(self.path()).unwrap().model
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn assert_matches_reference(m: &Transformer, what: &str) {
    let f = reference("gpt2");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let got = forward(m, &tokens).unwrap();
    assert_real_close(what, &got, &f.t("logits"), &tokens.mask);
}

/// `GPT2Model` checkpoints (OpenAI's original `gpt2` among them) name tensors without
/// `transformer.`; the LM head is then the tied embedding.
#[test]
fn base_model_layout_without_prefix_loads() {
    let s = Scratch::new("base");
    s.rewrite_weights(|n| n.trim_start_matches("transformer.").to_string(), &[]);
    s.edit_config(|c| c["architectures"] = serde_json::json!(["GPT2Model"]));
    let m = s.causal();
    assert_eq!(m.info().architecture, "GPT2Model");
    assert_matches_reference(&m, "GPT2Model layout logits");
}

/// With `tie_word_embeddings: false` the head is `lm_head.weight`; a copy of the
/// embeddings gives the tied model's logits.
#[test]
fn untied_head_reads_lm_head_weight() {
    let s = Scratch::new("untied");
    s.edit_config(|c| c["tie_word_embeddings"] = serde_json::json!(false));
    let err = models::load(s.path())
        .err()
        .expect("lm_head.weight is missing");
    assert!(err.to_string().contains("lm_head.weight"), "{err}");
    s.rewrite_weights(
        str::to_string,
        &[("lm_head.weight", "transformer.wte.weight")],
    );
    assert_matches_reference(&s.causal(), "untied head logits");
}

#[test]
fn bad_config_fields_are_named() {
    for (field, value) in [
        ("n_head", serde_json::json!(5)),
        ("activation_function", serde_json::json!("mish")),
        ("n_positions", serde_json::json!(0)),
    ] {
        let s = Scratch::new(field);
        s.edit_config(|c| c[field] = value);
        match models::load(s.path()).err().expect("bad config loaded") {
            Error::Config { field: f, .. } => assert_eq!(f, field),
            other => panic!("expected a config error naming `{field}`, got {other:?}"),
        }
    }
}
