//! T5 (`T5ForConditionalGeneration`) against its Hugging Face fixtures
//! (tools/fixtures/gen_models.py): `t5` (ReLU FFN, tied head) and `t5_gated` (gated-GELU
//! FFN, separate `lm_head`). Logits with a right-padded source, cached decoding, greedy
//! generation; and the errors a user can cause.

#![cfg(feature = "models")]

mod common;

use common::models::{check_seq2seq, load_seq2seq, model_dir};
use qkv::models::TokenBatch;
use qkv::Error;

#[test]
fn t5_matches_hugging_face() {
    check_seq2seq("t5");
}

#[test]
fn t5_gated_matches_hugging_face() {
    check_seq2seq("t5_gated");
}

#[test]
fn t5_info_and_special_tokens() {
    let m = load_seq2seq("t5_gated");
    let info = m.info();
    assert_eq!(info.family, "t5");
    assert_eq!((info.layers, info.decoder_layers), (2, Some(2)));
    assert_eq!(
        (info.hidden, info.heads, info.head_dim, info.ffn_dim),
        (32, 4, 8, 64)
    );
    assert_eq!((info.vocab, info.max_positions), (99, None));
    assert_eq!(info.ffn, "gated GELU (tanh approximation)");
    assert_eq!(load_seq2seq("t5").info().ffn, "ReLU");
    let special = m.special_tokens();
    assert_eq!(special.eos, vec![1]);
    assert_eq!((special.pad, special.decoder_start), (Some(0), Some(0)));
}

#[test]
fn t5_folder_without_tokenizer_points_at_input_ids() {
    let err = match qkv::text::Tokenizer::from_dir(&model_dir("t5")) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("the t5 fixture has no tokenizer.json"),
    };
    assert!(err.contains("tokenizer.json"), "{err}");
    assert!(err.contains("--input-ids"), "{err}");
}

#[test]
fn t5_token_id_outside_vocabulary_is_an_error() {
    let m = load_seq2seq("t5");
    match m.encode(&TokenBatch::single(vec![5, 99, 1]).unwrap()) {
        Err(Error::OutOfRange {
            index: 99,
            size: 99,
            ..
        }) => {}
        other => panic!("expected an out-of-range token id, got {other:?}"),
    }
    let enc = m
        .encode(&TokenBatch::single(vec![5, 7, 1]).unwrap())
        .unwrap();
    let tgt = TokenBatch::single(vec![0, 123]).unwrap();
    match m.decode_cached(&tgt, &enc, &mut m.new_cache(1)) {
        Err(Error::OutOfRange {
            index: 123,
            size: 99,
            ..
        }) => {}
        other => panic!(
            "expected an out-of-range token id, got {:?}",
            other.map(|_| ())
        ),
    }
}

#[test]
fn t5_has_no_position_limit() {
    // Relative buckets saturate beyond max_distance instead of running out.
    let m = load_seq2seq("t5");
    let src = TokenBatch::single((0..200).map(|i| 2 + i % 97).collect()).unwrap();
    let enc = m.encode(&src).unwrap();
    let tgt = TokenBatch::single(vec![0, 5, 6]).unwrap();
    let logits = m.decode_cached(&tgt, &enc, &mut m.new_cache(1)).unwrap();
    assert_eq!(logits.shape(), &[1, 3, 99]);
    assert!(logits.data().iter().all(|x| x.is_finite()));
}

/// A copy of the `t5` fixture folder whose config.json has `field` set to `value`.
fn with_config(field: &str, value: serde_json::Value) -> std::path::PathBuf {
    let src = model_dir("t5");
    let dir = std::env::temp_dir().join(format!("qkv-t5-{field}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg[field] = value;
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn t5_bad_config_names_the_field() {
    for (field, value) in [
        ("dense_act_fn", serde_json::json!("mish")),
        ("feed_forward_proj", serde_json::json!("gated-relu-x")),
        ("relative_attention_num_buckets", serde_json::json!(1)),
    ] {
        let dir = with_config(field, value);
        let err = qkv::models::load(&dir).err().expect("config is invalid");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            matches!(&err, Error::Config { field: f, .. } if f == field),
            "{err:?}"
        );
        assert!(err.to_string().contains(field), "{err}");
    }
}

/// A folder transformers 5 wrote: `scale_decoder_outputs: false` beside
/// `tie_word_embeddings: true`, and an `lm_head.weight` that differs from
/// `shared.weight`. transformers 5 keeps the separate head and does not rescale; the
/// logits, cached decoding and greedy generation are those transformers 5 computed.
#[test]
fn t5_transformers_5_untied_head_without_rescale() {
    check_seq2seq("t5_v5_untied");
    let m = load_seq2seq("t5_v5_untied");
    assert_eq!(
        m.arch.head,
        qkv::models::Head::Lm {
            tied: false,
            rescale: false,
            logits_bias: false
        }
    );
}
