//! Token ids and masks stored as integer tensors (`qkv forward --input`, `qkv train
//! --data`): the checks both readers share, so that the same bad file gives the same
//! message whichever command reads it.

use super::safetensors::TensorFile;
use crate::batch::TokenBatch;
use crate::error::{Error, Result};

impl TensorFile {
    /// The int `[B, T]` tensor `ids_name`, with the 0/1 mask `mask_name` when the file
    /// has it (every token real otherwise): the batch `qkv forward --input` reads.
    pub fn token_batch(&self, ids_name: &str, mask_name: Option<&str>) -> Result<TokenBatch> {
        let (shape, ids) = self.token_ids(ids_name, 2)?;
        let mask = match mask_name.filter(|m| self.contains(m)) {
            Some(m) => Some(self.token_mask(m, &shape, ids_name)?),
            None => None,
        };
        TokenBatch::new(ids, mask, shape[0], shape[1])
    }

    fn refuse(&self, reason: String) -> Error {
        Error::Safetensors {
            path: self.path().display().to_string(),
            reason,
        }
    }

    /// `name`'s shape (`rank` axes, each ≥ 1) and its ids, each ≥ 0.
    pub fn token_ids(&self, name: &str, rank: usize) -> Result<(Vec<usize>, Vec<usize>)> {
        let (shape, ids) = self.ints(name)?;
        if shape.contains(&0) {
            return Err(self.refuse(format!(
                "`{name}` is empty (shape {shape:?}): need at least one token"
            )));
        }
        if shape.len() != rank {
            let axes = ["T", "B, T", "steps, B, T"].get(rank.wrapping_sub(1));
            return Err(self.refuse(format!(
                "`{name}` must be [{}], got shape {shape:?}",
                axes.copied().unwrap_or("…")
            )));
        }
        let ids = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                usize::try_from(id).map_err(|_| {
                    self.refuse(format!(
                        "`{name}` holds a negative id {id} at flat index {i}"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((shape, ids))
    }

    /// `name` as a mask of `shape` (`of` names the tensor it masks): 1 for a real
    /// token, 0 for padding, nothing else.
    pub fn token_mask(&self, name: &str, shape: &[usize], of: &str) -> Result<Vec<bool>> {
        let (mshape, mask) = self.ints(name)?;
        if mshape != shape {
            return Err(self.refuse(format!(
                "`{name}` has shape {mshape:?} but `{of}` has {shape:?}"
            )));
        }
        mask.iter()
            .enumerate()
            .map(|(i, &v)| match v {
                0 | 1 => Ok(v == 1),
                _ => Err(self.refuse(format!(
                    "`{name}` must hold 0 or 1, found {v} at flat index {i}"
                ))),
            })
            .collect()
    }
}
