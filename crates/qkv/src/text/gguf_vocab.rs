//! The tokenizer a GGUF file's metadata describes (llama.cpp's `tokenizer.ggml.*` keys),
//! written out as the `tokenizer.json` that transformers' own converters make of the same
//! vocabulary, so that it tokenizes as the Hugging Face tokenizer the file was made from:
//!
//! - `llama`: SentencePiece BPE. The vocabulary with its scores; the merges are every
//!   split of a token into two tokens, ranked by the whole token's score (higher first),
//!   as transformers' `SentencePieceExtractor` ranks them; byte fallback (`<0x41>`); `▁`
//!   for spaces, one prepended unless `add_space_prefix` is false.
//! - `gpt2`: byte-level BPE with the stored merges, split into words by the regex of
//!   `tokenizer.ggml.pre` (the table below), as llama.cpp splits them.
//!
//! Control and unknown tokens are special added tokens, user-defined ones plain added
//! tokens; `add_bos_token` / `add_eos_token` become the post-processor.

use serde_json::{json, Map, Value as Json};

use crate::io::gguf::{Array, Header, Value};

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub(super) const UNKNOWN: i64 = 2;
pub(super) const CONTROL: i64 = 3;
pub(super) const USER_DEFINED: i64 = 4;

/// Word-splitting regexes of the byte-level pre-tokenizers, by `tokenizer.ggml.pre`: those
/// of the tokenizer.json files the names stand for. `gpt-2` uses GPT-2's own, which the
/// ByteLevel pre-tokenizer applies itself (`None`). (llama.cpp's `default` is a set of
/// regexes of its own, which no tokenizer.json has.)
pub(super) const PRE: &[(&str, Option<&str>)] = &[
    ("gpt-2", None),
    (
        "llama-bpe",
        Some(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
    ),
    (
        "qwen2",
        Some(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
    ),
];

/// The longest token read, in bytes (real vocabularies' longest are runs of a few dozen
/// spaces).
const MOST_BYTES: usize = 1024;

/// The metadata's vocabulary, read and checked.
struct Vocab<'h> {
    tokens: Vec<&'h str>,
    /// llama.cpp's token types (1, normal, where the file gives none)
    types: Vec<i64>,
    bos: Option<usize>,
    eos: Option<usize>,
    unk: Option<usize>,
    add_bos: bool,
    add_eos: bool,
}

/// The `tokenizer.json` of the file's tokenizer, `None` when it has none (no
/// `tokenizer.ggml.model`, or `none` / `no_vocab`); the error says which key is wrong.
pub(super) fn tokenizer_json(h: &Header) -> Result<Option<Json>, String> {
    let model = match h.get("tokenizer.ggml.model") {
        None => return Ok(None),
        Some(v) => v
            .as_str()
            .ok_or("metadata `tokenizer.ggml.model`: not a string")?,
    };
    if matches!(model, "none" | "no_vocab") {
        return Ok(None);
    }
    if !matches!(model, "llama" | "gpt2") {
        return Err(format!(
            "metadata `tokenizer.ggml.model`: `{model}` (qkv reads `llama` SentencePiece and `gpt2` byte-level BPE vocabularies)"
        ));
    }
    let spm = model == "llama";
    let vocab = Vocab::read(h, spm)?;
    let (model_json, normalizer, pre_tokenizer, decoder) = match spm {
        true => spm_parts(h, &vocab)?,
        false => byte_level_parts(h, &vocab)?,
    };
    Ok(Some(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(&vocab),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(&vocab, spm),
        "decoder": decoder,
        "model": model_json,
    })))
}

