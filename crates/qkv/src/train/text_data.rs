//! Byte-level language modelling on any file: the vocabulary is the 256 byte values.
//!
//! Why bytes rather than the file's characters: the vocabulary is fixed, so it never
//! has to be stored, a model trained on one file can read any other text, the
//! validation split can hold no character the training split lacks, and any encoding
//! (or a binary file) works. The cost is that a non-ASCII character takes 2–4 tokens;
//! for the English text these toy models train on, bytes and characters coincide.
//!
//! The file is split once: the first `1 − val_fraction` of its bytes train, the last
//! `val_fraction` validate (a contiguous tail, so no window straddles both; nanoGPT's
//! split). `n_val = round(n · val_fraction)`. A batch is `B` windows of `T + 1`
//! consecutive bytes starting at uniform random offsets in one split; each window `w`
//! gives `inputs = w[0..T]` and `targets = w[1..T+1]`, every position scored.
//!
//! ```
//! use qkv::rng::Rng;
//! use qkv::train::text_data::{Split, TextData};
//! let data = TextData::from_bytes("inline", b"hello, world! hello, attention!".to_vec(), 4, 0.25)?;
//! let batch = data.batch(Split::Train, 2, &mut Rng::new(1))?;
//! assert_eq!(batch.inputs.len(), 2 * 4);
//! assert_eq!(batch.targets[0], batch.inputs[1] as i64); // shifted by one
//! # Ok::<(), qkv::Error>(())
//! ```

use std::path::Path;

use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::train::trainable::Batch;

/// Vocabulary size of byte-level modelling.
pub const BYTE_VOCAB: usize = 256;

/// Which part of the file to draw windows from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Validation,
}

/// A text file split into training and validation bytes, sampled as windows of
/// `seq_len + 1` bytes.
#[derive(Clone, Debug)]
pub struct TextData {
    name: String,
    train: Vec<u8>,
    validation: Vec<u8>,
    seq_len: usize,
}

impl TextData {
    /// Reads `path`. Errors naming the file when it cannot be read, is empty, or is
    /// too short for one window of `seq_len + 1` bytes in each split.
    pub fn open(path: impl AsRef<Path>, seq_len: usize, val_fraction: f64) -> Result<Self> {
        let path = path.as_ref();
        let bytes = crate::io::read_regular(path)?;
        TextData::from_bytes(&path.display().to_string(), bytes, seq_len, val_fraction)
    }

