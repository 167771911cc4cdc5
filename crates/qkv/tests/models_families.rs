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
//! encoder under its own names, without token types. ModernBERT: a pre-norm encoder
//! with RoPE whose middle layer is local (|i − j| ≤ 2 of 9 positions, its own RoPE
//! base), GeGLU, no biases, and no attention norm in the first layer.
//!
//! Sequence classification (`tools/fixtures/gen_classify.py`): BERT's pooler head as a
//! one-output cross-encoder on text pairs (logits, `CrossEncoder.predict`, the
//! pipeline's scores), DistilBERT's `pre_classifier` on texts, XLM-R's
//! `classifier.dense`/`out_proj` on padded ids.

#![cfg(feature = "models")]

mod common;

use common::models::{batch, check_causal, load_causal, reference, EditedFixture};
use qkv::block::Residual;
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
    common::models::check_long_rope("phi3", &f, &m, 16);
}

#[test]
fn roberta_xlm_roberta_distilbert_and_modernbert_match_hf_with_padding() {
    for (name, family, offset) in [
        ("roberta", "roberta", 2),
        ("xlm_roberta", "xlm-roberta", 2),
        ("distilbert", "distilbert", 0),
        ("modernbert", "modernbert", 0),
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

/// ModernBERT's local layer: its window and its RoPE base each change the states (so the
/// fixture checks both), and a config whose local layers see no key is refused.
#[test]
fn modernbert_local_layers_matter_and_bad_windows_are_refused() {
    let f = reference("modernbert");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let want = f.t("last_hidden_state");
    let differs = |edit: fn(&mut serde_json::Value)| {
        let dir = EditedFixture::new("modernbert", edit);
        let m = qkv::models::load(dir.path()).unwrap().model;
        let got = m.hidden_states(&tokens, None).unwrap();
        common::tensors::max_abs_diff(got.data(), want.data())
    };
    assert!(differs(|c| c["local_attention"] = serde_json::json!(64)) > 1e-3);
    assert!(differs(|c| c["local_rope_theta"] = serde_json::json!(160000.0)) > 1e-3);
    let dir = EditedFixture::new("modernbert", |c| {
        c["local_attention"] = serde_json::json!(1)
    });
    let err = qkv::models::load(dir.path())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("local_attention"), "{err}");
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

/// A classification fixture's folder and reference.
fn classifier(name: &str) -> (qkv::models::SequenceClassifier, common::Fixture) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/classify")
        .join(name);
    let m = qkv::models::SequenceClassifier::load(&dir, qkv::weights::DType::F32)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    (m, common::fixture("classify", &format!("{name}/reference")))
}

fn strings(f: &common::Fixture, key: &str) -> Vec<String> {
    serde_json::from_value(f.params[key].clone()).expect("a list of strings")
}

#[test]
fn bert_cross_encoder_scores_pairs_as_sentence_transformers() {
    let (m, f) = classifier("bert_reranker");
    let (queries, docs) = (strings(&f, "queries"), strings(&f, "docs"));
    assert_eq!(m.max_len(), 16);
    assert_eq!(m.labels(), ["LABEL_0"]);
    // the tokenizer's pairs, cut longest first, and their segments
    let pairs: Vec<(&str, Option<&str>)> = queries
        .iter()
        .zip(&docs)
        .map(|(q, d)| (q.as_str(), Some(d.as_str())))
        .collect();
    let logits = m.classify(&pairs).unwrap();
    let want = f.t("logits");
    let got: Vec<f32> = logits.concat();
    common::assert_close("bert_reranker logits", &got, want.data(), 1e-5, 0.0);
    let scores: Vec<f32> = logits.iter().flat_map(|l| m.scoring().apply(l)).collect();
    common::assert_close(
        "bert_reranker pipeline scores",
        &scores,
        f.t("pipeline_scores").data(),
        1e-6,
        0.0,
    );
    // one query against each document: the first pair's query stands for all three
    for (i, q) in queries.iter().enumerate() {
        let ranked = m.rerank(q, &[docs[i].as_str()]).unwrap();
        common::assert_close(
            "bert_reranker CrossEncoder.predict",
            &ranked,
            &f.t("cross_encoder_scores").data()[i..i + 1],
            1e-6,
            0.0,
        );
    }
    // the ids the tokenizer gave transformers, fed as ids
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let types: Vec<usize> = f
        .ints("token_type_ids")
        .1
        .iter()
        .map(|&t| t as usize)
        .collect();
    assert!(types.contains(&1), "the fixture has second segments");
    let from_ids = m.logits(&tokens, Some(&types)).unwrap();
    common::assert_close(
        "bert_reranker logits from ids",
        from_ids.data(),
        want.data(),
        1e-5,
        0.0,
    );
}

#[test]
fn distilbert_classifier_scores_texts_as_the_pipeline() {
    let (m, f) = classifier("distilbert_sst");
    assert_eq!(m.labels(), strings(&f, "labels"));
    assert_eq!(m.scoring(), qkv::models::Scoring::Softmax);
    let texts = strings(&f, "texts");
    let inputs: Vec<(&str, Option<&str>)> = texts.iter().map(|t| (t.as_str(), None)).collect();
    let logits = m.classify(&inputs).unwrap();
    common::assert_close(
        "distilbert_sst logits",
        &logits.concat(),
        f.t("logits").data(),
        1e-5,
        0.0,
    );
    let scores: Vec<f32> = logits.iter().flat_map(|l| m.scoring().apply(l)).collect();
    common::assert_close(
        "distilbert_sst scores",
        &scores,
        f.t("pipeline_scores").data(),
        1e-6,
        0.0,
    );
    let err = m.rerank("a", &["b"]).unwrap_err().to_string();
    assert!(
        err.contains("one output") && err.contains("POSITIVE"),
        "{err}"
    );
}

#[test]
fn xlm_roberta_classifier_matches_on_padded_ids() {
    let (m, f) = classifier("xlm_roberta_nli");
    assert_eq!(m.labels(), strings(&f, "labels"));
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let logits = m.logits(&tokens, None).unwrap();
    common::assert_close(
        "xlm_roberta_nli logits",
        logits.data(),
        f.t("logits").data(),
        1e-5,
        0.0,
    );
    let scores: Vec<f32> = logits
        .data()
        .chunks(3)
        .flat_map(|l| m.scoring().apply(l))
        .collect();
    common::assert_close(
        "xlm_roberta_nli softmax",
        &scores,
        f.t("softmax").data(),
        1e-6,
        0.0,
    );
    // left padding would hand the head a pad token
    let left = qkv::models::TokenBatch::left_padded(&[vec![0, 5, 6], vec![0, 7]], 1).unwrap();
    let err = m.logits(&left, None).unwrap_err().to_string();
    assert!(err.contains("row 1 starts with padding"), "{err}");
}

#[test]
fn a_folder_without_a_classification_head_is_refused_by_name() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
    let err = |name: &str| match qkv::models::SequenceClassifier::load(
        &dir.join(name),
        qkv::weights::DType::F32,
    ) {
        Ok(_) => panic!("{name}: loaded as a classifier"),
        Err(e) => e.to_string(),
    };
    let base = err("roberta");
    assert!(
        base.contains("`classifier.dense.weight` not found"),
        "{base}"
    );
    let decoder = err("gpt2");
    assert!(
        decoder.contains("no sequence-classification head"),
        "{decoder}"
    );
}

/// sentence-transformers folders (`tools/fixtures/gen_sentence.py`, written by
/// sentence-transformers 5.7.0 in its current layout) embed as `SentenceTransformer.encode`.
#[test]
fn sentence_transformers_folders_on_the_new_encoders_embed_as_encode() {
    for name in ["xlm_roberta_mean", "modernbert_cls"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sentence")
            .join(name);
        let f = common::fixture("sentence", &format!("{name}/reference"));
        let texts = strings(&f, "texts");
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let encoder = qkv::models::sentence::SentenceEncoder::load(&dir)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            encoder.max_seq_length(),
            f.param_usize("max_seq_length").unwrap()
        );
        let got = encoder.embed(&refs).unwrap().concat();
        common::assert_close(name, &got, f.t("embeddings").data(), 1e-5, 0.0);
    }
}
