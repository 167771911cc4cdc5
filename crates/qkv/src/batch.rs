//! `TokenBatch`: token ids `[B, T]` with a mask saying which are real tokens.

use crate::error::{Error, Result};

#[derive(Clone, Debug)]
pub struct TokenBatch {
    /// [B·T] token ids
    pub ids: Vec<usize>,
    /// [B·T], `true` for a real token, `false` for padding
    pub mask: Vec<bool>,
    pub batch: usize,
    pub len: usize,
}

impl TokenBatch {
    /// ids: `[B, T]` flattened; `mask` defaults to all real.
    pub fn new(ids: Vec<usize>, mask: Option<Vec<bool>>, batch: usize, len: usize) -> Result<Self> {
        if batch == 0 || len == 0 {
            return Err(Error::invalid(
                "input_ids",
                "empty input: need at least one token",
            ));
        }
        if ids.len() != batch * len {
            return Err(Error::Shape {
                tensor: "input_ids".into(),
                expected: format!("[{batch}, {len}]"),
                got: vec![ids.len()],
            });
        }
        let mask = mask.unwrap_or_else(|| vec![true; ids.len()]);
        if mask.len() != ids.len() {
            return Err(Error::Shape {
                tensor: "attention_mask".into(),
                expected: format!("[{batch}, {len}] like input_ids"),
                got: vec![mask.len()],
            });
        }
        Ok(TokenBatch {
            ids,
            mask,
            batch,
            len,
        })
    }

    /// These rows with `next`'s columns after them (as many rows).
    pub fn append(&self, next: &TokenBatch) -> Result<TokenBatch> {
        if next.batch != self.batch {
            return Err(Error::invalid(
                "input_ids",
                format!("{} rows to append to {}", next.batch, self.batch),
            ));
        }
        let len = self.len + next.len;
        let (mut ids, mut mask) = (Vec::with_capacity(self.batch * len), Vec::new());
        for r in 0..self.batch {
            ids.extend_from_slice(&self.ids[r * self.len..][..self.len]);
            ids.extend_from_slice(&next.ids[r * next.len..][..next.len]);
            mask.extend_from_slice(&self.mask[r * self.len..][..self.len]);
            mask.extend_from_slice(&next.mask[r * next.len..][..next.len]);
        }
        TokenBatch::new(ids, Some(mask), self.batch, len)
    }

    /// Row `rows[i]` of these as row i (a beam search keeping its best beams).
    pub fn select_rows(&self, rows: &[usize]) -> Result<TokenBatch> {
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for &r in rows {
            if r >= self.batch {
                return Err(Error::invalid("rows", format!("row {r} of {}", self.batch)));
            }
            ids.extend_from_slice(&self.ids[r * self.len..][..self.len]);
            mask.extend_from_slice(&self.mask[r * self.len..][..self.len]);
        }
        TokenBatch::new(ids, Some(mask), rows.len(), self.len)
    }

    /// One unpadded row.
    pub fn single(ids: Vec<usize>) -> Result<Self> {
        let len = ids.len();
        TokenBatch::new(ids, None, 1, len)
    }

    /// `rows` of different lengths padded on the left with `pad` to the longest, as
    /// generation takes a batch of prompts: every row's last token is real.
    pub fn left_padded(rows: &[Vec<usize>], pad: usize) -> Result<Self> {
        let len = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows.len() * len);
        let mut mask = Vec::with_capacity(rows.len() * len);
        for row in rows {
            let gap = len - row.len();
            ids.extend(std::iter::repeat_n(pad, gap).chain(row.iter().copied()));
            mask.extend((0..len).map(|i| i >= gap));
        }
        TokenBatch::new(ids, Some(mask), rows.len(), len)
    }

    /// Errors on the first id ≥ `vocab_size`.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<()> {
        check_ids(&self.ids, vocab_size, "token id (vocabulary)")
    }

    /// Position of each token counting real tokens only, starting at `start[b]` for
    /// row b: cumsum(mask) − 1, as Hugging Face's `generate` assigns positions, so a
    /// left-padded row gets the positions it would have alone. Padding gets the
    /// position of the next real token (any valid position would do).
    pub fn positions(&self, start: &[usize]) -> Vec<usize> {
        real_positions(&self.mask, self.len, start)
    }
}

/// Errors on the first of `ids` outside a table of `size` rows, naming it `what`.
pub fn check_ids(ids: &[usize], size: usize, what: &str) -> Result<()> {
    match ids.iter().find(|&&id| id >= size) {
        Some(&id) => Err(Error::OutOfRange {
            what: what.into(),
            index: id,
            size,
        }),
        None => Ok(()),
    }
}

/// mask: `[B, T]`; start: `[B]` real tokens before this chunk → `[B·T]` positions.
pub fn real_positions(mask: &[bool], t: usize, start: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(mask.len());
    for (row, &first) in mask.chunks_exact(t).zip(start) {
        let mut seen = first;
        for &real in row {
            out.push(seen);
            seen += real as usize;
        }
    }
    out
}

/// The error for a real token at `position` in a model with `size` positions.
pub fn too_long(position: usize, size: usize) -> Error {
    Error::OutOfRange {
        what: "position (sequence longer than the model's positions)".into(),
        index: position,
        size,
    }
}

/// Fits positions (`[B·T]`, one per token of `mask`) to a table of `max` positions: a
/// real token past the table is an error ([`too_long`]); padding, which may sit one
/// past the last real token, is clamped to the last row (its output is never used).
pub fn limit_positions(positions: &mut [usize], mask: &[bool], max: usize) -> Result<()> {
    if let Some((&p, _)) = positions
        .iter()
        .zip(mask)
        .find(|&(&p, &real)| real && p >= max)
    {
        return Err(too_long(p, max));
    }
    for p in positions.iter_mut() {
        *p = (*p).min(max.saturating_sub(1));
    }
    Ok(())
}
