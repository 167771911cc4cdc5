//! SentencePiece model files, read without the C++ library. The first byte chooses:
//!
//! - even: the rest is a T5 folder's `spiece.model` (with `tokenizer_config.json`
//!   asking for 3 extra ids);
//! - odd: the rest is both `source.spm` and `target.spm` of a Marian folder whose
//!   `vocab.json` is the `marian` fixture's.
//!
//! A tokenizer that loads must encode a text (with and without special tokens), label
//! and decode what it encoded, and stream it into the decoded text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qkv::text::Tokenizer;

const TEXT: &str = ">>zh<< Hello, world! The animal didn't cross the street. ünïcödé 你好 123 </s>";

fuzz_target!(init: qkv_fuzz::init(), |data: &[u8]| {
    let Some((&mode, model)) = data.split_first() else {
        return;
    };
    let dir = qkv_fuzz::scratch("sentencepiece");
    if mode % 2 == 0 {
        qkv_fuzz::write(&dir.join("spiece.model"), model);
        qkv_fuzz::write(&dir.join("tokenizer_config.json"), br#"{"extra_ids": 3}"#);
    } else {
        qkv_fuzz::write(&dir.join("source.spm"), model);
        qkv_fuzz::write(&dir.join("target.spm"), model);
        let vocab = qkv_fuzz::fixture("tokenizers/marian/vocab.json");
        qkv_fuzz::write(&dir.join("vocab.json"), &std::fs::read(vocab).expect("fixture"));
    }
    match Tokenizer::from_dir(&dir) {
        Ok(tok) => qkv_fuzz::encode_label_decode_stream(&tok, TEXT),
        Err(e) => qkv_fuzz::note("sentencepiece", &e),
    }
});
