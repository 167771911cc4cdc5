//! The families added after the first eight, against their Hugging Face fixtures
//! (tools/fixtures/gen_models.py): forward with right and left padding, cached decoding,
//! greedy generation (one prompt and a left-padded batch), and config edge cases.
//! (Qwen3 is a Llama-layout family and lives in `models_llama.rs`.)
//!
//! GPT-NeoX: RoPE over the first 4 of each head's 10 dimensions, the fused per-head
//! QKV, and both residual kinds: parallel (`gpt_neox`) and sequential
//! (`gpt_neox_seq`, with a tied head).

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
