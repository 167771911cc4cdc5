//! Checks on a `tokenizer.json` (read, or converted from a SentencePiece model) for what the `tokenizers` crate (0.22) would panic on
//! instead of returning an error. Each was found by fuzzing (`fuzz/regressions/tokenizer/`)
//! or by reading the crate's source after such a find; each check refuses the file with
//! a message that names the part at fault.
//!
//! - a JSON syntax error inside or after `"decoder"` panics in the decoder's
//!   deserialiser (`expect("Helper")`): the whole file is parsed first;
//! - a `Precompiled` normaliser (SentencePiece's compiled character map) whose map does
//!   not parse panics while loading (`expect("Precompiled")`), one whose header
//!   announces a trie longer than the map makes it reserve up to 8 GiB first
//!   (`fuzz/regressions/sentencepiece/`), and one whose trie points outside itself
//!   panics on the first text it normalises;
//! - a `TemplateProcessing` whose templates name a special token that its own
//!   `special_tokens` lacks panics at encode time;
//! - a `Strip` decoder with `stop` > 0 slices before the start of a short token.

use base64::Engine;
use serde_json::Value;

/// Checks on the parsed file, before the `tokenizers` crate reads it.
pub fn before_load(file: &Value) -> Result<(), String> {
    match file.get("normalizer") {
        Some(normalizer) => check_precompiled(normalizer),
        None => Ok(()),
    }
}

/// Checks on the parts as the `tokenizers` crate read them (its own serialisation, so
/// untagged and legacy spellings in the file are already resolved).
pub fn after_load(tokenizer: &tokenizers::Tokenizer) -> Result<(), String> {
    if let Some(post) = tokenizer.get_post_processor() {
        let post = serde_json::to_value(post).map_err(|e| e.to_string())?;
        check_templates(&post)?;
    }
    if let Some(decoder) = tokenizer.get_decoder() {
        let decoder = serde_json::to_value(decoder).map_err(|e| e.to_string())?;
        check_strip(&decoder)?;
    }
    Ok(())
}

/// Every object of `tree` (itself included) whose `type` is `kind`.
fn each_of_type<'a>(tree: &'a Value, kind: &str, found: &mut Vec<&'a Value>) {
    match tree {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some(kind) {
                found.push(tree);
            }
            map.values().for_each(|v| each_of_type(v, kind, found));
        }
        Value::Array(items) => items.iter().for_each(|v| each_of_type(v, kind, found)),
        _ => {}
    }
}

