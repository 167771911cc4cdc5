//! Readable labels for tokens, for attention maps: what each token adds to the decoded
//! text, whatever the vocabulary's spelling. WordPiece's `##ing` is "ing" glued to the
//! word before, byte-level BPE's `Ġanimal` and SentencePiece's `▁animal` are " animal",
//! and byte tokens (`<0xE4>`, or GPT-2's bytes of a Chinese character) that hold only
//! part of a character are labelled with the character they help spell.
//!
//! The labels come from the tokenizer's own decoder, run on a short window before each
//! token: the token's text is what decoding it adds to the window's text. So every
//! decoder the tokenizer file names is handled by the code that defines it.

use crate::error::Result;

/// Tokens decoded before each one to give it its context: enough for every decoder's
/// word-boundary rules, short enough that labelling stays linear in the length.
const WINDOW: usize = 8;

/// Most tokens one group of partial characters may span before it is cut: a character
/// is at most 4 bytes, and a byte token may end inside the next character.
const MAX_GROUP: usize = 8;

/// The decoder's replacement for bytes that are not (yet) whole UTF-8.
const REPLACEMENT: char = '\u{FFFD}';

/// One token of a sequence, as an attention map labels it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TokenLabel {
    pub id: usize,
    /// The vocabulary's spelling (`Ġanimal`, `##ing`, `▁the`, `<0xE4>`, `[CLS]`), or
    /// `#ID` when there is no vocabulary.
    pub piece: String,
    /// What the token adds to the decoded text, leading space included (" animal").
    /// A token holding part of a character's bytes has the characters it touches:
    /// each of the three byte tokens of `龙` has "龙".
    pub text: String,
    /// A special token: the tokenizer's (`[CLS]`, `</s>`) or the model's (BOS, EOS, pad).
    pub special: bool,
    /// For one of `n` consecutive byte tokens with the same text (one character's
    /// pieces), its place `k` (1-based): `(k, n)`.
    pub part: Option<(usize, usize)>,
}

impl TokenLabel {
    /// A short label for a map's axis: the text without surrounding white space (`␣`
    /// or `↵` when that is all there is), with a superscript `k` on the `k`-th piece of
    /// a character split over several tokens (`中¹`, `中²`).
    pub fn label(&self) -> String {
        let trimmed = self.text.trim();
        let base = match trimmed {
            "" if self.text.contains('\n') => "↵",
            "" if !self.text.is_empty() => "␣",
            "" => self.piece.as_str(),
            t => t,
        };
        match self.part {
            Some((k, _)) => format!("{base}{}", superscript(k)),
            None => base.to_string(),
        }
    }

    /// Labels for bare ids, when the folder has no tokenizer: `#ID`, special when the
    /// model says so.
    pub fn from_ids(ids: &[usize], special: impl Fn(usize) -> bool) -> Vec<TokenLabel> {
        ids.iter()
            .map(|&id| TokenLabel {
                id,
                piece: format!("#{id}"),
                text: format!("#{id}"),
                special: special(id),
                part: None,
            })
            .collect()
    }
}

fn superscript(k: usize) -> String {
    const DIGITS: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    k.to_string()
        .bytes()
        .map(|b| DIGITS[(b - b'0') as usize])
        .collect()
}

/// Byte length of the longest common prefix of `a` and `b`, on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or_else(|| a.len().min(b.len()), |((at, _), _)| at)
}

/// Labels `ids` with `decode` (the tokenizer's decoder, special tokens kept), `piece`
/// (an id's vocabulary entry) and `special`.
pub fn label_tokens(
    ids: &[usize],
    decode: impl Fn(&[usize]) -> Result<String>,
    piece: impl Fn(usize) -> String,
    special: impl Fn(usize) -> bool,
) -> Result<Vec<TokenLabel>> {
    let mut out = Vec::with_capacity(ids.len());
    let mut group = 0usize; // the first token not yet labelled
    let mut steps = Vec::new(); // the group's decoded text after each of its tokens
    for i in 0..ids.len() {
        let from = group.saturating_sub(WINDOW);
        let before = decode(&ids[from..group])?;
        let after = decode(&ids[from..=i])?;
        let added = after[common_prefix(&before, &after).min(after.len())..].to_string();
        let partial = added.ends_with(REPLACEMENT)
            && !special(ids[i])
            && i + 1 < ids.len()
            && i + 1 - group < MAX_GROUP;
        steps.push(added);
        if partial {
            continue;
        }
        let texts = split_group(&steps);
        let runs = runs_of_equal(&texts);
        for (k, (&id, text)) in ids[group..=i].iter().zip(texts).enumerate() {
            out.push(TokenLabel {
                id,
                piece: piece(id),
                text,
                special: special(id),
                part: (steps.len() > 1 && runs[k].1 > 1).then_some(runs[k]),
            });
        }
        steps.clear();
        group = i + 1;
    }
    Ok(out)
}

