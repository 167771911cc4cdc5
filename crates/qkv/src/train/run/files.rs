//! What a run writes besides its checkpoints: the tokenizer files that make the output a
//! model folder `qkv generate` reads, and the JSON log of its steps.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::error::{Error, Result};
use crate::io::write_atomic;
use crate::text::bytes::{byte_tokenizer_config, byte_tokenizer_json};

/// Files of a Hugging Face folder that describe tokens rather than weights: copied from
/// `init` into the output so that `qkv generate --prompt` works on it.
const TOKENIZER_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
];

/// Copies `from`'s tokenizer files into `to`, leaving those `to` already has.
pub fn copy_tokenizer_files(from: &Path, to: &Path) -> Result<()> {
    for name in TOKENIZER_FILES {
        let (src, dst) = (from.join(name), to.join(name));
        if src.is_file() && !dst.exists() {
            let bytes = crate::io::read_regular(&src)?;
            write_atomic(&dst, &bytes)?;
        }
    }
    Ok(())
}

/// The byte tokenizer a `text` run's ids are (id = byte), so that `--prompt` reads text.
pub fn write_byte_tokenizer(out: &Path, max_positions: Option<usize>) -> Result<()> {
    write_atomic(
        &out.join("tokenizer.json"),
        byte_tokenizer_json().as_bytes(),
    )?;
    write_atomic(
        &out.join("tokenizer_config.json"),
        byte_tokenizer_config(max_positions).as_bytes(),
    )
}

/// The JSON log: on a fresh run it starts empty; on a resumed one it keeps the lines
/// of the steps before the checkpoint (dropping any a crash logged after it), so the
/// finished log equals an uninterrupted run's.
pub fn open_log(path: &Path, start_step: u64) -> Result<File> {
    let io = |e| Error::io(path, e);
    let mut kept = Vec::new();
    if start_step > 0 && path.is_file() {
        let file = crate::io::open_regular(path)?;
        for line in BufReader::new(file).lines() {
            let line = line.map_err(io)?;
            let step = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
            if step.is_some_and(|s| s < start_step) {
                kept.extend_from_slice(line.as_bytes());
                kept.push(b'\n');
            }
        }
    }
    write_atomic(path, &kept)?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(io)
}
