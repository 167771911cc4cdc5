//! SentencePiece `.model` files (T5's `spiece.model`, Marian's `source.spm` and
//! `target.spm`) read without the C++ library: the protobuf is decoded here and turned
//! into a `tokenizers` Unigram tokenizer the way transformers' slow→fast converter
//! builds one (`SpmConverter`): the model's pieces and scores, its `Precompiled`
//! normalisation map, right strip, runs of spaces to one `▁`, and a `Metaspace`
//! pre-tokeniser and decoder. The `▁` before the text follows the model's own
//! `add_dummy_prefix`, as the `sentencepiece` library (and so transformers' slow
//! `T5Tokenizer` and `MarianTokenizer`) encodes.

use std::path::Path;

use base64::Engine;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::text::guards;

/// The model in the file at `path`; errors name the file.
pub(crate) fn read(path: &Path) -> Result<SpmModel> {
    parse(&crate::io::read_regular(path)?)
        .map_err(|why| Error::Tokenizer(format!("{}: {why}", path.display())))
}

/// What a `.model` file says, as far as encoding and decoding need it.
pub(crate) struct SpmModel {
    /// (piece, score, type): type 1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte
    pieces: Vec<(String, f32, u64)>,
    unk_id: usize,
    byte_fallback: bool,
    charsmap: Vec<u8>,
    add_dummy_prefix: bool,
}

const UNKNOWN: u64 = 2;
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

