//! Marian (OPUS-MT) folders' tokenizer: `source.spm` cuts the source text into pieces,
//! `vocab.json` (shared by both sides) numbers them, and generated ids are turned back
//! into pieces by the same vocabulary and joined as `target.spm` would join them, all
//! as transformers' `MarianTokenizer` does:
//! - a leading language code `>>xx<<` is one token, kept out of SentencePiece;
//! - a piece missing from the vocabulary is `<unk>`; `</s>` ends every source text;
//! - decoding skips `</s>`, `<unk>` and `<pad>` (with `skip_special_tokens`), joins the
//!   pieces, turns `▁` into spaces and trims the ends.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::error::{Error, Result};

/// The special tokens of a Marian tokenizer (transformers' defaults).
pub(crate) const SPECIAL: [&str; 3] = ["</s>", "<unk>", "<pad>"];

pub(crate) struct MarianVocab {
    ids: HashMap<String, usize>,
    pieces: HashMap<usize, String>,
    unk: usize,
    eos: usize,
    special: HashSet<usize>,
}

impl MarianVocab {
    /// `dir/vocab.json`: a JSON object from piece to id, holding the special tokens.
    pub(crate) fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("vocab.json");
        let bytes = crate::io::read_regular(&path)?;
        let bad = |why: String| Error::Tokenizer(format!("{}: {why}", path.display()));
        let ids: HashMap<String, usize> = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not a JSON object of piece → id: {e}")))?;
        let id = |token: &str| {
            ids.get(token).copied().ok_or_else(|| {
                bad(format!(
                    "no `{token}` entry (Marian vocabularies hold </s>, <unk> and <pad>)"
                ))
            })
        };
        let special: HashSet<usize> = SPECIAL.iter().map(|t| id(t)).collect::<Result<_>>()?;
        let (unk, eos) = (id("<unk>")?, id("</s>")?);
        let pieces = ids.iter().map(|(p, &i)| (i, p.clone())).collect();
        Ok(MarianVocab {
            ids,
            pieces,
            unk,
            eos,
            special,
        })
    }

    /// The vocabulary's largest id and its piece.
    pub(crate) fn largest(&self) -> Option<(usize, String)> {
        self.pieces
            .iter()
            .max_by_key(|(&id, _)| id)
            .map(|(&id, p)| (id, p.clone()))
    }

    /// Ids of `text`: `source` (the converted `source.spm`, which splits out the
    /// special tokens) gives the pieces; `</s>` follows when `special`. With `max_len`,
    /// the pieces are cut first so that `</s>` stays.
    pub(crate) fn encode(
        &self,
        source: &tokenizers::Tokenizer,
        text: &str,
        special: bool,
        max_len: Option<usize>,
    ) -> std::result::Result<Vec<usize>, String> {
        let (code, rest) = match text.strip_prefix(">>").and_then(|t| t.find("<<")) {
            Some(end) => text.split_at(end + 4),
            None => ("", text),
        };
        let mut ids: Vec<usize> = Vec::new();
        if !code.is_empty() {
            ids.push(self.id(code).unwrap_or(self.unk));
        }
        let enc = source.encode(rest, false).map_err(|e| e.to_string())?;
        ids.extend(
            enc.get_tokens()
                .iter()
                .map(|t| self.id(t).unwrap_or(self.unk)),
        );
        if let Some(max) = max_len {
            ids.truncate(max.saturating_sub(usize::from(special)));
        }
        if special {
            ids.push(self.eos);
        }
        Ok(ids)
    }

    /// Text of `ids`; special tokens are written out, each followed by a space, when
    /// `keep_special` (as `MarianTokenizer.decode(…, skip_special_tokens=False)`).
    pub(crate) fn decode(&self, ids: &[usize], keep_special: bool) -> String {
        let mut out = String::new();
        for id in ids {
            let piece = self.pieces.get(id).map_or("<unk>", String::as_str);
            let special = self.special.contains(id) || !self.pieces.contains_key(id);
            match (special, keep_special) {
                (true, false) => {}
                (true, true) => {
                    out.push_str(piece);
                    out.push(' ');
                }
                (false, _) => out.push_str(piece),
            }
        }
        out.replace('▁', " ").trim().to_string()
    }

    /// The piece of `id`, if the vocabulary has one.
    pub(crate) fn piece(&self, id: usize) -> Option<&str> {
        self.pieces.get(&id).map(String::as_str)
    }

    /// The id of `token`, if the vocabulary has one.
    pub(crate) fn id(&self, token: &str) -> Option<usize> {
        self.ids.get(token).copied()
    }

    /// Whether `id` is one of `</s>`, `<unk>`, `<pad>`.
    pub(crate) fn is_special(&self, id: usize) -> bool {
        self.special.contains(&id)
    }
}