impl<'h> Vocab<'h> {
    fn read(h: &'h Header, spm: bool) -> Result<Self, String> {
        let tokens: Vec<&str> = array(h, "tokenizer.ggml.tokens")?
            .ok_or("metadata `tokenizer.ggml.tokens`: missing")?
            .strs()
            .ok_or("metadata `tokenizer.ggml.tokens`: not strings")?
            .collect();
        if tokens.is_empty() {
            return Err("metadata `tokenizer.ggml.tokens`: empty".into());
        }
        // a SentencePiece vocabulary's merges are every split of every token: a token
        // this long in a hostile file would cost its length squared
        if let Some((i, t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, t)| t.len() > MOST_BYTES)
        {
            return Err(format!(
                "metadata `tokenizer.ggml.tokens`: token {i} is {} bytes long (at most {MOST_BYTES})",
                t.len()
            ));
        }
        let types = match array(h, "tokenizer.ggml.token_type")? {
            None => vec![1; tokens.len()],
            Some(a) => {
                let t: Vec<i64> = a
                    .iter()
                    .map(|v| v.as_f64().map(|x| x as i64))
                    .collect::<Option<_>>()
                    .ok_or("metadata `tokenizer.ggml.token_type`: not integers")?;
                same_length("tokenizer.ggml.token_type", t.len(), tokens.len())?;
                t
            }
        };
        let id = |key: &str| -> Result<Option<usize>, String> {
            match h.get(key) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(i) if (i as usize) < tokens.len() => Ok(Some(i as usize)),
                    _ => Err(format!(
                        "metadata `{key}`: {v:?} is not a token id (the vocabulary has {})",
                        tokens.len()
                    )),
                },
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool, String> {
            match h.get(key) {
                None => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(v) => Err(format!("metadata `{key}`: {v:?} is not a bool")),
            }
        };
        Ok(Vocab {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            // llama.cpp's defaults: SentencePiece vocabularies add BOS, byte-level ones not
            add_bos: flag("tokenizer.ggml.add_bos_token", spm)?,
            add_eos: flag("tokenizer.ggml.add_eos_token", false)?,
            tokens,
            types,
        })
    }

    /// token → id, refusing a token given twice (ids could not round-trip).
    fn ids(&self) -> Result<Map<String, Json>, String> {
        let mut map = Map::with_capacity(self.tokens.len());
        for (i, t) in self.tokens.iter().enumerate() {
            if map.insert(t.to_string(), json!(i)).is_some() {
                return Err(format!(
                    "metadata `tokenizer.ggml.tokens`: token {t:?} is given twice (again at id {i})"
                ));
            }
        }
        Ok(map)
    }
}

fn array<'h>(h: &'h Header, key: &str) -> Result<Option<&'h Array>, String> {
    match h.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .map(Some)
            .ok_or_else(|| format!("metadata `{key}`: not an array")),
    }
}

fn same_length(key: &str, got: usize, tokens: usize) -> Result<(), String> {
    match got == tokens {
        true => Ok(()),
        false => Err(format!(
            "metadata `{key}`: {got} entries for {tokens} tokens"
        )),
    }
}

type Parts = (Json, Json, Json, Json);

/// SentencePiece BPE: `(model, normalizer, pre_tokenizer, decoder)`.
fn spm_parts(h: &Header, vocab: &Vocab) -> Result<Parts, String> {
    let scores: Vec<f64> = array(h, "tokenizer.ggml.scores")?
        .ok_or("metadata `tokenizer.ggml.scores`: missing (a SentencePiece vocabulary ranks its merges by them)")?
        .iter()
        .map(|v| v.as_f64())
        .collect::<Option<_>>()
        .ok_or("metadata `tokenizer.ggml.scores`: not numbers")?;
    same_length("tokenizer.ggml.scores", scores.len(), vocab.tokens.len())?;
    let ids = vocab.ids()?;
    let id_of = |s: &str| ids.get(s).and_then(Json::as_u64);
    // (score, token id, left id, right id, left, right), ranked as transformers ranks
    // them: score descending, then the token's id, then the parts' ids
    let mut merges = Vec::new();
    for (t, token) in vocab.tokens.iter().enumerate() {
        for (at, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(at);
            if let (Some(li), Some(ri)) = (id_of(l), id_of(r)) {
                merges.push((scores[t], t, li, ri, l, r));
            }
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    let merges: Vec<Json> = merges.iter().map(|m| json!([m.4, m.5])).collect();
    let prefix = match h.get("tokenizer.ggml.add_space_prefix") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(format!(
                "metadata `tokenizer.ggml.add_space_prefix`: {v:?} is not a bool"
            ))
        }
    };
    let model = json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": vocab.unk.map(|u| vocab.tokens[u]),
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": true,
        "byte_fallback": true,
        "ignore_merges": false,
        "vocab": ids,
        "merges": merges,
    });
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let normalizer = match prefix {
        true => json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u{2581}"}, replace]}),
        false => replace,
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let decoder = json!({"type": "Sequence", "decoders": decoders});
    Ok((model, normalizer, Json::Null, decoder))
}

