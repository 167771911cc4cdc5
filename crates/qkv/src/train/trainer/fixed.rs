//! Batches read from a safetensors file, the same for every run that reads it.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::TensorFile;
use crate::rng::Rng;
use crate::train::loss::IGNORE_INDEX;
use crate::train::trainable::{Batch, Source};

use super::batches::BatchSource;

/// Batches given in a safetensors file; step `s` uses batch `s`. Integer tensors:
///
/// | tensor | shape | |
/// |---|---|---|
/// | `input_ids` | `[N, B, T]` | what the model reads (an encoder-decoder's source, `[N, B, S]`) |
/// | `targets` | `[N, B, T]` | already shifted; −100 = not scored |
/// | `attention_mask` | like `input_ids` | optional: 1 = token, 0 = padding |
/// | `decoder_input_ids` | `[N, B, T]` | encoder-decoders only: the decoder's inputs |
#[derive(Clone, Debug)]
pub struct FixedBatches {
    name: String,
    count: usize,
    batch: usize,
    /// T
    len: usize,
    /// `[N·B·T]` what the decoder (or an encoder-only model) reads
    inputs: Vec<usize>,
    targets: Vec<i64>,
    /// `[N·B·T]`, for `inputs` when they are not a source
    mask: Option<Vec<bool>>,
    /// encoder-decoder data: the source ids and mask `[N·B·S]`, and S
    source: Option<(Vec<usize>, Vec<bool>, usize)>,
}

impl FixedBatches {
    /// Reads and checks `path`: the tensors above with matching shapes, every size ≥ 1,
    /// ids ≥ 0, masks 0 or 1, targets ≥ 0 or −100.
    pub fn open(path: &Path) -> Result<Self> {
        let file = TensorFile::open(path)?;
        let name = path.display().to_string();
        let err = |reason: String| Error::Safetensors {
            path: name.clone(),
            reason,
        };
        let (shape, input_ids) = file.token_ids("input_ids", 3)?;
        let mask = match file.contains("attention_mask") {
            true => Some(file.token_mask("attention_mask", &shape, "input_ids")?),
            false => None,
        };
        let (dshape, inputs, mask, source) = match file.contains("decoder_input_ids") {
            true => {
                let (dshape, dec) = file.token_ids("decoder_input_ids", 3)?;
                if dshape[..2] != shape[..2] {
                    return Err(err(format!(
                        "`decoder_input_ids` has shape {dshape:?}; its steps and B must be those of `input_ids` {shape:?}"
                    )));
                }
                let source_mask = mask.unwrap_or_else(|| vec![true; input_ids.len()]);
                (dshape, dec, None, Some((input_ids, source_mask, shape[2])))
            }
            false => (shape.clone(), input_ids, mask, None),
        };
        let (tshape, targets) = file.ints("targets")?;
        if tshape != dshape {
            let of = if source.is_some() {
                "decoder_input_ids"
            } else {
                "input_ids"
            };
            return Err(err(format!(
                "`targets` has shape {tshape:?} but `{of}` has {dshape:?}"
            )));
        }
        if let Some((i, t)) = targets
            .iter()
            .enumerate()
            .find(|&(_, &t)| t < 0 && t != IGNORE_INDEX)
        {
            return Err(err(format!(
                "`targets` holds {t} at flat index {i}: a target is a token id or {IGNORE_INDEX}"
            )));
        }
        Ok(FixedBatches {
            name,
            count: dshape[0],
            batch: dshape[1],
            len: dshape[2],
            inputs,
            targets,
            mask,
            source,
        })
    }

    /// `(N, B, T)`.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.count, self.batch, self.len)
    }

    /// Checks the batches against a model: every id and target below `vocab`, `T` (and
    /// S) at most `max_positions` (when the model has a limit), and at least `steps`
    /// batches.
    fn check_model(&self, vocab: usize, max_positions: Option<usize>, steps: u64) -> Result<()> {
        let err = |reason: String| Error::Safetensors {
            path: self.name.clone(),
            reason,
        };
        if (self.count as u64) < steps {
            return Err(err(format!(
                "holds {} batches but the run has {steps} steps (step s uses batch s)",
                self.count
            )));
        }
        let (ids_name, src) = match &self.source {
            Some((ids, _, s)) => ("decoder_input_ids", Some((ids, *s))),
            None => ("input_ids", None),
        };
        let lengths =
            std::iter::once((ids_name, self.len)).chain(src.map(|(_, s)| ("input_ids", s)));
        for (tensor, len) in lengths {
            if let Some(max) = max_positions.filter(|&max| len > max) {
                return Err(err(format!(
                    "`{tensor}` has sequences of {len} tokens, longer than the model's {max} positions"
                )));
            }
        }
        let all =
            std::iter::once((ids_name, &self.inputs)).chain(src.map(|(ids, _)| ("input_ids", ids)));
        for (tensor, ids) in all {
            if let Some((i, id)) = ids.iter().enumerate().find(|&(_, &id)| id >= vocab) {
                return Err(err(format!(
                    "`{tensor}` holds id {id} at flat index {i}, outside the model's vocabulary of {vocab}"
                )));
            }
        }
        if let Some((i, t)) = self
            .targets
            .iter()
            .enumerate()
            .find(|&(_, &t)| t != IGNORE_INDEX && t as u64 >= vocab as u64)
        {
            return Err(err(format!(
                "`targets` holds id {t} at flat index {i}, outside the model's vocabulary of {vocab}"
            )));
        }
        Ok(())
    }

    /// Batch `i`.
    pub fn get(&self, i: usize) -> Result<Batch> {
        if i >= self.count {
            return Err(Error::OutOfRange {
                what: format!("batch of {}", self.name),
                index: i,
                size: self.count,
            });
        }
        let n = self.batch * self.len;
        let r = i * n..(i + 1) * n;
        Ok(Batch {
            inputs: self.inputs[r.clone()].to_vec(),
            targets: self.targets[r.clone()].to_vec(),
            batch: self.batch,
            len: self.len,
            mask: self.mask.as_ref().map(|m| m[r].to_vec()),
            source: self.source.as_ref().map(|(ids, mask, s)| {
                let r = i * self.batch * s..(i + 1) * self.batch * s;
                Source {
                    ids: ids[r.clone()].to_vec(),
                    mask: mask[r].to_vec(),
                    len: *s,
                }
            }),
        })
    }
}

impl BatchSource for FixedBatches {
    fn train_batch(&mut self, step: u64, _rng: &mut Rng) -> Result<Batch> {
        self.get(usize::try_from(step).unwrap_or(usize::MAX))
    }

    fn eval_batches(&self, _seed: u64, _count: u64) -> Result<Vec<Batch>> {
        Ok(Vec::new())
    }

    fn tokens_per_batch(&self) -> usize {
        self.batch * self.len
    }

    fn check(&self, vocab: usize, max_positions: Option<usize>, steps: u64) -> Result<()> {
        self.check_model(vocab, max_positions, steps)
    }
}