/// Each token's text in a group of byte tokens, from the group's text after each token
/// (`steps`; a step ending in U+FFFD stops inside a character): the characters the token
/// completes, then the character it starts but leaves unfinished.
fn split_group(steps: &[String]) -> Vec<String> {
    let done: Vec<&str> = steps
        .iter()
        .map(|s| s.trim_end_matches(REPLACEMENT))
        .collect();
    let new: Vec<&str> = done
        .iter()
        .enumerate()
        .map(|(k, d)| match k {
            0 => d,
            _ => &d[common_prefix(done[k - 1], d).min(d.len())..],
        })
        .collect();
    (0..steps.len())
        .map(|k| {
            let mut text = new[k].to_string();
            if steps[k].ends_with(REPLACEMENT) {
                let next = new[k + 1..].iter().find_map(|n| n.chars().next());
                text.push(next.unwrap_or(REPLACEMENT));
            }
            text
        })
        .collect()
}

/// For each entry, (its 1-based place, the length) of the run of equal entries it is in.
fn runs_of_equal(texts: &[String]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(texts.len());
    let mut start = 0;
    for end in 1..=texts.len() {
        if end == texts.len() || texts[end] != texts[start] {
            out.extend((1..=end - start).map(|k| (k, end - start)));
            start = end;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy byte-level decoder: each id is one byte, invalid UTF-8 is replaced.
    fn bytes(ids: &[usize]) -> Result<String> {
        let b: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    #[test]
    fn bytes_of_one_character_share_it_and_are_numbered() {
        let ids: Vec<usize> = " 中a".bytes().map(usize::from).collect();
        let labels = label_tokens(&ids, bytes, |i| format!("<{i:02X}>"), |_| false).unwrap();
        let shown: Vec<String> = labels.iter().map(TokenLabel::label).collect();
        assert_eq!(shown, ["␣", "中¹", "中²", "中³", "a"]);
        assert_eq!(labels[2].text, "中");
        assert_eq!(labels[2].part, Some((2, 3)));
    }

    #[test]
    fn a_cut_character_at_the_end_is_labelled_with_what_is_there() {
        let ids = [0x61, 0xE4, 0xB8];
        let labels = label_tokens(&ids, bytes, |i| format!("<{i:02X}>"), |_| false).unwrap();
        assert_eq!(labels.len(), 3);
        assert_eq!(labels[1].part, Some((1, 2)));
        assert_eq!(labels[2].text, "\u{FFFD}");
    }

    #[test]
    fn a_token_spanning_two_characters_has_both() {
        // 猫 = E7 8C AB, 坐 = E5 9D 90, split as [E7] [8C AB E5] [9D 90]
        let decode = |ids: &[usize]| {
            let b: Vec<u8> = ids
                .iter()
                .flat_map(|&i| match i {
                    0 => vec![0xE7],
                    1 => vec![0x8C, 0xAB, 0xE5],
                    _ => vec![0x9D, 0x90],
                })
                .collect();
            Ok(String::from_utf8_lossy(&b).into_owned())
        };
        let labels = label_tokens(&[0, 1, 2], decode, |i| format!("{i}"), |_| false).unwrap();
        let texts: Vec<&str> = labels.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["猫", "猫坐", "坐"]);
        assert!(labels.iter().all(|l| l.part.is_none()));
    }

    #[test]
    fn bare_ids_are_numbered() {
        let labels = TokenLabel::from_ids(&[5, 2], |i| i == 2);
        assert_eq!(labels[0].label(), "#5");
        assert!(labels[1].special && !labels[0].special);
    }
}