/// Byte-level BPE: `(model, normalizer, pre_tokenizer, decoder)`.
fn byte_level_parts(h: &Header, vocab: &Vocab) -> Result<Parts, String> {
    let merges: Vec<Json> = array(h, "tokenizer.ggml.merges")?
        .ok_or("metadata `tokenizer.ggml.merges`: missing (a byte-level BPE vocabulary needs its merges)")?
        .strs()
        .ok_or("metadata `tokenizer.ggml.merges`: not strings")?
        .map(|m| match m.split_once(' ') {
            Some((l, r)) if !l.is_empty() && !r.is_empty() && !r.contains(' ') => {
                Ok(json!([l, r]))
            }
            _ => Err(format!(
                "metadata `tokenizer.ggml.merges`: {m:?} is not two tokens separated by a space"
            )),
        })
        .collect::<Result<_, _>>()?;
    let pre = match h.get("tokenizer.ggml.pre") {
        None => "gpt-2",
        Some(v) => v
            .as_str()
            .ok_or("metadata `tokenizer.ggml.pre`: not a string")?,
    };
    let Some(&(_, regex)) = PRE.iter().find(|(name, _)| *name == pre) else {
        let known: Vec<&str> = PRE.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "metadata `tokenizer.ggml.pre`: `{pre}` (qkv splits words as {})",
            known.join(", ")
        ));
    };
    let model = json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": null,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": false,
        "byte_fallback": false,
        // Llama 3's tokenizer.json takes a word found whole in the vocabulary as it is
        "ignore_merges": pre == "llama-bpe",
        "vocab": vocab.ids()?,
        "merges": merges,
    });
    let byte_level = |use_regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": use_regex})
    };
    let pre_tokenizer = match regex {
        None => byte_level(true),
        Some(r) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false},
            byte_level(false)]}),
    };
    // Qwen2's tokenizer.json composes the text (NFC) first
    let normalizer = match pre {
        "qwen2" => json!({"type": "NFC"}),
        _ => Json::Null,
    };
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    Ok((model, normalizer, pre_tokenizer, decoder))
}

/// Control and unknown tokens as special added tokens, user-defined ones as plain ones.
fn added_tokens(vocab: &Vocab) -> Vec<Json> {
    let mut out = Vec::new();
    for (i, (&token, &ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
        let special = match ty {
            CONTROL | UNKNOWN => true,
            USER_DEFINED => false,
            _ => continue,
        };
        out.push(
            json!({"id": i, "content": token, "single_word": false, "lstrip": false,
                        "rstrip": false, "normalized": false, "special": special}),
        );
    }
    out
}

/// BOS before and EOS after each sequence where the file asks; a byte-level tokenizer
/// otherwise keeps its offsets as the ByteLevel post-processor leaves them.
fn post_processor(vocab: &Vocab, spm: bool) -> Json {
    let bos = vocab.bos.filter(|_| vocab.add_bos);
    let eos = vocab.eos.filter(|_| vocab.add_eos);
    if bos.is_none() && eos.is_none() {
        return match spm {
            true => Json::Null,
            false => json!({"type": "ByteLevel", "add_prefix_space": true,
                            "trim_offsets": false, "use_regex": true}),
        };
    }
    let special = |id: usize| json!({"SpecialToken": {"id": vocab.tokens[id], "type_id": 0}});
    let sequence = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let wrap = |name: &str, type_id: u32| {
        let mut v: Vec<Json> = bos.map(special).into_iter().collect();
        v.push(sequence(name, type_id));
        v.extend(eos.map(special));
        v
    };
    let single = wrap("A", 0);
    let mut pair = single.clone();
    pair.extend(wrap("B", 1));
    let mut specials = Map::new();
    for id in bos.into_iter().chain(eos) {
        let t = vocab.tokens[id];
        specials.insert(t.into(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    let template = json!({"type": "TemplateProcessing", "single": single, "pair": pair,
                          "special_tokens": specials});
    match spm {
        true => template,
        false => json!({"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false,
             "use_regex": true},
            template]}),
    }
}
