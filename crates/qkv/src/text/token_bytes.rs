//! The bytes each token stands for, as a table: what OpenAI's `logprobs` report as a
//! token's `bytes`, and what a grammar needs to know which tokens may come next. A
//! token's text alone cannot say it: a byte-level token may hold part of a character.
//!
//! Read from the vocabulary's pieces by the decoder's scheme: byte-level BPE (GPT-2's
//! alphabet, one character a byte), byte fallback (`<0x0A>` is byte 0x0A), SentencePiece's
//! `▁` for a space, WordPiece's `##` for a word's continuation. Added tokens (`<|im_end|>`)
//! are their own text.

use serde_json::Value;

/// How a vocabulary's pieces spell bytes, read from `tokenizer.json`'s decoder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spelling {
    /// Pieces are in GPT-2's byte alphabet.
    pub byte_level: bool,
    /// `<0xNN>` pieces are single bytes.
    pub byte_fallback: bool,
    /// `▁` stands for a space.
    pub metaspace: bool,
    /// A leading `##` marks a word's continuation (no space before it).
    pub wordpiece: bool,
}

impl Spelling {
    /// The scheme of a decoder as `tokenizer.json` writes it (a `Sequence` of decoders
    /// counts each member); `None` (no decoder) spells pieces as they are.
    pub fn of_decoder(decoder: Option<&Value>) -> Spelling {
        let mut s = Spelling::default();
        let mut visit = vec![decoder];
        while let Some(Some(d)) = visit.pop() {
            match d["type"].as_str() {
                Some("ByteLevel") => s.byte_level = true,
                Some("ByteFallback") => s.byte_fallback = true,
                Some("Metaspace") => s.metaspace = true,
                Some("WordPiece") => s.wordpiece = true,
                Some("Replace") if d["pattern"]["String"] == "▁" => s.metaspace = true,
                Some("Sequence") => {
                    visit.extend(d["decoders"].as_array().into_iter().flatten().map(Some))
                }
                _ => {}
            }
        }
        s
    }

    /// The bytes of a vocabulary piece (not an added token).
    pub fn bytes(&self, piece: &str) -> Vec<u8> {
        if self.byte_fallback {
            if let Some(b) = fallback_byte(piece) {
                return vec![b];
            }
        }
        if self.byte_level {
            if let Some(bytes) = piece.chars().map(super::bytes::char_byte).collect() {
                return bytes;
            }
        }
        let piece = match self.wordpiece {
            true => piece.strip_prefix("##").unwrap_or(piece),
            false => piece,
        };
        match self.metaspace {
            true => piece.replace('▁', " ").into_bytes(),
            false => piece.as_bytes().to_vec(),
        }
    }
}

/// The byte of a `<0xNN>` piece.
fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_scheme_spells_its_pieces_as_bytes() {
        let gpt2 = Spelling::of_decoder(Some(&json!({"type": "ByteLevel"})));
        // "Ġ" is the space, "Ã" "©" two bytes of "é"; a piece may hold half a character
        assert_eq!(gpt2.bytes("Ġcaf"), b" caf");
        assert_eq!(gpt2.bytes("Ã©"), "é".as_bytes());
        assert_eq!(gpt2.bytes("Ã"), [0xC3]);
        let llama = Spelling::of_decoder(Some(&json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]})));
        assert_eq!(llama.bytes("▁the"), b" the");
        assert_eq!(llama.bytes("<0x0A>"), b"\n");
        assert_eq!(llama.bytes("<0xE2>"), [0xE2]);
        let bert = Spelling::of_decoder(Some(&json!({"type": "WordPiece", "prefix": "##"})));
        assert_eq!(bert.bytes("##ing"), b"ing");
        assert_eq!(Spelling::of_decoder(None).bytes("<s>"), b"<s>");
    }
}
