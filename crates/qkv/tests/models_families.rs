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
//!
//! Phi-3: fused `qkv_proj` and `gate_up_proj`, RoPE on 6 of 8 dimensions, LongRoPE
//! switching to its long factors past `original_max_position_embeddings` (16) during
//! greedy generation.
//!
//! RoBERTa and XLM-RoBERTa: BERT's encoder with positions counted from
//! `padding_idx + 1`, so a padded row equals the row alone. DistilBERT: BERT's
//! encoder under its own names, without token types.

#![cfg(feature = "models")]

mod common;

use common::models::{batch, check_causal, load_causal, reference, EditedFixture};
use qkv::block::Residual;
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::Position;
use qkv::models::TokenBatch;

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

/// The batch and `generate`'s references stay within the 16 positions of pre-training
/// (short factors). Greedy decoding from a 14-token prompt crosses to the long factors:
/// qkv's generation then recomputes the sequence once, so every key rotates with the
/// long factors, and each later step equals a full no-cache forward by transformers.
#[test]
fn phi3_longrope_matches_hf_past_the_pretraining_length() {
    check_causal("phi3");
    let f = reference("phi3");
    let m = load_causal("phi3");
    assert!(matches!(
        m.arch.position,
        Position::Rope {
            scaling: qkv::position::RopeScaling::LongRope(_),
            rotary_dim: Some(6),
            ..
        }
    ));
    assert_eq!(m.long_rope_switch(), Some(16));
    let prompt = batch(&f, "long_prompt", None);
    let output = f.ints("long_gen_output").1;
    let want = f.t("long_gen_logits");
    let (steps, vocab) = (want.shape()[1], want.shape()[2]);
    let eos = m.special_tokens().eos.clone();
    let opts = GenerateOptions::new(steps, Sampling::Greedy, eos);
    let got = generate_causal(&m, &prompt, &opts).unwrap();
    let new: Vec<usize> = output[prompt.len..].iter().map(|&t| t as usize).collect();
    assert_eq!(got, vec![new], "phi3 greedy generation across the switch");

    // each step's logits, decoding as generation does: the cache is recomputed once,
    // when the new token is the first past position 15
    let mut cache = m.new_cache(1);
    let mut seen = prompt.clone();
    let mut input = prompt.clone();
    let mut switched = false;
    for step in 0..steps {
        if step > 0 {
            seen = seen.append(&input).unwrap();
        }
        if cache.len() == 16 {
            // without the recompute, keys rotated with the short factors stay
            let kept = m.forward_cached(&input, &mut cache.clone()).unwrap();
            let worst = kept.data()[..vocab]
                .iter()
                .zip(&want.data()[step * vocab..][..vocab])
                .fold(0.0f32, |w, (a, b)| w.max((a - b).abs()));
            assert!(worst > 1e-2, "the recompute changes nothing ({worst})");
            cache = m.new_cache(1);
            input = seen.clone();
            switched = true;
        }
        let got = m.forward_cached(&input, &mut cache).unwrap();
        let last = &got.data()[(input.len - 1) * vocab..][..vocab];
        common::assert_close(
            &format!("phi3 step {step} (position {})", prompt.len + step - 1),
            last,
            &want.data()[step * vocab..][..vocab],
            1e-4,
            1e-4,
        );
        let next = output[prompt.len + step] as usize;
        input = TokenBatch::new(vec![next], None, 1, 1).unwrap();
    }
    assert!(switched, "the steps cross the switch");
}

#[test]
fn roberta_xlm_roberta_and_distilbert_match_hf_with_padding() {
    for (name, family, offset) in [
        ("roberta", "roberta", 2),
        ("xlm_roberta", "xlm-roberta", 2),
        ("distilbert", "distilbert", 0),
    ] {
        let f = reference(name);
        let m = common::models::load_encoder(name);
        assert_eq!(m.family.name(), family);
        assert_eq!(
            m.arch.embed.position_offset, offset,
            "{name}: padding_idx + 1"
        );
        let tokens = batch(&f, "input_ids", Some("attention_mask"));
        let got = m.hidden_states(&tokens, None).unwrap();
        let want = f.t("last_hidden_state");
        common::models::assert_real_close(name, &got, &want, &tokens.mask);
        // row 1 alone (6 tokens, no padding) gives its states in the batch
        let (t, c) = (tokens.len, got.last_dim());
        let alone = TokenBatch::single(tokens.ids[t..t + 6].to_vec()).unwrap();
        let one = m.hidden_states(&alone, None).unwrap();
        common::assert_close(
            &format!("{name} row 1 alone"),
            one.data(),
            &got.data()[t * c..(t + 6) * c],
            1e-5,
            1e-5,
        );
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
