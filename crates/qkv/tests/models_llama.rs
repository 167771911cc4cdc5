//! Llama and Mistral against their Hugging Face fixtures (tools/fixtures/gen_models.py):
//! GQA, MQA with tied embeddings and linear RoPE scaling, bf16 and f16 checkpoints, the
//! transformers 5.x config layout, Mistral's sliding window, the llama3 / YaRN / dynamic
//! RoPE scalings, a SmolLM-style tied model with wide heads, and Qwen2 (Q/K/V biases, a
//! window on its upper layers) and Qwen3 (per-head q/k norms). Config edge cases run on
//! temporary copies of a fixture folder with an edited config.json.

#![cfg(feature = "models")]

mod common;

use common::models::{
    assert_real_close, batch, check_causal, load_causal, reference, EditedFixture,
};
use qkv::models::{self, TokenBatch};
use qkv::Error;

#[test]
fn llama_gqa_matches_hf() {
    check_causal("llama_gqa");
}

#[test]
fn llama_mqa_tied_linear_rope_matches_hf() {
    check_causal("llama_mqa_tied");
}

#[test]
fn llama_bf16_checkpoint_matches_hf() {
    check_causal("llama_bf16");
}

#[test]
fn llama_f16_checkpoint_matches_hf() {
    check_causal("llama_f16");
}

#[test]
fn llama_transformers_v5_config_matches_hf() {
    check_causal("llama_v5");
}

#[test]
fn mistral_sliding_window_matches_hf() {
    check_causal("mistral");
}

#[test]
fn llama3_rope_scaling_matches_hf() {
    check_causal("llama3_rope");
}

#[test]
fn yarn_rope_scaling_matches_hf() {
    check_causal("llama_yarn");
}

/// Dynamic NTK scaling acts only past `max_position_embeddings` (10 here). The forward
/// fixtures stay within it; greedy generation from a 5-token prompt crosses it, and each
/// step's logits must equal transformers' cached `generate` (whose earlier keys keep
/// the table of their own step, as qkv's cache does).
#[test]
fn dynamic_rope_scaling_matches_hf_past_the_trained_length() {
    check_causal("llama_dynamic");
    common::models::check_generation_steps(
        "llama_dynamic",
        &reference("llama_dynamic"),
        &load_causal("llama_dynamic"),
    );
}

#[test]
fn smollm_style_tied_llama_with_wide_heads_matches_hf() {
    check_causal("smollm_tied");
    let m = load_causal("smollm_tied");
    let i = m.info();
    assert_eq!((i.hidden, i.heads, i.head_dim), (32, 4, 12));
}

#[test]
fn qwen2_matches_hf() {
    check_causal("qwen2");
}

#[test]
fn qwen2_window_on_upper_layers_matches_hf() {
    check_causal("qwen2_window");
}

/// Per-head q/k norms before RoPE, heads of 10 over a width of 36, a window on the
/// upper layer only (`layer_types`), a tied head.
#[test]
fn qwen3_matches_hf() {
    check_causal("qwen3");
    let m = load_causal("qwen3");
    let i = m.info();
    assert_eq!((i.hidden, i.heads, i.head_dim), (36, 4, 10));
    assert_eq!(m.family.name(), "qwen3");
}

#[test]
fn info_describes_each_variant() {
    let gqa = load_causal("llama_gqa");
    let i = gqa.info();
    assert_eq!(
        (
            i.family.as_str(),
            i.layers,
            i.hidden,
            i.heads,
            i.kv_heads,
            i.head_dim
        ),
        ("llama", 2, 32, 4, 2, 8)
    );
    assert_eq!((i.ffn_dim, i.vocab, i.max_positions), (64, 99, Some(64)));
    assert_eq!(i.ffn, "SwiGLU");
    assert_eq!(gqa.special_tokens().eos, vec![2]);
    assert_eq!(gqa.special_tokens().bos, Some(1));
    assert_eq!(gqa.special_tokens().pad, Some(0));

    let mqa = load_causal("llama_mqa_tied");
    assert_eq!(mqa.info().kv_heads, 1);
    assert!(
        mqa.info().position.contains("linear scaling ×2"),
        "{}",
        mqa.info().position
    );

    let v5 = load_causal("llama_v5");
    let pos = &v5.info().position;
    assert!(pos.contains("θ=20000") && pos.contains("×3"), "{pos}");

    let mistral = load_causal("mistral");
    assert_eq!(mistral.info().family, "mistral");
    assert_eq!(mistral.info().head_dim, 8, "head_dim null → hidden / heads");
    assert!(mistral.info().position.contains("sliding window 4"));
}

fn load_error(dir: &EditedFixture) -> Error {
    match models::load(dir.path()) {
        Ok(_) => panic!("{} loaded but should not have", dir.path().display()),
        Err(e) => e,
    }
}

#[test]
fn unknown_rope_scaling_type_is_unsupported_and_named() {
    let v4 = EditedFixture::new("llama_gqa", |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "ntk_by_parts", "factor": 4.0});
    });
    let err = load_error(&v4);
    let msg = err.to_string();
    assert!(matches!(err, Error::Unsupported(_)), "{msg}");
    assert!(
        msg.contains("`ntk_by_parts`") && msg.contains("rope_scaling"),
        "{msg}"
    );

    let v5 = EditedFixture::new("llama_v5", |c| {
        c["rope_parameters"]["rope_type"] = "su".into();
    });
    let err = load_error(&v5);
    let msg = err.to_string();
    assert!(matches!(err, Error::Unsupported(_)), "{msg}");
    assert!(
        msg.contains("`su`") && msg.contains("rope_parameters"),
        "{msg}"
    );
}

