//! Every model family as transformers 5.x saves it (issue 47): the twins
//! `tests/fixtures/models_v5/<name>/` of the 4.57 folders `models/<name>/`, written by
//! `tools/fixtures/gen_v5.py` under transformers 5.24.0.
//!
//! A twin holds the `config.json` (and `generation_config.json`, when 5.x writes one)
//! that 5.x's `save_pretrained` wrote after loading the 4.57 folder, and a
//! `reference.safetensors` with the 4.57 reference's inputs and tensor names, every
//! output recomputed by 5.x from that folder reloaded by `from_pretrained`. 5.x saves
//! the 4.57 weights bit for bit, so a twin stores none: its params' `weights_from`
//! names the 4.57 folder, and [`Twin`] assembles the 5.x config files and those weights
//! in a fresh temporary folder, the folder 5.x wrote, which qkv loads like any other.
//!
//! Each test runs the checks its 4.57 fixture gets (tests/common/models.rs, tolerance
//! atol 1e-4 + rtol 1e-3 on logits and states, 1e-5 + 1e-4 on attention weights):
//!
//! - decoders (`check_causal_against`): logits with right and left padding at real
//!   positions, the prefill and cached decoding against the full forward, greedy
//!   generation of one prompt and of a left-padded batch equal to `generate()`'s tokens;
//!   Llama's dynamic RoPE also each generation step's logits, Phi-3's LongRoPE the
//!   decoding across its switch (`long_*`);
//! - encoders (`check_encoder_against`): `last_hidden_state` at real positions (BERT
//!   with its token types), every row alone equal to its padded self;
//! - encoder-decoders (`check_seq2seq_against`): logits, cached decoding, greedy
//!   generation;
//! - every layer's attention weights where the reference has them (`attentions.*`, or
//!   the encoder, decoder and cross-attention maps), at real query rows;
//! - the kind of model (decoder, encoder, both) and the family qkv reads the 5.x config
//!   as, against the fixture's.
//!
//! A missing twin, or one without weights, fails with the command that writes it. No
//! twin for `gpt2_sharded`, `llama_bf16` and `llama_f16`: their configs are those of
//! `gpt2` and `llama_gqa`, and what they add (shards, half-precision storage) is about
//! weights, not configs (gen_v5.py's SKIP). Training on the twins of `train_model/`:
//! train_model_v5.rs. The sequence classifiers of `classify/` (their heads' logits):
//! `classify_v5/`, at the end of this file.

#![cfg(feature = "models")]

mod common;

use common::models::{
    assert_real_close, batch, check_attentions_against, check_causal_against,
    check_causal_generation, check_encoder_against, check_generation_steps, check_long_rope,
    check_seq2seq_against, has_attentions, Twin,
};
use qkv::models::{Input, ModelKind, Transformer};

/// Loads the twin of `models/<name>` and runs every check its reference allows; returns
/// the twin and the model for more.
fn check(name: &str) -> (Twin, Transformer) {
    let twin = Twin::model(name);
    let f = &twin.reference;
    let label = twin.label.clone();
    let kind = if f.has("last_hidden_state") {
        ModelKind::Encoder
    } else if f.has("decoder_input_ids") {
        ModelKind::EncoderDecoder
    } else {
        ModelKind::Decoder
    };
    let m = twin.load();
    assert_eq!(m.kind(), kind, "{label}: kind of model");
    let family = f.param_str("family").expect("params family");
    assert_eq!(m.family.name(), family, "{label}: family");
    match kind {
        ModelKind::Decoder if !f.has("left_input_ids") => {
            // a reference with the batch's logits and one generation only (the probe
            // GPT-2 of gen_conformance.py)
            let tokens = batch(f, "input_ids", Some("attention_mask"));
            let got = m
                .forward_cached(&tokens, &mut m.new_cache(tokens.batch))
                .unwrap();
            assert_real_close(
                &format!("{label} logits"),
                &got,
                &f.t("logits"),
                &tokens.mask,
            );
            check_causal_generation(&label, f, &m);
        }
        ModelKind::Decoder => check_causal_against(&label, f, &m),
        ModelKind::Encoder => {
            check_encoder_against(&label, f, &m);
            if f.has("logits") {
                // an encoder with its masked-LM head: the head's logits at real positions
                let tokens = batch(f, "input_ids", Some("attention_mask"));
                let input = Input {
                    source: Some(&tokens),
                    ..Default::default()
                };
                let got = m.forward(&input, false).unwrap().logits;
                assert_real_close(
                    &format!("{label} logits"),
                    &got,
                    &f.t("logits"),
                    &tokens.mask,
                );
            }
        }
        ModelKind::EncoderDecoder => check_seq2seq_against(&label, f, &m),
    }
    if has_attentions(f) {
        check_attentions_against(&label, f, &m);
    }
    (twin, m)
}

#[test]
fn gpt2_v5() {
    check("gpt2");
}

#[test]
fn llama_gqa_v5() {
    check("llama_gqa");
}

#[test]
fn llama_mqa_tied_linear_rope_v5() {
    check("llama_mqa_tied");
}

#[test]
fn llama_v5_resaved_by_v5() {
    check("llama_v5");
}

