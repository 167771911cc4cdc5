//! Tokenizers against transformers' fast tokenizers: ids with and without the special
//! tokens each family adds, decoded text, and token labels for attention maps. For each
//! of the ways vocabularies spell word boundaries (WordPiece `##`, byte-level `Ġ` with
//! GPT-2's, Qwen2's and Llama 3's splits, SentencePiece `▁` with byte fallback, Unigram
//! `▁`), every token's label is the text
//! it covers in the input (after the tokenizer's normaliser), as
//! `return_offsets_mapping` says; special tokens are flagged. Fixtures:
//! `tests/fixtures/tokenizers/` (tools/fixtures/gen_tokenizers.py).

#![cfg(feature = "models")]

use std::path::PathBuf;

use qkv::text::Tokenizer;

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    input_ids: Vec<usize>,
    tokens: Vec<String>,
    spans: Vec<Option<String>>,
    /// `add_special_tokens=False`
    ids_without_special: Vec<usize>,
    /// `decode(input_ids, skip_special_tokens=True)`
    decoded: String,
}

/// The fixture tokenizers with a tokenizer.json, one per way of spelling word
/// boundaries and of adding special tokens; `gemma_spm` and `xlmr_unigram` are laid out
/// as Gemma's and XLM-RoBERTa's (converted from SentencePiece by transformers), checked
/// on English, Chinese, code and whitespace.
const SCHEMES: [&str; 9] = [
    "wordpiece",
    "bytelevel",
    "sentencepiece_bpe",
    "unigram",
    "sentencepiece_unigram",
    "qwen2_bytelevel",
    "llama3_bytelevel",
    "gemma_spm",
    "xlmr_unigram",
];

#[derive(serde::Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

fn dir(scheme: &str) -> PathBuf {
    [
        env!("CARGO_MANIFEST_DIR"),
        "tests/fixtures/tokenizers",
        scheme,
    ]
    .iter()
    .collect()
}

fn reference(scheme: &str) -> Reference {
    let path = dir(scheme).join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Ids with and without the special tokens each tokenizer adds by default (BERT's
/// [CLS] … [SEP], Llama's <s> and Llama 3's <|begin_of_text|> before the text, T5's
/// </s> after it, nothing for GPT-2 and Qwen2), and the decoded text.
#[test]
fn ids_special_tokens_and_decoded_text_equal_transformers() {
    for scheme in SCHEMES {
        let tok = Tokenizer::from_dir(&dir(scheme)).unwrap();
        let cases = reference(scheme).cases;
        assert!(cases.len() >= 6, "{scheme}");
        for case in cases {
            let what = format!("{scheme} {:?}", case.text);
            assert_eq!(
                tok.encode(&case.text, true).unwrap(),
                case.input_ids,
                "{what}"
            );
            assert_eq!(
                tok.encode(&case.text, false).unwrap(),
                case.ids_without_special,
                "{what} without special tokens"
            );
            assert_eq!(
                tok.decode(&case.input_ids).unwrap(),
                case.decoded,
                "{what} decoded"
            );
        }
    }
}

#[test]
fn labels_are_the_text_each_token_covers() {
    for scheme in SCHEMES {
        let tok = Tokenizer::from_dir(&dir(scheme)).unwrap();
        for case in reference(scheme).cases {
            let what = format!("{scheme} {:?}", case.text);
            let ids = tok.encode(&case.text, true).unwrap();
            assert_eq!(ids, case.input_ids, "{what}: ids");
            let labels = tok.labels(&ids, &[]).unwrap();
            assert_eq!(labels.len(), ids.len(), "{what}");
            for (i, (label, span)) in labels.iter().zip(&case.spans).enumerate() {
                assert_eq!(label.piece, case.tokens[i], "{what} token {i}");
                match span {
                    None => assert!(label.special, "{what} token {i} {label:?} is special"),
                    Some(span) => {
                        assert!(!label.special, "{what} token {i} {label:?}");
                        assert_eq!(label.text.trim(), span, "{what} token {i} {label:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn labels_read_as_words_and_characters() {
    let shown = |scheme: &str, text: &str| -> Vec<String> {
        let tok = Tokenizer::from_dir(&dir(scheme)).unwrap();
        let ids = tok.encode(text, true).unwrap();
        tok.labels(&ids, &[])
            .unwrap()
            .iter()
            .map(|l| l.label())
            .collect()
    };
    assert_eq!(
        shown("wordpiece", "it was too tired"),
        ["[CLS]", "i", "t", "w", "a", "s", "t", "o", "o", "t", "i", "r", "e", "d", "[SEP]"]
    );
    // `Ġ` + the three bytes of 龙, which the byte-level vocabulary never merged
    assert_eq!(
        shown("bytelevel", "tion 龙"),
        ["tion", "␣", "龙¹", "龙²", "龙³"]
    );
    // byte fallback: <0xE9> <0xBE> <0x99>
    assert_eq!(
        shown("sentencepiece_bpe", "龙"),
        ["<s>", "␣", "龙¹", "龙²", "龙³"]
    );
    assert_eq!(shown("unigram", "The animal"), ["The", "animal", "</s>"]);
}

/// Each token's bytes, joined over a text's tokens, spell what transformers decodes
/// without its special tokens (Llama SentencePiece's first `▁` aside, which its decoder
/// strips): the table that logprobs'
/// `bytes` and grammar masks read, held to the reference on every scheme that generates.
#[test]
fn token_bytes_join_to_the_decoded_text() {
    for scheme in [
        "bytelevel",
        "qwen2_bytelevel",
        "llama3_bytelevel",
        "sentencepiece_bpe",
        "gemma_spm",
    ] {
        let tok = Tokenizer::from_dir(&dir(scheme)).unwrap();
        let cases = reference(scheme).cases;
        let largest = cases.iter().flat_map(|c| &c.input_ids).max().unwrap();
        let table = tok.token_bytes(largest + 1);
        for case in cases {
            // special tokens (no span in the text) are left out, as decode leaves them
            let joined: Vec<u8> = case
                .input_ids
                .iter()
                .zip(&case.spans)
                .filter(|(_, span)| span.is_some())
                .flat_map(|(&id, _)| table[id].clone())
                .collect();
            let text = String::from_utf8(joined).unwrap();
            // Llama's decoder strips the space its normaliser put first (Gemma's adds none)
            let text = match scheme == "sentencepiece_bpe" {
                true => text.strip_prefix(' ').unwrap_or(&text).to_string(),
                false => text,
            };
            assert_eq!(text, case.decoded, "{scheme} {:?}", case.text);
        }
    }
}
