//! Hostile `tokenizer.json` files: each of what the `tokenizers` crate would panic on
//! (the reproducers the fuzzer found, `fuzz/regressions/tokenizer/`, and the
//! SentencePiece character maps found by reading its source after them) is an error
//! that names the part at fault; and streamed decoding joins into `decode`'s text,
//! for every fixture tokenizer and for the decoder the fuzzer caught streaming wrong.

#![cfg(feature = "models")]

use std::path::{Path, PathBuf};

use qkv::text::Tokenizer;

const TEXT: &str =
    "Hello, world! The animal didn't cross the street — it was too tired. ünïcödé 你好 123";

fn fixture_dir(scheme: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizers")
        .join(scheme)
}

/// A fuzzer reproducer's `tokenizer.json` (its first byte is the target's selector).
fn regression(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions/tokenizer")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes[1..].to_vec()
}

/// A folder holding `json` as its `tokenizer.json`.
fn folder(tag: &str, json: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-tokfile-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    dir
}

fn refused(tag: &str, json: &[u8]) -> String {
    let dir = folder(tag, json);
    let err = match Tokenizer::from_dir(&dir) {
        Ok(_) => panic!("{tag}: loaded"),
        Err(e) => e.to_string(),
    };
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        err.contains("tokenizer.json"),
        "{tag}: names the file: {err}"
    );
    err
}

#[test]
fn fuzzer_reproducers_are_errors() {
    let err = refused("syntax", &regression("decoder-json-syntax-error"));
    assert!(
        err.contains("not valid JSON") && err.contains("line 1"),
        "{err}"
    );
    let err = refused("template", &regression("template-missing-special-token"));
    assert!(
        err.contains("post_processor: the single template names special token \"\""),
        "{err}"
    );
    let err = refused("strip", &regression("strip-decoder-stop-underflow"));
    assert!(err.contains("Strip decoder with stop 5"), "{err}");
}

/// The unigram fixture with its post-processor's special tokens replaced.
fn unigram_with_specials(specials: serde_json::Value) -> Vec<u8> {
    let path = fixture_dir("unigram").join("tokenizer.json");
    let mut file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    file["post_processor"]["special_tokens"] = specials;
    file.to_string().into_bytes()
}

#[test]
fn special_tokens_must_have_one_id_per_token() {
    let json = unigram_with_specials(serde_json::json!({
        "</s>": {"id": "</s>", "ids": [1, 2], "tokens": ["</s>"]}
    }));
    let err = refused("special-ids", &json);
    assert!(
        err.contains("special token \"</s>\" has 2 ids but 1 tokens"),
        "{err}"
    );
    // the same file with matching lengths loads and adds both ids
    let json = unigram_with_specials(serde_json::json!({
        "</s>": {"id": "</s>", "ids": [1, 2], "tokens": ["</s>", "<unk>"]}
    }));
    let dir = folder("special-ok", &json);
    let ids = Tokenizer::from_dir(&dir)
        .unwrap()
        .encode("The", true)
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(ids[ids.len() - 2..], [1, 2]);
}

/// The SentencePiece fixture (a real compiled character map, converted by
/// transformers) with its map replaced by `charsmap`.
fn with_charsmap(charsmap: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(fixture_dir("sentencepiece_unigram").join("tokenizer.json"))
        .unwrap();
    let mut file: serde_json::Value = serde_json::from_str(&text).unwrap();
    file["normalizer"]["normalizers"][0]["precompiled_charsmap"] = charsmap.into();
    file.to_string().into_bytes()
}

fn real_charsmap() -> Vec<u8> {
    use base64::Engine;
    let text = std::fs::read_to_string(fixture_dir("sentencepiece_unigram").join("tokenizer.json"))
        .unwrap();
    let file: serde_json::Value = serde_json::from_str(&text).unwrap();
    let map = file["normalizer"]["normalizers"][0]["precompiled_charsmap"]
        .as_str()
        .expect("the fixture's normaliser is Sequence[Precompiled, …]");
    base64::engine::general_purpose::STANDARD
        .decode(map)
        .unwrap()
}

