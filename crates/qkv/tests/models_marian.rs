//! Marian (`MarianMTModel`) against its Hugging Face fixture (tools/fixtures/gen_models.py):
//! logits with a right-padded source, cached decoding, greedy generation; and the
//! errors a user can cause.

#![cfg(feature = "models")]

mod common;

use common::models::{check_seq2seq, load_seq2seq, model_dir};
use qkv::models::TokenBatch;
use qkv::Error;

#[test]
fn marian_matches_hugging_face() {
    check_seq2seq("marian");
}

#[test]
fn marian_info_and_special_tokens() {
    let m = load_seq2seq("marian");
    let info = m.info();
    assert_eq!(info.family, "marian");
    assert_eq!(info.architecture, "MarianMTModel");
    assert_eq!((info.layers, info.decoder_layers), (2, Some(2)));
    assert_eq!((info.hidden, info.heads, info.head_dim), (32, 4, 8));
    assert_eq!((info.vocab, info.max_positions), (99, Some(64)));
    let special = m.special_tokens();
    assert_eq!(special.eos, vec![0]);
    assert_eq!(special.pad, Some(98));
    assert_eq!(special.decoder_start, Some(98));
}

#[test]
fn marian_folder_without_tokenizer_points_at_input_ids() {
    let err = match qkv::text::Tokenizer::from_dir(&model_dir("marian")) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("the marian fixture has no tokenizer.json"),
    };
    assert!(err.contains("tokenizer.json"), "{err}");
    assert!(err.contains("--input-ids"), "{err}");
}

#[test]
fn marian_token_id_outside_vocabulary_is_an_error() {
    let m = load_seq2seq("marian");
    let bad = TokenBatch::single(vec![5, 99, 0]).unwrap();
    match m.encode(&bad) {
        Err(Error::OutOfRange {
            index: 99,
            size: 99,
            ..
        }) => {}
        other => panic!("expected an out-of-range token id, got {other:?}"),
    }
    let enc = m
        .encode(&TokenBatch::single(vec![5, 7, 0]).unwrap())
        .unwrap();
    let tgt = TokenBatch::single(vec![98, 1000]).unwrap();
    match m.decode_cached(&tgt, &enc, &mut m.new_cache(1)) {
        Err(Error::OutOfRange {
            index: 1000,
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
fn marian_source_longer_than_positions_is_an_error() {
    let m = load_seq2seq("marian");
    let long = TokenBatch::single(vec![5; 65]).unwrap();
    let err = m.encode(&long).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                index: 64,
                size: 64,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("positions"), "{err}");
    // 64 tokens fill the table exactly.
    m.encode(&TokenBatch::single(vec![5; 64]).unwrap()).unwrap();
}

#[test]
fn marian_left_padded_source_equals_rows_alone() {
    let m = load_seq2seq("marian");
    let rows: [&[usize]; 2] = [&[11, 23, 5, 42, 0], &[17, 3, 0]];
    let tgt = TokenBatch::new(vec![98, 4, 9, 98, 4, 9], None, 2, 3).unwrap();
    let src = TokenBatch::new(
        vec![11, 23, 5, 42, 0, 98, 98, 17, 3, 0],
        Some(vec![
            true, true, true, true, true, false, false, true, true, true,
        ]),
        2,
        5,
    )
    .unwrap();
    let enc = m.encode(&src).unwrap();
    let batched = m.decode_cached(&tgt, &enc, &mut m.new_cache(2)).unwrap();
    let v = batched.last_dim();
    for (r, row) in rows.iter().enumerate() {
        let enc = m
            .encode(&TokenBatch::single(row.to_vec()).unwrap())
            .unwrap();
        let one = TokenBatch::single(vec![98, 4, 9]).unwrap();
        let alone = m.decode_cached(&one, &enc, &mut m.new_cache(1)).unwrap();
        common::assert_close(
            &format!("row {r}"),
            &batched.data()[r * 3 * v..(r + 1) * 3 * v],
            alone.data(),
            1e-5,
            1e-4,
        );
    }
}

/// A copy of the `marian` fixture folder whose config.json has `field` set to `value`.
fn with_config(field: &str, value: serde_json::Value) -> std::path::PathBuf {
    let src = model_dir("marian");
    let dir = std::env::temp_dir().join(format!("qkv-marian-{field}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg[field] = value;
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn marian_bad_config_names_the_field() {
    for (field, value) in [
        ("decoder_attention_heads", serde_json::json!(5)),
        ("activation_function", serde_json::json!("mish")),
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
