//! The tokenizer and `modules.json`. The first byte chooses:
//!
//! - even: the rest is a `tokenizer.json`, loaded with `Tokenizer::from_dir`; a
//!   tokenizer that loads must encode a short text (with and without special
//!   tokens), label and decode what it encoded, and batch-encode with truncation;
//! - odd: the rest is the `modules.json` of a sentence-transformers folder laid out as
//!   all-MiniLM-L6-v2's (the tiny `bert` fixture model with the `wordpiece` fixture
//!   tokenizer, `sentence_bert_config.json`, `1_Pooling/config.json`, `2_Normalize/`),
//!   loaded with `SentenceEncoder::load`; an encoder that loads must embed two texts.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use qkv::models::sentence::SentenceEncoder;
use qkv::text::Tokenizer;

const TEXT: &str =
    "Hello, world! The animal didn't cross the street — it was too tired. ünïcödé 你好 123";

const BERT_CONFIG: &str = r#"{
  "architectures": ["BertModel"],
  "hidden_act": "gelu",
  "hidden_size": 32,
  "intermediate_size": 64,
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 64,
  "model_type": "bert",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "type_vocab_size": 2,
  "vocab_size": 99
}"#;

/// The MiniLM-shaped folder, built once; `modules.json` is rewritten per input.
fn sentence_folder() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = qkv_fuzz::scratch("sentence");
        let bert = qkv_fuzz::fixture("models/bert/model.safetensors");
        qkv_fuzz::link(&bert.canonicalize().expect("fixture"), &dir.join("model.safetensors"));
        let tok = qkv_fuzz::fixture("tokenizers/wordpiece/tokenizer.json");
        qkv_fuzz::link(&tok.canonicalize().expect("fixture"), &dir.join("tokenizer.json"));
        qkv_fuzz::write(&dir.join("config.json"), BERT_CONFIG.as_bytes());
        qkv_fuzz::write(
            &dir.join("sentence_bert_config.json"),
            br#"{"max_seq_length": 16, "do_lower_case": false}"#,
        );
        qkv_fuzz::write(
            &dir.join("tokenizer_config.json"),
            br#"{"pad_token": "[PAD]", "model_max_length": 512}"#,
        );
        std::fs::create_dir_all(dir.join("1_Pooling")).expect("scratch");
        qkv_fuzz::write(
            &dir.join("1_Pooling/config.json"),
            br#"{"word_embedding_dimension": 32, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}"#,
        );
        std::fs::create_dir_all(dir.join("2_Normalize")).expect("scratch");
        dir
    })
}

fn tokenizer(json: &[u8]) {
    let dir = qkv_fuzz::scratch("tokenizer");
    qkv_fuzz::write(&dir.join("tokenizer.json"), json);
    let tok = match Tokenizer::from_dir(&dir) {
        Ok(t) => t,
        Err(e) => return qkv_fuzz::note("tokenizer", &e),
    };
    qkv_fuzz::encode_label_decode_stream(&tok, TEXT);
    if let Ok(batch) = tok.encode_batch(&[TEXT, "a", ""], true, 0, Some(5)) {
        assert_eq!(batch.batch, 3);
        assert!(batch.len <= 5, "truncated to 5, got {}", batch.len);
    }
    let _ = tok.token_id("[PAD]");
}

fn modules(json: &[u8]) {
    let dir = sentence_folder();
    qkv_fuzz::write(&dir.join("modules.json"), json);
    let encoder = match SentenceEncoder::load(dir) {
        Ok(e) => e,
        Err(e) => return qkv_fuzz::note("sentence encoder", &e),
    };
    let vectors = match encoder.embed(&["hello world", TEXT]) {
        Ok(v) => v,
        Err(e) => panic!("a sentence encoder that loaded cannot embed: {e}"),
    };
    qkv_fuzz::note("embedded", &encoder.dim());
    assert_eq!(vectors.len(), 2);
    for v in &vectors {
        assert_eq!(v.len(), encoder.dim(), "embedding width");
    }
}

fuzz_target!(init: qkv_fuzz::init(), |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        tokenizer(rest);
    } else {
        modules(rest);
    }
});