#[test]
fn incomplete_or_bad_scaling_parameters_name_the_field() {
    let cases = [
        (
            serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 64}),
            "rope_scaling.high_freq_factor",
        ),
        (
            serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                               "high_freq_factor": 1.0, "original_max_position_embeddings": 64}),
            "rope_scaling.high_freq_factor",
        ),
        (
            serde_json::json!({"rope_type": "yarn", "factor": -2.0}),
            "rope_scaling.factor",
        ),
        (
            serde_json::json!({"rope_type": "dynamic"}),
            "rope_scaling.factor",
        ),
        (
            serde_json::json!({"rope_type": "longrope", "long_factor": [1.0, 1.0, 1.0, 1.0]}),
            "rope_scaling.short_factor",
        ),
        // heads of 8 rotate 4 pairs
        (
            serde_json::json!({"rope_type": "longrope", "short_factor": [1.0, 1.0, 1.0],
                               "long_factor": [1.0, 1.0, 1.0, 1.0]}),
            "rope_scaling.short_factor",
        ),
        (
            serde_json::json!({"rope_type": "longrope", "short_factor": [1.0, 1.0, 1.0, 0.0],
                               "long_factor": [1.0, 1.0, 1.0, 1.0]}),
            "rope_scaling.short_factor[3]",
        ),
        // a ramp that runs backwards (transformers warns and runs it)
        (
            serde_json::json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 1.0,
                               "beta_slow": 32.0}),
            "rope_scaling.beta_fast",
        ),
    ];
    for (scaling, field) in cases {
        let dir = EditedFixture::new("llama_gqa", |c| c["rope_scaling"] = scaling.clone());
        let msg = load_error(&dir).to_string();
        assert!(
            msg.contains(field) && msg.contains("config.json"),
            "{scaling}: {msg}"
        );
    }
}

#[test]
fn legacy_rope_scaling_type_key_is_read() {
    // Older 4.x configs name the kind `type`, often next to `rope_type`.
    for scaling in [
        serde_json::json!({"type": "linear", "factor": 2.0}),
        serde_json::json!({"type": "linear", "rope_type": "linear", "factor": 2.0}),
    ] {
        let dir = EditedFixture::new("llama_mqa_tied", |c| c["rope_scaling"] = scaling);
        let m = dir.load_causal();
        let f = reference("llama_mqa_tied");
        let tokens = batch(&f, "input_ids", Some("attention_mask"));
        let got = m
            .forward_cached(&tokens, &mut m.new_cache(tokens.batch))
            .unwrap();
        assert_real_close("legacy rope_scaling", &got, &f.t("logits"), &tokens.mask);
    }
}

#[test]
fn linear_scaling_without_factor_names_the_field() {
    let dir = EditedFixture::new("llama_v5", |c| {
        c["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("factor");
    });
    let msg = load_error(&dir).to_string();
    assert!(msg.contains("rope_parameters.factor"), "{msg}");
}

#[test]
fn bad_head_counts_name_the_field() {
    let dir = EditedFixture::new("llama_gqa", |c| c["num_key_value_heads"] = 3.into());
    let msg = load_error(&dir).to_string();
    assert!(msg.contains("num_key_value_heads"), "{msg}");

    let dir = EditedFixture::new("mistral", |c| {
        c["num_attention_heads"] = 5.into();
        c["num_key_value_heads"] = 5.into();
    });
    let msg = load_error(&dir).to_string();
    assert!(msg.contains("hidden_size") && msg.contains("5"), "{msg}");
}

#[test]
fn eos_falls_back_to_generation_config() {
    let dir = EditedFixture::new("llama_gqa", |c| {
        c.as_object_mut().unwrap().remove("eos_token_id");
    });
    assert_eq!(dir.load_causal().special_tokens().eos, vec![2]);

    let dir = EditedFixture::new("llama_gqa", |c| {
        c["eos_token_id"] = serde_json::json!([2, 7]);
        c["pad_token_id"] = (-1).into();
    });
    let m = dir.load_causal();
    assert_eq!(m.special_tokens().eos, vec![2, 7]);
    assert_eq!(m.special_tokens().pad, None, "a negative id means none");
}

#[test]
fn longer_than_max_position_embeddings_runs() {
    // RoPE has no table to run off: like transformers, qkv only reports the trained
    // length (64 here) and does not refuse longer inputs.
    let m = load_causal("llama_gqa");
    let tokens = TokenBatch::single((0..70).map(|i| 3 + i % 90).collect()).unwrap();
    let logits = m.forward_cached(&tokens, &mut m.new_cache(1)).unwrap();
    assert_eq!(logits.shape(), &[1, 70, 99]);
    assert!(logits.data().iter().all(|x| x.is_finite()));
}

#[test]
fn token_ids_outside_the_vocabulary_are_rejected() {
    let m = load_causal("mistral");
    let tokens = TokenBatch::single(vec![5, 99]).unwrap();
    let err = m.forward_cached(&tokens, &mut m.new_cache(1)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                index: 99,
                size: 99,
                ..
            }
        ),
        "{err}"
    );
}