fn encoded(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn broken_sentencepiece_character_maps_are_errors() {
    let err = refused("charsmap-base64", &with_charsmap("not base64!"));
    assert!(
        err.contains("normalizer: Precompiled precompiled_charsmap"),
        "{err}"
    );

    let real = real_charsmap();
    let trie_bytes = u32::from_le_bytes(real[..4].try_into().unwrap()) as usize;
    // a trie cut to its first 64 units: its walks run past the end
    let mut cut = 256u32.to_le_bytes().to_vec();
    cut.extend_from_slice(&real[4..4 + 256]);
    cut.extend_from_slice(&real[4 + trie_bytes..]);
    let err = refused("charsmap-cut", &with_charsmap(&encoded(&cut)));
    assert!(err.contains("points outside itself"), "{err}");

    // the trie whole but its replacement strings gone: the leaves point past them
    let err = refused(
        "charsmap-strings",
        &with_charsmap(&encoded(&real[..4 + trie_bytes])),
    );
    assert!(err.contains("has a replacement at byte"), "{err}");

    // a header longer than the map; one announcing 4 GiB, for which the crate's reader
    // would reserve 8 GiB before reading anything (the sentencepiece fuzzer's find)
    for (tag, header) in [
        ("charsmap-header", real.len() as u32 * 2),
        ("charsmap-huge", u32::MAX),
    ] {
        let mut long = real.clone();
        long[..4].copy_from_slice(&header.to_le_bytes());
        let err = refused(tag, &with_charsmap(&encoded(&long)));
        assert!(err.contains("announces a trie of"), "{err}");
    }

    // the real map, through the same rewrite, loads and normalises full-width text
    let dir = folder("charsmap-real", &with_charsmap(&encoded(&real)));
    let tok = Tokenizer::from_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let plain = Tokenizer::from_dir(&fixture_dir("sentencepiece_unigram")).unwrap();
    assert_eq!(
        tok.encode("Ａ fine cat，sat", true).unwrap(),
        plain.encode("A fine cat,sat", true).unwrap()
    );
}

/// Streams `ids` one at a time; the pieces and the rest at the end.
fn streamed(tok: &Tokenizer, ids: &[usize]) -> String {
    let mut stream = tok.stream();
    let mut text = String::new();
    for &id in ids {
        text.extend(stream.push(id).unwrap());
    }
    text.extend(stream.finish().unwrap());
    text
}

/// Every fixture tokenizer (`tests/fixtures/tokenizers/*`).
#[test]
fn streamed_pieces_join_into_the_decoded_text() {
    let folders = std::fs::read_dir(fixture_dir("")).unwrap();
    for folder in folders {
        let folder = folder.unwrap().path();
        let scheme = folder.file_name().unwrap().to_string_lossy();
        let tok = Tokenizer::from_dir(&folder).unwrap();
        for text in [TEXT, "龙", "a 猫坐"] {
            let Ok(ids) = tok.encode(text, true) else {
                continue;
            };
            // every prefix, so that some end inside a character's bytes
            for n in 0..=ids.len() {
                let want = tok.decode(&ids[..n]).unwrap();
                let got = streamed(&tok, &ids[..n]);
                if want.ends_with('\u{FFFD}') {
                    // byte fallback garbles the whole run of bytes that ends inside a
                    // character, including those shown before; the stream ends with
                    // the held-back bytes' U+FFFD
                    assert!(
                        got.ends_with('\u{FFFD}'),
                        "{scheme} {text:?} [..{n}]: {got:?}"
                    );
                } else {
                    assert_eq!(got, want, "{scheme} {text:?} [..{n}]");
                }
            }
        }
    }
}

#[test]
fn a_decoder_that_strips_the_text_start_streams_exactly() {
    // Replace ▁ → space, Fuse, Strip two leading spaces: the tokenizers crate's own
    // windowed stream strips them from every window (the fuzzer's find)
    let dir = folder("stream", &regression("stream-vs-decode"));
    let tok = Tokenizer::from_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let ids = vec![0; 6];
    let want = tok.decode(&ids).unwrap();
    assert_eq!(want, "    ", "six ▁ less the two stripped");
    assert_eq!(streamed(&tok, &ids), want);
}

#[test]
fn a_byte_token_cut_short_is_finished_as_decode_shows_it() {
    let tok = Tokenizer::from_dir(&fixture_dir("bytelevel")).unwrap();
    let ids = tok.encode("龙", false).unwrap();
    assert_eq!(ids.len(), 3, "three byte tokens");
    let mut stream = tok.stream();
    assert_eq!(stream.push(ids[0]).unwrap(), None);
    assert_eq!(stream.push(ids[1]).unwrap(), None);
    assert_eq!(stream.finish().unwrap().as_deref(), Some("\u{FFFD}"));
}
