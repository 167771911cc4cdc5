//! The tokenizer of byte-level models (`qkv train --text`): token id = byte value, as
//! `qkv::train::text_data` feeds them. Written as a Hugging Face `tokenizer.json`
//! so that the `tokenizers` crate, transformers and `qkv generate --prompt` read the
//! saved model's text: a byte-level BPE (GPT-2's scheme) whose 256 tokens are the
//! single bytes, in byte order, with no merges, so every byte stays its own token.

use serde_json::json;

/// GPT-2's printable stand-in for byte `b`: the printable Latin-1 bytes stand for
/// themselves, the others (controls, space, soft hyphen, …) for U+0100 onwards in
/// byte order. This is the alphabet the `ByteLevel` pre-tokeniser maps bytes to.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).expect("below U+0144")
}

/// The byte GPT-2's alphabet spells with `c` ([`byte_char`]'s inverse), if any. Its
/// characters are all below U+0144, so the inverse is a table of that many.
pub(crate) fn char_byte(c: char) -> Option<u8> {
    static INVERSE: std::sync::OnceLock<[Option<u8>; 0x144]> = std::sync::OnceLock::new();
    let table = INVERSE.get_or_init(|| {
        let mut t = [None; 0x144];
        for b in 0..=255u8 {
            t[byte_char(b) as usize] = Some(b);
        }
        t
    });
    table.get(c as usize).copied().flatten()
}

/// `tokenizer.json` of the byte vocabulary.
pub fn byte_tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), json!(b)))
        .collect();
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false
    });
    let file = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": []
        }
    });
    serde_json::to_string_pretty(&file).expect("JSON values serialise")
}

/// `tokenizer_config.json` beside it: transformers' `AutoTokenizer` then loads the
/// file as it is (`PreTrainedTokenizerFast`), whatever the model's family.
pub fn byte_tokenizer_config(max_positions: Option<usize>) -> String {
    let mut config = json!({"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": false});
    if let Some(n) = max_positions {
        config["model_max_length"] = json!(n);
    }
    serde_json::to_string_pretty(&config).expect("JSON values serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_has_its_own_printable_character() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b'A'), 'A');
        // GPT-2's `Ġ` is the space, `Ċ` the newline
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(0xAD), 'Ń');
    }
}