#[test]
fn llama3_rope_v5() {
    check("llama3_rope");
}

#[test]
fn llama_yarn_v5() {
    check("llama_yarn");
}

#[test]
fn llama_dynamic_rope_v5() {
    let (twin, m) = check("llama_dynamic");
    check_generation_steps(&twin.label, &twin.reference, &m);
}

#[test]
fn smollm_tied_v5() {
    check("smollm_tied");
}

#[test]
fn mistral_v5() {
    check("mistral");
}

#[test]
fn qwen2_v5() {
    check("qwen2");
}

#[test]
fn qwen2_window_v5() {
    check("qwen2_window");
}

#[test]
fn qwen3_v5() {
    check("qwen3");
}

#[test]
fn gpt_neox_v5() {
    check("gpt_neox");
}

#[test]
fn gpt_neox_seq_v5() {
    check("gpt_neox_seq");
}

#[test]
fn gemma2_v5() {
    check("gemma2");
}

#[test]
fn gemma3_v5() {
    check("gemma3");
}

#[test]
fn phi3_longrope_v5() {
    let (twin, m) = check("phi3");
    check_long_rope(&twin.label, &twin.reference, &m, 16);
}

#[test]
fn bloom_v5() {
    check("bloom");
}

#[test]
fn bert_v5() {
    check("bert");
}

#[test]
fn roberta_v5() {
    check("roberta");
}

#[test]
fn xlm_roberta_v5() {
    check("xlm_roberta");
}

#[test]
fn distilbert_v5() {
    check("distilbert");
}

#[test]
fn modernbert_v5() {
    check("modernbert");
}

#[test]
fn marian_v5() {
    check("marian");
}

#[test]
fn t5_v5() {
    check("t5");
}

#[test]
fn t5_gated_v5() {
    check("t5_gated");
}

#[test]
fn t5_v5_untied_resaved_by_v5() {
    check("t5_v5_untied");
}

/// The twins with a test of their own above.
const TESTED: [&str; 27] = [
    "gpt2",
    "llama_gqa",
    "llama_mqa_tied",
    "llama_v5",
    "llama3_rope",
    "llama_yarn",
    "llama_dynamic",
    "smollm_tied",
    "mistral",
    "qwen2",
    "qwen2_window",
    "qwen3",
    "gpt_neox",
    "gpt_neox_seq",
    "gemma2",
    "gemma3",
    "phi3",
    "bloom",
    "bert",
    "roberta",
    "xlm_roberta",
    "distilbert",
    "modernbert",
    "marian",
    "t5",
    "t5_gated",
    "t5_v5_untied",
];
/// Folders gen_v5.py gives no twin (its SKIP, with the reasons).
const SKIPPED: [&str; 3] = ["gpt2_sharded", "llama_bf16", "llama_f16"];

/// Every 4.57 folder under `models/` has a twin (or is one the generator skips), and the
/// twins of folders added after this file (without a test above) match their
/// references too.
#[test]
fn every_model_folder_has_a_checked_twin() {
    let root = common::models::fixtures_dir("models");
    let (mut missing, mut folders) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(&root).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let twin = common::models::fixtures_dir(&format!("models_v5/{name}"));
        if SKIPPED.contains(&name.as_str()) {
            assert!(!twin.exists(), "{name} is skipped but has a twin");
        } else if !twin.join("reference.safetensors").is_file() {
            missing.push(name.clone());
        }
        folders.push(name);
    }
    assert!(
        missing.is_empty(),
        "models/ folders without a transformers-5 twin: {missing:?} \
         (run `.venv-ref5/bin/python tools/fixtures/gen_v5.py {}`)",
        missing.join(" ")
    );
    for name in TESTED.iter().chain(&SKIPPED) {
        assert!(folders.iter().any(|f| f == name), "no models/{name}");
    }
    let others = folders
        .iter()
        .filter(|f| !TESTED.contains(&f.as_str()) && !SKIPPED.contains(&f.as_str()));
    for name in others {
        eprintln!("models_v5/{name}: checked (no test of its own)");
        check(name);
    }
}

/// Every `…ForSequenceClassification` folder of `classify/`, as 5.x saves it: the
/// head's logits on the 4.57 reference's ids (with BERT's token types).
#[test]
fn sequence_classifiers_equal_transformers_5() {
    let root = common::models::fixtures_dir("classify");
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let twin = Twin::classifier(&name);
        let m = qkv::models::SequenceClassifier::load(twin.path(), qkv::weights::DType::F32)
            .unwrap_or_else(|e| panic!("{}: {e}", twin.label));
        let f = &twin.reference;
        let tokens = common::models::batch(f, "input_ids", Some("attention_mask"));
        let types: Option<Vec<usize>> = f.has("token_type_ids").then(|| {
            f.ints("token_type_ids")
                .1
                .iter()
                .map(|&t| t as usize)
                .collect()
        });
        let logits = m.logits(&tokens, types.as_deref()).unwrap();
        common::assert_close(
            &format!("{} logits", twin.label),
            logits.data(),
            f.t("logits").data(),
            1e-5,
            1e-4,
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} classifier twins");
}
