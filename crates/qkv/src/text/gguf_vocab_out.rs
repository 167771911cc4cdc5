//! A folder's `tokenizer.json` as GGUF metadata (`tokenizer.ggml.*`), the inverse of
//! `gguf_vocab.rs`: what `qkv convert` writes, and what reads back as the same tokenizer.

use std::path::Path;

use serde_json::Value as Json;

use super::gguf_vocab::{CONTROL, PRE, UNKNOWN, USER_DEFINED};
use crate::error::Error;
use crate::io::gguf::{Array, Value, ValueType};

/// The `tokenizer.ggml.*` metadata of the folder `dir`'s `tokenizer.json` (see
/// `gguf_metadata`) for a model of `n_vocab` token rows, and its chat template as
/// `tokenizer.chat_template`; `None` when the folder has no tokenizer.json. A GGUF
/// file's own `tokenizer.*` keys, as they are, when `dir` is one (`None` when it has
/// no vocabulary).
pub fn folder_gguf_metadata(
    dir: &Path,
    n_vocab: usize,
) -> crate::error::Result<Option<Vec<(String, Value)>>> {
    if crate::io::gguf::is_gguf(dir) {
        return file_tokenizer(dir, n_vocab);
    }
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Ok(None);
    }
    let refuse = |why: String| Error::Tokenizer(format!("{}: {why}", path.display()));
    let bytes = crate::io::read_regular(&path)?;
    let file: Json =
        serde_json::from_slice(&bytes).map_err(|e| refuse(format!("not valid JSON: {e}")))?;
    let mut out = gguf_metadata(&file, n_vocab).map_err(refuse)?;
    if let Some(t) = super::chat::ChatTemplate::from_dir(dir)? {
        out.push((
            "tokenizer.chat_template".into(),
            Value::String(t.source().to_string()),
        ));
    }
    Ok(Some(out))
}

/// Every `tokenizer.*` key of the GGUF file `path` (the vocabulary, its merges or
/// scores, token types, special ids, the chat template), for a model of `n_vocab` token
/// rows; `None` when the file names no tokenizer model.
fn file_tokenizer(
    path: &Path,
    n_vocab: usize,
) -> crate::error::Result<Option<Vec<(String, Value)>>> {
    let file = crate::io::gguf::GgufFile::open(path)?;
    let keys: Vec<(String, Value)> = file
        .header
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .cloned()
        .collect();
    let model = keys.iter().find(|(k, _)| k == "tokenizer.ggml.model");
    if model.is_none_or(|(_, v)| v.as_str() == Some("none")) {
        return Ok(None);
    }
    let tokens = keys
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map_or(0, Array::len);
    if tokens != n_vocab {
        return Err(Error::Tokenizer(format!(
            "{}: metadata `tokenizer.ggml.tokens`: {tokens} tokens for the model's {n_vocab} token rows",
            path.display()
        )));
    }
    Ok(Some(keys))
}

/// `tokenizer.ggml.token_type` of a byte-fallback token (`<0x41>`).
const BYTE: i32 = 6;
const NORMAL: i32 = 1;
const UNUSED: i32 = 5;