    /// As [`TextData::open`] for bytes already in memory; `name` appears in errors.
    /// `val_fraction` in `[0, 1)`; 0 means no validation split.
    pub fn from_bytes(
        name: &str,
        bytes: Vec<u8>,
        seq_len: usize,
        val_fraction: f64,
    ) -> Result<Self> {
        if seq_len == 0 {
            return Err(Error::invalid("seq_len", "must be at least 1"));
        }
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(Error::invalid(
                "val_fraction",
                format!("{val_fraction} is outside [0, 1)"),
            ));
        }
        if bytes.is_empty() {
            return Err(Error::invalid(name, "the file is empty"));
        }
        let window = seq_len + 1;
        let n = bytes.len();
        if !fits(n, window, val_fraction) {
            let needed = min_len(window, val_fraction);
            let parts = if val_fraction > 0.0 {
                format!(
                    "one window of {window} bytes (seq_len {seq_len} + 1) in the training and in the \
                     validation split ({val_fraction} of the file)"
                )
            } else {
                format!("one window of {window} bytes (seq_len {seq_len} + 1)")
            };
            return Err(Error::invalid(
                name,
                format!("{n} bytes is too short: need at least {needed} bytes for {parts}"),
            ));
        }
        let n_val = val_len(n, val_fraction);
        let mut train = bytes;
        let validation = train.split_off(n - n_val);
        Ok(TextData {
            name: name.to_string(),
            train,
            validation,
            seq_len,
        })
    }

    /// The file name (or the name given to [`TextData::from_bytes`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn vocab_size(&self) -> usize {
        BYTE_VOCAB
    }

    /// Model input length `T`.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    pub fn has_validation(&self) -> bool {
        !self.validation.is_empty()
    }

    /// The bytes of one split.
    pub fn bytes(&self, split: Split) -> &[u8] {
        match split {
            Split::Train => &self.train,
            Split::Validation => &self.validation,
        }
    }

    /// Number of distinct window start offsets in `split`.
    pub fn windows(&self, split: Split) -> usize {
        (self.bytes(split).len() + 1).saturating_sub(self.seq_len + 1)
    }

    /// The window starting at `start` in `split`: `(inputs [T], targets [T])` with
    /// `targets[t] = inputs[t + 1]` and the last target the byte after the inputs.
    /// Panics if the window does not fit (`start ≥ windows(split)`).
    pub fn window(&self, split: Split, start: usize) -> (Vec<usize>, Vec<i64>) {
        let w = &self.bytes(split)[start..start + self.seq_len + 1];
        let inputs = w[..self.seq_len].iter().map(|&b| b as usize).collect();
        let targets = w[1..].iter().map(|&b| b as i64).collect();
        (inputs, targets)
    }

    /// `batch_size` windows at uniform random offsets of `split`, drawn in order from
    /// `rng` (the same seed gives the same batch: pass a fresh `Rng::new(seed)` for a
    /// fixed validation set). Errors when `split` is empty (no validation requested).
    pub fn batch(&self, split: Split, batch_size: usize, rng: &mut Rng) -> Result<Batch> {
        let starts = self.windows(split);
        if starts == 0 {
            return Err(Error::invalid(
                "split",
                format!(
                    "{}: the {split:?} split is empty (val_fraction 0)",
                    self.name
                ),
            ));
        }
        let t = self.seq_len;
        let mut inputs = Vec::with_capacity(batch_size * t);
        let mut targets = Vec::with_capacity(batch_size * t);
        for _ in 0..batch_size {
            let start = rng.below(starts);
            let w = &self.bytes(split)[start..start + t + 1];
            inputs.extend(w[..t].iter().map(|&b| b as usize));
            targets.extend(w[1..].iter().map(|&b| b as i64));
        }
        Ok(Batch::rows(inputs, targets, batch_size, t))
    }
}

/// Byte ids of `text` (its UTF-8 encoding).
pub fn encode(text: &str) -> Vec<usize> {
    text.bytes().map(usize::from).collect()
}

/// Text of byte ids, invalid UTF-8 replaced by U+FFFD. Ids ≥ 256 are an error.
pub fn decode(ids: &[usize]) -> Result<String> {
    let bytes = ids
        .iter()
        .map(|&i| {
            u8::try_from(i).map_err(|_| Error::OutOfRange {
                what: "byte token id".into(),
                index: i,
                size: BYTE_VOCAB,
            })
        })
        .collect::<Result<Vec<u8>>>()?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn val_len(n: usize, val_fraction: f64) -> usize {
    ((n as f64) * val_fraction).round() as usize
}

fn fits(n: usize, window: usize, val_fraction: f64) -> bool {
    let n_val = val_len(n, val_fraction);
    n_val <= n && n - n_val >= window && (val_fraction == 0.0 || n_val >= window)
}

/// The smallest file length for which [`fits`] holds.
fn min_len(window: usize, val_fraction: f64) -> usize {
    // Both parts grow with n, so `fits` is monotone: estimate, then walk to the edge.
    let f = val_fraction;
    let mut est = window as f64 / (1.0 - f);
    if f > 0.0 {
        est = est.max((window as f64 - 0.5) / f);
    }
    let mut n = (est.floor() as usize).max(window);
    while n > window && fits(n - 1, window, f) {
        n -= 1;
    }
    while !fits(n, window, f) {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_len_is_the_edge() {
        for window in [1, 2, 9, 257] {
            for f in [0.0, 0.001, 0.1, 0.5, 0.9] {
                let n = min_len(window, f);
                assert!(fits(n, window, f), "{window} {f} {n}");
                assert!(n == 1 || !fits(n - 1, window, f), "{window} {f} {n}");
            }
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let s = "naïve → attention";
        assert_eq!(decode(&encode(s)).unwrap(), s);
        assert!(decode(&[256]).is_err());
    }
}
