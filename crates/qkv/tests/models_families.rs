//! The families added after the first eight, against their Hugging Face fixtures
//! (tools/fixtures/gen_models.py): forward with right and left padding, cached decoding,
//! greedy generation (one prompt and a left-padded batch), and config edge cases.
//! (Qwen3 is a Llama-layout family and lives in `models_llama.rs`.)
//!
//! GPT-NeoX: RoPE over the first 4 of each head's 10 dimensions, the fused per-head
//! QKV, and both residual kinds: parallel (`gpt_neox`) and sequential
//! (`gpt_neox_seq`, with a tied head).
//!
//! Gemma 2 and 3: √C embeddings, 1 + w RMSNorm, a norm before and after each
//! sub-layer, GeGLU, `query_pre_attn_scalar`, alternating local and global layers;
//! Gemma 2's soft caps on scores and logits; Gemma 3's q/k norms and its local RoPE
//! base beside a scaled global one.

#![cfg(feature = "models")]

mod common;

use common::models::{check_causal, load_causal, EditedFixture};
use qkv::block::Residual;
use qkv::models::Position;

#[test]
fn gpt_neox_parallel_residual_and_partial_rotary_match_hf() {
    check_causal("gpt_neox");
    let m = load_causal("gpt_neox");
    assert_eq!(m.family.name(), "gpt_neox");
    assert_eq!(m.arch.residual, Residual::Parallel);
    assert!(matches!(
        m.arch.position,
        Position::Rope {
            rotary_dim: Some(4),
            ..
        }
    ));
    assert!(!m.arch.head.tied());
}

#[test]
fn gpt_neox_sequential_residual_with_a_tied_head_matches_hf() {
    check_causal("gpt_neox_seq");
    let m = load_causal("gpt_neox_seq");
    assert_eq!(m.arch.residual, Residual::PreNorm);
    assert!(m.arch.head.tied());
}

#[test]
fn gemma2_soft_caps_sandwich_norms_and_alternating_windows_match_hf() {
    check_causal("gemma2");
    let m = load_causal("gemma2");
    assert_eq!(m.family.name(), "gemma2");
    let a = &m.arch.attention;
    assert_eq!((a.softcap, m.arch.logit_softcap), (Some(2.0), Some(3.0)));
    assert_eq!(a.local_layers, Some(vec![true, false]));
    assert_eq!(m.arch.residual, Residual::Sandwich);
    assert!(m.arch.norm.unit_offset && m.arch.embed.scale);
}

#[test]
fn gemma3_q_k_norms_and_local_rope_base_match_hf() {
    check_causal("gemma3");
    let m = load_causal("gemma3");
    assert_eq!(m.family.name(), "gemma3_text");
    let a = &m.arch.attention;
    assert!(a.qk_norm);
    assert_eq!(a.local_rope_theta, Some(10_000.0));
    assert_eq!(a.softcap, None);
}

/// Gemma's config errors name their field; EmbeddingGemma's bidirectional attention
/// is refused by name.
#[test]
fn gemma_configs_that_cannot_run_name_the_field() {
    let cases: [(&str, &str, serde_json::Value); 4] = [
        ("gemma2", "attn_logit_softcapping", serde_json::json!(0.0)),
        (
            "gemma2",
            "layer_types",
            serde_json::json!(["sliding_attention"]),
        ),
        ("gemma3", "rope_local_base_freq", serde_json::json!(-1.0)),
        (
            "gemma3",
            "use_bidirectional_attention",
            serde_json::json!(true),
        ),
    ];
    for (name, field, value) in cases {
        let dir = EditedFixture::new(name, |cfg| cfg[field] = value.clone());
        let err = qkv::models::load(dir.path()).err().expect("refused");
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
}

/// A share of the head that rotates an odd number of dimensions (or none) is refused
/// naming the field.
#[test]
fn gpt_neox_refuses_a_rotary_share_that_rotates_no_pairs() {
    for (pct, name) in [(0.3, "odd"), (0.0, "none"), (1.5, "over")] {
        let dir = EditedFixture::new("gpt_neox", |cfg| {
            cfg["partial_rotary_factor"] = serde_json::json!(pct);
        });
        let err = qkv::models::load(dir.path()).err().expect("refused");
        assert!(
            err.to_string().contains("partial_rotary_factor"),
            "{name}: {err}"
        );
    }
}