/// The `tokenizer.ggml.*` metadata that stands for the tokenizer.json `file` in a GGUF
/// file, the inverse of `gguf_vocab.rs`'s reading: byte-level BPE as `gpt2` (its regex named by
/// `tokenizer.ggml.pre`), SentencePiece-style BPE with byte fallback as `llama` (each
/// token's score minus the rank of the merge that makes it, so that the merges read
/// back in their order). Other tokenizers have no GGUF form here; the error says why.
fn gguf_metadata(file: &Json, n_vocab: usize) -> Result<Vec<(String, Value)>, String> {
    let model = &file["model"];
    if model["type"] != "BPE" {
        return Err(format!(
            "a {} tokenizer (GGUF holds BPE vocabularies here)",
            model["type"]
        ));
    }
    let mut tokens: Vec<Option<String>> = Vec::new();
    let mut put = |id: &Json, token: &str| -> Result<(), String> {
        let id = id.as_u64().ok_or("a token id that is not a number")? as usize;
        if id >= tokens.len() {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some(token.to_string());
        Ok(())
    };
    let vocab = model["vocab"].as_object().ok_or("no vocabulary")?;
    for (token, id) in vocab {
        put(id, token)?;
    }
    let added = file["added_tokens"].as_array().cloned().unwrap_or_default();
    for a in &added {
        put(
            &a["id"],
            a["content"]
                .as_str()
                .ok_or("an added token without content")?,
        )?;
    }
    let mut tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or(format!("no token has id {i}")))
        .collect::<Result<_, _>>()?;
    if tokens.len() > n_vocab {
        return Err(format!(
            "{} tokens, more than the model's {n_vocab} token rows",
            tokens.len()
        ));
    }
    // the model's rows past the tokenizer's, named as llama.cpp's converter names them
    // (llama.cpp wants a token for every row)
    let named = tokens.len();
    tokens.extend((named..n_vocab).map(|i| format!("[PAD{i}]")));
    let ids: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let id_of = |t: &str| ids.get(t).copied();
    let merges: Vec<(String, String)> = model["merges"]
        .as_array()
        .ok_or("no merges")?
        .iter()
        .map(|m| match m {
            Json::String(s) => s.split_once(' ').map(|(l, r)| (l.into(), r.into())),
            Json::Array(p) if p.len() == 2 => Some((p[0].as_str()?.into(), p[1].as_str()?.into())),
            _ => None,
        })
        .collect::<Option<_>>()
        .ok_or("a merge that is not two tokens")?;
    let mut types = vec![NORMAL; tokens.len()];
    types[named..].fill(UNUSED);
    for a in &added {
        let id = a["id"].as_u64().unwrap_or_default() as usize;
        types[id] = match a["special"].as_bool() {
            Some(true) => CONTROL as i32,
            _ => USER_DEFINED as i32,
        };
    }
    let (bos, eos) = template_ends(&file["post_processor"]);
    let mut out: Vec<(String, Value)> = Vec::new();
    let spm = model["byte_fallback"] == true;
    if spm {
        let prefix = spm_prefix(&file["normalizer"])?;
        // a token made by merge i scores −(i + 1); the rest 0, ahead of every merge
        let mut scores = vec![0.0f32; tokens.len()];
        scores[named..].fill(-1000.0);
        for (rank, (l, r)) in merges.iter().enumerate() {
            if let Some(id) = id_of(&format!("{l}{r}")) {
                if scores[id] == 0.0 {
                    scores[id] = -((rank + 1) as f32);
                }
            }
        }
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            let byte = t.len() == 6 && t.starts_with("<0x") && t.ends_with('>');
            if byte && *ty == NORMAL {
                *ty = BYTE;
            }
        }
        if let Some(unk) = model["unk_token"].as_str().and_then(id_of) {
            types[unk] = UNKNOWN as i32;
            out.push((
                "tokenizer.ggml.unknown_token_id".into(),
                Value::U32(unk as u32),
            ));
        }
        out.push(("tokenizer.ggml.model".into(), Value::String("llama".into())));
        out.push(("tokenizer.ggml.pre".into(), Value::String("default".into())));
        out.push((
            "tokenizer.ggml.add_space_prefix".into(),
            Value::Bool(prefix),
        ));
        out.push((
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::from_values(
                ValueType::F32,
                scores.into_iter().map(Value::F32),
            )),
        ));
    } else {
        let pre = byte_level_pre(file, merges.is_empty())?;
        out.push(("tokenizer.ggml.model".into(), Value::String("gpt2".into())));
        out.push(("tokenizer.ggml.pre".into(), Value::String(pre.into())));
        out.push((
            "tokenizer.ggml.merges".into(),
            strings(merges.iter().map(|(l, r)| format!("{l} {r}"))),
        ));
    }
    out.push((
        "tokenizer.ggml.tokens".into(),
        strings(tokens.iter().cloned()),
    ));
    out.push((
        "tokenizer.ggml.token_type".into(),
        Value::Array(Array::from_values(
            ValueType::I32,
            types.into_iter().map(Value::I32),
        )),
    ));
    for (key, id) in [("bos", bos), ("eos", eos)] {
        if let Some(id) = id.as_deref().and_then(id_of) {
            out.push((
                format!("tokenizer.ggml.{key}_token_id"),
                Value::U32(id as u32),
            ));
        }
        out.push((
            format!("tokenizer.ggml.add_{key}_token"),
            Value::Bool(id.is_some()),
        ));
    }
    Ok(out)
}

