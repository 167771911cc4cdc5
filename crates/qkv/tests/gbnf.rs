//! GBNF grammars read as llama.cpp reads them: llama.cpp's own example grammars
//! (`fixtures/gbnf/*.gbnf`), converted by `gbnf::to_lark` and run by the grammar engine
//! over a vocabulary of the 256 single bytes, take or refuse each candidate text as
//! llama.cpp's grammar engine does (`fixtures/gbnf/cases.json`, tools/fixtures/gen_gbnf.py).

#![cfg(feature = "models")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qkv::models::generate::gbnf;
use qkv::models::generate::grammar::{Constraint, Grammar, Vocabulary};
use serde_json::Value;

const EOS: usize = 256;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gbnf")
        .join(name)
}

/// The 256 single bytes as tokens 0..=255, then EOS.
fn byte_vocabulary() -> Vocabulary {
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    bytes.push(b"</s>".to_vec());
    Vocabulary::new(&bytes, |_| false, &[EOS]).unwrap()
}

fn cases() -> Vec<(String, String, bool)> {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("cases.json")).unwrap()).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["grammar"].as_str().unwrap().to_string(),
                c["text"].as_str().unwrap().to_string(),
                c["accepted"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The Lark of each grammar file the cases name.
fn grammars() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, _, _) in cases() {
        out.entry(name).or_insert_with_key(|name| {
            let text = std::fs::read_to_string(fixture(name)).unwrap();
            gbnf::to_lark(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
        });
    }
    out
}

/// Whether the constraint takes `text` whole: every byte allowed in turn by the mask,
/// then the end.
fn accepts(mut c: Constraint, text: &str) -> bool {
    for &b in text.as_bytes() {
        let mut scores = vec![0.0f32; EOS + 1];
        c.mask(&mut scores).unwrap();
        if !scores[b as usize].is_finite() {
            return false;
        }
        c.commit(b as usize).unwrap();
    }
    let mut scores = vec![0.0f32; EOS + 1];
    c.mask(&mut scores).unwrap();
    scores[EOS].is_finite()
}

#[test]
fn every_grammar_converts_and_compiles() {
    let vocabulary = byte_vocabulary();
    let grammars = grammars();
    assert_eq!(grammars.len(), 8, "{:?}", grammars.keys());
    for (name, lark) in &grammars {
        vocabulary
            .constraint(&Grammar::Lark(lark.clone()))
            .unwrap_or_else(|e| panic!("{name}: {e}\n{lark}"));
    }
}

#[test]
fn texts_are_taken_or_refused_as_llama_cpp_does() {
    let vocabulary = byte_vocabulary();
    let grammars = grammars();
    let mut wrong = Vec::new();
    let all = cases();
    for (name, text, expected) in &all {
        let lark = &grammars[name];
        let c = vocabulary
            .constraint(&Grammar::Lark(lark.clone()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = accepts(c, text);
        if got != *expected {
            wrong.push(format!(
                "{name} {text:?}: llama.cpp {}, qkv {}",
                verdict(*expected),
                verdict(got)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases differ from llama.cpp:\n{}",
        wrong.len(),
        all.len(),
        wrong.join("\n")
    );
}

fn verdict(accepted: bool) -> &'static str {
    match accepted {
        true => "accepts",
        false => "refuses",
    }
}
