//! Table lookup: token ids (or positions) → rows of a `[V, C]` table.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct Embedding {
    /// [V, C]
    pub table: Tensor,
}

impl Embedding {
    pub fn new(table: Tensor) -> Result<Self> {
        table.expect_shape("embedding.table", &[None, None])?;
        if table.numel() == 0 {
            return Err(Error::shape(
                "embedding.table",
                "[V ≥ 1, C ≥ 1]",
                table.shape(),
            ));
        }
        Ok(Embedding { table })
    }

    pub fn vocab_size(&self) -> usize {
        self.table.shape()[0]
    }

    pub fn dim(&self) -> usize {
        self.table.shape()[1]
    }

    /// ids: N indices → [N, C]. An id outside the table is an error naming it.
    pub fn forward(&self, ids: &[usize]) -> Result<Tensor> {
        let (v, c) = (self.vocab_size(), self.dim());
        let mut out = Vec::with_capacity(ids.len() * c);
        for &id in ids {
            if id >= v {
                return Err(Error::OutOfRange {
                    what: "embedding id".into(),
                    index: id,
                    size: v,
                });
            }
            out.extend_from_slice(&self.table.data()[id * c..(id + 1) * c]);
        }
        Tensor::new(&[ids.len(), c], out)
    }
}