fn strings(items: impl Iterator<Item = String>) -> Value {
    Value::Array(Array::strings(items))
}

/// The special tokens a post-processor puts before and after a single sequence.
fn template_ends(post: &Json) -> (Option<String>, Option<String>) {
    let template = match post["type"].as_str() {
        Some("TemplateProcessing") => post,
        Some("Sequence") => match post["processors"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["type"] == "TemplateProcessing"))
        {
            Some(t) => t,
            None => return (None, None),
        },
        _ => return (None, None),
    };
    let single = template["single"].as_array().cloned().unwrap_or_default();
    let special = |piece: Option<&Json>| {
        piece.and_then(|p| p["SpecialToken"]["id"].as_str().map(str::to_string))
    };
    (special(single.first()), special(single.last()))
}

/// Whether a SentencePiece-style normalizer prepends `▁` (Llama's: Prepend then
/// Replace; without the Prepend, none).
fn spm_prefix(normalizer: &Json) -> Result<bool, String> {
    let parts: Vec<&Json> = match normalizer["type"].as_str() {
        Some("Sequence") => normalizer["normalizers"]
            .as_array()
            .map(|n| n.iter().collect())
            .unwrap_or_default(),
        Some(_) => vec![normalizer],
        None => Vec::new(),
    };
    let kinds: Vec<&str> = parts.iter().filter_map(|p| p["type"].as_str()).collect();
    match kinds.as_slice() {
        ["Prepend", "Replace"] => Ok(true),
        ["Replace"] => Ok(false),
        _ => Err(format!(
            "a byte-fallback BPE tokenizer whose normalizer ({kinds:?}) is not Llama's (Prepend ▁, Replace ' ' → ▁)"
        )),
    }
}

/// The `tokenizer.ggml.pre` name of a byte-level tokenizer's word split. A ByteLevel
/// pre-tokenizer that splits no words (`use_regex: false`, as `qkv train --text` saves
/// its byte tokenizer) has no llama.cpp twin: every `tokenizer.ggml.pre` splits words.
/// Without merges (`no_merges`) the split changes nothing, each byte being a token
/// whatever the words: it is written as `gpt-2`, which llama.cpp and qkv read alike.
fn byte_level_pre(file: &Json, no_merges: bool) -> Result<&'static str, String> {
    let pre = &file["pre_tokenizer"];
    let regex = match pre["type"].as_str() {
        Some("ByteLevel") if pre["use_regex"] == true => None,
        Some("ByteLevel") if pre["use_regex"] == false && pre["add_prefix_space"] != true => {
            if !no_merges {
                return Err(format!(
                    "a ByteLevel pre-tokenizer that splits no words, with merges: every tokenizer.ggml.pre llama.cpp knows splits words first, so merges across them would be lost ({pre})"
                ));
            }
            None
        }
        Some("Sequence") => {
            let parts = pre["pretokenizers"].as_array().cloned().unwrap_or_default();
            match parts.as_slice() {
                [split, level]
                    if split["type"] == "Split"
                        && level["type"] == "ByteLevel"
                        && level["use_regex"] == false =>
                {
                    split["pattern"]["Regex"].as_str().map(str::to_string)
                }
                _ => {
                    return Err(format!(
                        "a byte-level pre-tokenizer GGUF has no name for: {pre}"
                    ))
                }
            }
        }
        _ => return Err(format!("a pre-tokenizer GGUF has no name for: {pre}")),
    };
    let (name, _) = PRE
        .iter()
        .find(|(_, r)| r.map(str::to_string) == regex)
        .ok_or_else(|| format!("a word-splitting regex GGUF has no name for: {regex:?}"))?;
    // the reading composes Qwen2's words (NFC) and no others'
    let normalizer = &file["normalizer"];
    let matches = match *name {
        "qwen2" => normalizer["type"] == "NFC",
        _ => normalizer.is_null(),
    };
    match matches {
        true => Ok(name),
        false => Err(format!(
            "`{name}` words with the normalizer {normalizer}, which reading `{name}` back would not apply"
        )),
    }
}