fn check_templates(post: &Value) -> Result<(), String> {
    let mut templates = Vec::new();
    each_of_type(post, "TemplateProcessing", &mut templates);
    for t in templates {
        let specials = t.get("special_tokens").and_then(Value::as_object);
        for (id, token) in specials.into_iter().flatten() {
            let count = |k: &str| token.get(k).and_then(Value::as_array).map_or(0, Vec::len);
            if count("ids") != count("tokens") {
                return Err(format!(
                    "post_processor: special token {id:?} has {} ids but {} tokens",
                    count("ids"),
                    count("tokens")
                ));
            }
        }
        for which in ["single", "pair"] {
            let pieces = t.get(which).and_then(Value::as_array).into_iter().flatten();
            for piece in pieces {
                let Some(id) = piece.get("SpecialToken").and_then(|s| s.get("id")) else {
                    continue;
                };
                let id = id.as_str().unwrap_or_default();
                if !specials.is_some_and(|s| s.contains_key(id)) {
                    return Err(format!(
                        "post_processor: the {which} template names special token {id:?}, which its special_tokens does not define"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check_strip(decoder: &Value) -> Result<(), String> {
    let mut strips = Vec::new();
    each_of_type(decoder, "Strip", &mut strips);
    match strips
        .iter()
        .find_map(|s| s.get("stop").and_then(Value::as_u64).filter(|&n| n > 0))
    {
        Some(stop) => Err(format!(
            "decoder: a Strip decoder with stop {stop} is not supported (the tokenizers crate cuts before the start of tokens shorter than stop); only stop 0 is"
        )),
        None => Ok(()),
    }
}

fn check_precompiled(normalizer: &Value) -> Result<(), String> {
    let mut maps = Vec::new();
    each_of_type(normalizer, "Precompiled", &mut maps);
    for map in maps {
        let err = |why: String| format!("normalizer: Precompiled precompiled_charsmap {why}");
        // the header first: spm_precompiled reserves room for as many trie units as its
        // 4-byte header announces before it reads them (up to 8 GiB); a map the base64
        // decoder here does not read goes on to the crate's own reader below
        if let Some(bytes) = map["precompiled_charsmap"]
            .as_str()
            .and_then(|text| base64::engine::general_purpose::STANDARD.decode(text).ok())
        {
            check_header(&bytes).map_err(err)?;
        }
        // read as the tokenizers crate reads it (from text: it borrows the base64
        // string), so the same files load; its serialisation gives the map's bytes back
        // in canonical base64
        let parsed: tokenizers::normalizers::precompiled::Precompiled =
            serde_json::from_str(&map.to_string()).map_err(|e| err(e.to_string()))?;
        let canonical = serde_json::to_value(&parsed).map_err(|e| err(e.to_string()))?;
        let text = canonical["precompiled_charsmap"]
            .as_str()
            .unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| err(format!("is not base64: {e}")))?;
        check_charsmap(&bytes).map_err(err)?;
    }
    Ok(())
}

/// SentencePiece's compiled character map: a little-endian u32 byte length of a
/// double-array trie of u32 units, the trie, then the replacement strings (UTF-8, each
/// ended by a 0 byte). `spm_precompiled` walks the trie without bounds checks, so every
/// place a walk can reach must be inside the trie, and every replacement offset inside
/// the strings at a character boundary.
/// The map's 4-byte header: the trie's length in bytes, which must fit in the map.
fn check_header(bytes: &[u8]) -> Result<(), String> {
    let (head, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or("is shorter than its 4-byte header")?;
    match u32::from_le_bytes(*head) as usize {
        n if n <= rest.len() => Ok(()),
        n => Err(format!(
            "announces a trie of {n} bytes in {} bytes",
            rest.len()
        )),
    }
}

fn check_charsmap(bytes: &[u8]) -> Result<(), String> {
    let (head, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or("is shorter than its 4-byte header")?;
    let trie_bytes = u32::from_le_bytes(*head) as usize / 4 * 4;
    // spm_precompiled has already refused a header longer than the map
    let (trie, strings) = rest
        .split_at_checked(trie_bytes)
        .ok_or("is shorter than its header says")?;
    let units: Vec<usize> = trie
        .chunks_exact(4)
        .map(|u| u32::from_le_bytes([u[0], u[1], u[2], u[3]]) as usize)
        .collect();
    let strings = std::str::from_utf8(strings)
        .map_err(|e| format!("has replacements that are not UTF-8: {e}"))?;
    check_trie(&units, strings)
}

/// Walks every path of the double-array trie as `spm_precompiled`'s
/// `common_prefix_search` would on some input, checking each index it would read.
fn check_trie(units: &[usize], strings: &str) -> Result<(), String> {
    // the unit layout of darts-clone: label in bits 0-7 (and 31), a leaf flag in bit 8,
    // the offset to the children in bits 10-30 (shifted by 8 more when bit 9 is set)
    let offset = |u: usize| (u >> 10) << ((u & (1 << 9)) >> 6);
    let label = |u: usize| u & ((1 << 31) | 0xFF);
    let has_leaf = |u: usize| (u >> 8) & 1 == 1;
    let value = |u: usize| u & ((1 << 31) - 1);
    let root = *units.first().ok_or("has an empty trie")?;
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![offset(root)];
    while let Some(base) = todo.pop() {
        for byte in 1..=255usize {
            let at = base ^ byte;
            let unit = *units.get(at).ok_or_else(|| {
                format!(
                    "has a trie that points outside itself ({at} of {})",
                    units.len()
                )
            })?;
            if label(unit) != byte {
                continue;
            }
            let next = at ^ offset(unit);
            if has_leaf(unit) {
                let leaf = *units.get(next).ok_or_else(|| {
                    format!("has a trie leaf outside itself ({next} of {})", units.len())
                })?;
                let start = value(leaf);
                if !strings.is_char_boundary(start) {
                    return Err(format!(
                        "has a replacement at byte {start}, outside its {} bytes of strings or inside a character",
                        strings.len()
                    ));
                }
            }
            // at most one `next` per unit, so the walk ends
            if seen.insert(next) {
                todo.push(next);
            }
        }
    }
    Ok(())
}
