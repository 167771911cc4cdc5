//! Table lookup: token ids (or positions) → rows of a `[V, C]` table.
//!
//! Backward: each output row's gradient is added into the table row it was read from
//! (a scatter-add, so an id that occurs twice collects both rows' gradients). The
//! forward saves nothing; the ids are all the backward needs.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

crate::module! {
    #[derive(Clone, Debug)]
    pub struct Embedding {
        /// [V, C]
        pub weight: Tensor,
    }
}

impl Embedding {
    pub fn new(table: Tensor) -> Result<Self> {
        table.expect_matrix("embedding.weight", ["V", "C"])?;
        Ok(Embedding { weight: table })
    }

    pub fn vocab_size(&self) -> usize {
        self.weight.shape()[0]
    }

    pub fn dim(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Errors on the first id outside the table.
    fn check_ids(&self, ids: &[usize]) -> Result<()> {
        crate::batch::check_ids(ids, self.vocab_size(), "embedding id")
    }

    /// ids: N indices → [N, C]. An id outside the table is an error naming it.
    pub fn forward(&self, ids: &[usize]) -> Result<Tensor> {
        self.check_ids(ids)?;
        let c = self.dim();
        let mut out = Vec::with_capacity(ids.len() * c);
        for &id in ids {
            out.extend_from_slice(&self.weight.data()[id * c..(id + 1) * c]);
        }
        Tensor::new(&[ids.len(), c], out)
    }

    /// Backward of [`Embedding::forward`]. ids: N indices as given to the forward;
    /// dy: [N, C] (any shape with N·C elements, e.g. [B, T, C]). **Accumulates** into
    /// `grads.weight` ([V, C]); ids have no gradient, so nothing is returned.
    pub fn backward(&self, ids: &[usize], dy: &Tensor, grads: &mut Embedding) -> Result<()> {
        let (v, c) = (self.vocab_size(), self.dim());
        self.check_ids(ids)?;
        if dy.rank() == 0 || dy.last_dim() != c || dy.numel() != ids.len() * c {
            return Err(Error::shape(
                "embedding dy",
                format!("[{}, {c}]", ids.len()),
                dy.shape(),
            ));
        }
        grads
            .weight
            .expect_shape("embedding grads.weight", &[Some(v), Some(c)])?;
        let table = grads.weight.data_mut();
        // forward: out[i] = table[ids[i]]  →  dtable[ids[i]] += dy[i]
        for (&id, row) in ids.iter().zip(dy.data().chunks_exact(c)) {
            for (g, &d) in table[id * c..(id + 1) * c].iter_mut().zip(row) {
                *g += d;
            }
        }
        Ok(())
    }
}