/// Decodes a serialized `ModelProto`. Errors say what is wrong with the bytes.
fn parse(bytes: &[u8]) -> std::result::Result<SpmModel, String> {
    let mut model = SpmModel {
        pieces: Vec::new(),
        unk_id: 0,
        byte_fallback: false,
        charsmap: Vec::new(),
        add_dummy_prefix: true,
    };
    let mut model_type = 1;
    let mut top = Reader::new(bytes);
    while let Some((field, value)) = top.next()? {
        match (field, value) {
            (1, Wire::Bytes(b)) => model.pieces.push(piece(b)?),
            (2, Wire::Bytes(b)) => {
                let mut r = Reader::new(b);
                while let Some(f) = r.next()? {
                    match f {
                        (3, Wire::Varint(v)) => model_type = v,
                        (35, Wire::Varint(v)) => model.byte_fallback = v != 0,
                        (40, Wire::Varint(v)) => model.unk_id = v as usize,
                        _ => {}
                    }
                }
            }
            (3, Wire::Bytes(b)) => {
                let mut r = Reader::new(b);
                while let Some(f) = r.next()? {
                    match f {
                        (2, Wire::Bytes(map)) => model.charsmap = map.to_vec(),
                        (3, Wire::Varint(v)) => model.add_dummy_prefix = v != 0,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if model_type != 1 {
        return Err(format!(
            "a SentencePiece model of type {model_type} (BPE, word or char); only Unigram models (type 1, Marian's and T5's) are read"
        ));
    }
    if model.pieces.is_empty() {
        return Err("no pieces: not a SentencePiece model".into());
    }
    if model.unk_id >= model.pieces.len() {
        return Err(format!(
            "unk_id {} is outside its {} pieces",
            model.unk_id,
            model.pieces.len()
        ));
    }
    Ok(model)
}

/// One `SentencePiece` message: piece (1), score (2), type (3, default normal).
fn piece(bytes: &[u8]) -> std::result::Result<(String, f32, u64), String> {
    let (mut text, mut score, mut kind) = (None, 0.0, 1);
    let mut r = Reader::new(bytes);
    while let Some(f) = r.next()? {
        match f {
            (1, Wire::Bytes(b)) => {
                text = Some(String::from_utf8(b.to_vec()).map_err(|_| "a piece is not UTF-8")?)
            }
            (2, Wire::Fixed32(bits)) => score = f32::from_bits(bits),
            (3, Wire::Varint(v)) => kind = v,
            _ => {}
        }
    }
    if !score.is_finite() {
        return Err(format!("piece {text:?} has score {score}"));
    }
    Ok((text.ok_or("a piece without text")?, score, kind))
}

impl SpmModel {
    /// `tokenizer.json` for this model (see the module docs); `post_processor` is the
    /// template that adds the family's special tokens, if it adds any, and `extra` are
    /// special tokens the tokenizer knows beyond the model's pieces (T5's
    /// `<extra_id_N>`, Marian's `</s>`), given the ids after the pieces in order.
    fn tokenizer_json(&self, post_processor: Option<Value>, extra: &[String]) -> Value {
        let mut normalizers = Vec::new();
        if !self.charsmap.is_empty() {
            normalizers.push(json!({
                "type": "Precompiled",
                "precompiled_charsmap": base64::engine::general_purpose::STANDARD.encode(&self.charsmap),
            }));
        }
        normalizers.push(json!({"type": "Strip", "strip_left": false, "strip_right": true}));
        normalizers.push(json!({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": "▁"}));
        let metaspace = json!({
            "type": "Metaspace",
            "replacement": "▁",
            "prepend_scheme": if self.add_dummy_prefix { "always" } else { "never" },
            "split": true,
        });
        // control and user-defined pieces are matched whole; control ones and the
        // unknown piece are special (skipped when decoding, as the slow tokenizers do)
        let added_token = |id: usize, text: &str, special: bool| {
            json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            })
        };
        let added: Vec<Value> = self
            .pieces
            .iter()
            .enumerate()
            .filter(|(_, (_, _, kind))| matches!(*kind, UNKNOWN | CONTROL | USER_DEFINED))
            .map(|(id, (text, _, kind))| added_token(id, text, *kind != USER_DEFINED))
            .chain(
                extra
                    .iter()
                    .enumerate()
                    .map(|(i, text)| added_token(self.pieces.len() + i, text, true)),
            )
            .collect();
        let vocab: Vec<Value> = self
            .pieces
            .iter()
            .map(|(text, score, _)| json!([text, score]))
            .chain(extra.iter().map(|text| json!([text, 0.0])))
            .collect();
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": normalizers},
            "pre_tokenizer": metaspace,
            "post_processor": post_processor,
            "decoder": metaspace,
            "model": {
                "type": "Unigram",
                "unk_id": self.unk_id,
                "vocab": vocab,
                "byte_fallback": self.byte_fallback,
            },
        })
    }

    /// This model as a `tokenizers` tokenizer (see [`SpmModel::tokenizer_json`]); errors
    /// name `path`, the model's file.
    pub(crate) fn tokenizer(
        &self,
        path: &Path,
        post_processor: Option<Value>,
        extra: &[String],
    ) -> Result<tokenizers::Tokenizer> {
        let refuse = |why: String| Error::Tokenizer(format!("{}: {why}", path.display()));
        let json = self.tokenizer_json(post_processor, extra);
        // the file's character map goes to the same parser as a tokenizer.json's, and
        // gets the same checks first
        guards::before_load(&json).map_err(refuse)?;
        let text = serde_json::to_string(&json).expect("a JSON value serialises");
        let inner = tokenizers::Tokenizer::from_bytes(text.as_bytes())
            .map_err(|e| refuse(e.to_string()))?;
        guards::after_load(&inner).map_err(refuse)?;
        Ok(inner)
    }

    /// The id of the piece `text`, if the model has it.
    pub(crate) fn id_of(&self, text: &str) -> Option<usize> {
        self.pieces.iter().position(|(p, _, _)| p == text)
    }
}

/// A protobuf field's value by wire type (groups, long deprecated, are refused).
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Reads the fields of one protobuf message in order.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .buf
                .get(self.at)
                .ok_or("the file ends inside a number")?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a number longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or("a field runs past the end of the file")?;
        let out = &self.buf[self.at..end];
        self.at = end;
        Ok(out)
    }

    /// The next (field number, value), or `None` at the end of the message.
    fn next(&mut self) -> std::result::Result<Option<(u64, Wire<'a>)>, String> {
        if self.at == self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed64
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| "a field length overflows")?;
                Wire::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                Wire::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            wire => {
                return Err(format!(
                    "wire type {wire}: not one a SentencePiece model uses"
                ))
            }
        };
        Ok(Some((key >> 3, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_foreign_bytes_are_errors_not_panics() {
        for bytes in [
            &b""[..],
            &[0x0a][..],
            &[0x0a, 0x05, 0x0a][..],
            &[0xff; 12][..],
            &[0x0b][..],
            b"not a model at all",
        ] {
            assert!(parse(bytes).is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn a_hand_built_model_reads_back() {
        // pieces "<unk>" (type 2) and "▁a" (score −1.5), trainer_spec unk_id 0
        let mut bytes = Vec::new();
        for (text, score, kind) in [("<unk>", 0.0f32, 2u8), ("▁a", -1.5, 1)] {
            let mut p = vec![0x0a, text.len() as u8];
            p.extend(text.as_bytes());
            p.push(0x15);
            p.extend(score.to_le_bytes());
            p.extend([0x18, kind]);
            bytes.extend([0x0a, p.len() as u8]);
            bytes.extend(p);
        }
        bytes.extend([0x12, 0x02, 0x18, 0x01]);
        let m = parse(&bytes).unwrap();
        assert_eq!(m.pieces[1], ("▁a".to_string(), -1.5, 1));
        assert_eq!((m.unk_id, m.add_dummy_prefix), (0, true));
        assert_eq!(m.id_of("▁a"), Some(1));
    }
}
