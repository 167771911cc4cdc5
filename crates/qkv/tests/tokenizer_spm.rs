//! Folders that ship SentencePiece models instead of a `tokenizer.json`, against
//! transformers' slow tokenizers, which encode with the `sentencepiece` library
//! (tools/fixtures/gen_tokenizers.py): T5's `spiece.model` alone (`T5Tokenizer`, with
//! extra ids) and an OPUS-MT folder's `source.spm`, `target.spm` and `vocab.json`
//! (`MarianTokenizer`), on English, Chinese, whitespace runs, special tokens inside the
//! text, a language code and characters the normaliser rewrites.

#![cfg(feature = "models")]

use std::path::{Path, PathBuf};

use qkv::text::Tokenizer;
use serde_json::Value;

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizers")
        .join(name)
}

fn reference(name: &str) -> Value {
    let path = fixture_dir(name).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect()
}

#[test]
fn t5_spiece_model_alone_encodes_and_decodes_as_t5_tokenizer() {
    let tok = Tokenizer::from_dir(&fixture_dir("t5_spiece")).unwrap();
    let r = reference("t5_spiece");
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 12);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["input_ids"]);
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, want, "{text:?}: {:?}", case["tokens"]);
        assert_eq!(
            tok.decode(&got).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{text:?} decoded"
        );
    }
    assert_eq!(tok.token_id("<extra_id_0>"), Some(101));
    assert_eq!(tok.token_id("<extra_id_2>"), Some(99));
}

#[test]
fn marian_folder_encodes_and_decodes_as_marian_tokenizer() {
    let tok = Tokenizer::from_dir(&fixture_dir("marian")).unwrap();
    let r = reference("marian");
    for case in r["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&case["input_ids"]),
            "{text:?}: {:?}",
            case["tokens"]
        );
    }
    let decodes = r["decodes"].as_array().unwrap();
    assert!(decodes.len() >= 6);
    for case in decodes {
        let ids = ids(&case["ids"]);
        assert_eq!(
            tok.decode(&ids).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{ids:?}"
        );
    }
    assert_eq!(tok.token_id("</s>"), Some(0));
    assert_eq!(tok.token_id(">>zh<<"), Some(96));
    assert_eq!(tok.token_id("<pad>"), Some(98));
}

/// Streaming token by token gives the decoded text: a Marian translation, and T5's
/// encodings (whose decoded text is trimmed at both ends).
#[test]
fn sentencepiece_folders_stream_into_the_decoded_text() {
    for (name, key, list) in [
        ("marian", "ids", "decodes"),
        ("t5_spiece", "input_ids", "cases"),
    ] {
        let tok = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
        let r = reference(name);
        for case in r[list].as_array().unwrap() {
            streams_into_decoded(&tok, &ids(&case[key]));
        }
    }
}

fn streams_into_decoded(tok: &Tokenizer, ids: &[usize]) {
    let mut stream = tok.stream();
    let mut text = String::new();
    for &id in ids {
        if let Some(piece) = stream.push(id).unwrap() {
            text.push_str(&piece);
        }
    }
    text.extend(stream.finish().unwrap());
    assert_eq!(text, tok.decode(ids).unwrap(), "{ids:?}");
}

/// A copy of fixture `name` with `edit` applied to its files.
fn edited(name: &str, tag: &str, edit: impl Fn(&Path)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-spm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_dir(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    edit(&dir);
    dir
}

fn refused(dir: &Path) -> String {
    let msg = match Tokenizer::from_dir(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    };
    let _ = std::fs::remove_dir_all(dir);
    msg
}

#[test]
fn broken_sentencepiece_folders_are_named_errors() {
    let cut = edited("t5_spiece", "cut", |d| {
        let bytes = std::fs::read(d.join("spiece.model")).unwrap();
        std::fs::write(d.join("spiece.model"), &bytes[..bytes.len() / 2]).unwrap();
    });
    let msg = refused(&cut);
    assert!(msg.contains("spiece.model"), "{msg}");

    let garbage = edited("marian", "garbage", |d| {
        std::fs::write(d.join("target.spm"), b"\x0b not protobuf").unwrap();
    });
    let msg = refused(&garbage);
    assert!(msg.contains("target.spm"), "{msg}");

    let no_vocab = edited("marian", "novocab", |d| {
        std::fs::remove_file(d.join("vocab.json")).unwrap();
    });
    let msg = refused(&no_vocab);
    assert!(msg.contains("vocab.json"), "{msg}");

    let no_pad = edited("marian", "nopad", |d| {
        std::fs::write(d.join("vocab.json"), r#"{"</s>": 0, "<unk>": 1}"#).unwrap();
    });
    let msg = refused(&no_pad);
    assert!(msg.contains("vocab.json") && msg.contains("<pad>"), "{msg}");

    let no_target = edited("marian", "notarget", |d| {
        std::fs::remove_file(d.join("target.spm")).unwrap();
    });
    let msg = refused(&no_target);
    assert!(msg.contains("target.spm"), "{msg}");
}
