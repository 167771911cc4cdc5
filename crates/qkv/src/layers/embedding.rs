//! Table lookup: token ids (or positions) → rows of a `[V, C]` table.
//!
//! Backward: each output row's gradient is added into the table row it was read from
//! (a scatter-add, so an id that occurs twice collects both rows' gradients). The
//! forward saves nothing; the ids are all the backward needs.

use super::linear::Linear;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct Embedding {
    /// [V, C]; an empty `[0, 0]` placeholder while the table is `stored`
    pub weight: Tensor,
    /// The table as a GGUF file stores it (blocks, int8 codes or f16 values), in a
    /// linear layer kept packed only whose rows are the table's: a lookup widens the
    /// rows it reads, and the table is never held in f32.
    stored: Option<Linear>,
}

crate::module!(Embedding { weight });

impl Embedding {
    pub fn new(table: Tensor) -> Result<Self> {
        table.expect_matrix("embedding.weight", ["V", "C"])?;
        Ok(Embedding {
            weight: table,
            stored: None,
        })
    }

    /// A table held as the layer `table` stores its weight `[V, C]` (one that keeps
    /// no f32 weight: [`Linear::has_f32_weight`] is false).
    pub fn from_stored(table: Linear) -> Result<Self> {
        if table.has_f32_weight() {
            return Err(Error::invalid(
                "embedding table",
                "a stored table is a layer kept packed only",
            ));
        }
        Ok(Embedding {
            weight: Tensor::zeros(&[0, 0]),
            stored: Some(table),
        })
    }

    /// The layer holding the table as stored, if it is.
    pub fn stored(&self) -> Option<&Linear> {
        self.stored.as_ref()
    }

    /// Widens a stored table into the f32 weight (which training and saving need).
    pub fn unpack(&mut self) {
        if let Some(mut table) = self.stored.take() {
            table.unpack();
            self.weight = table.weight;
        }
    }

    /// Bytes the table takes as lookups read it.
    pub fn bytes(&self) -> usize {
        match &self.stored {
            Some(t) => t.weight_bytes(),
            None => 4 * self.weight.numel(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.stored {
            Some(t) => t.out_features(),
            None => self.weight.shape()[0],
        }
    }

    pub fn dim(&self) -> usize {
        match &self.stored {
            Some(t) => t.in_features(),
            None => self.weight.shape()[1],
        }
    }

    /// Errors on the first id outside the table.
    fn check_ids(&self, ids: &[usize]) -> Result<()> {
        crate::batch::check_ids(ids, self.vocab_size(), "embedding id")
    }

    /// ids: N indices → [N, C]. An id outside the table is an error naming it.
    pub fn forward(&self, ids: &[usize]) -> Result<Tensor> {
        self.check_ids(ids)?;
        let c = self.dim();
        let mut out = vec![0.0; ids.len() * c];
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(c)) {
            match &self.stored {
                Some(t) => t.weight_row(id, row),
                None => row.copy_from_slice(&self.weight.data()[id * c..(id + 1) * c]),
            }
        }
        Tensor::new(&[ids.len(), c], out)
    }

    /// Backward of [`Embedding::forward`]. ids: N indices as given to the forward;
    /// dy: [N, C] (any shape with N·C elements, e.g. [B, T, C]). **Accumulates** into
    /// `grads.weight` ([V, C]); ids have no gradient, so nothing is returned.
    pub fn backward(&self, ids: &[usize], dy: &Tensor, grads: &mut Embedding) -> Result<()> {
        if self.stored.is_some() {
            return Err(Error::Unsupported(
                "embedding backward: the table is held as stored (loaded for inference); load the model in f32 to train it".into(),
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::ggml::weight::tests::random;
    use crate::weights::ggml::BlockType;
    use crate::weights::int8::{Int8Weight, ScaleLayout};

    /// A table held as stored looks up the rows its widened form holds, refuses the
    /// backward, takes its stored bytes, and widens into the same f32 table.
    #[test]
    fn a_stored_table_reads_the_rows_its_widened_form_holds() {
        let (v, c) = (40, 256);
        let values = crate::rng::Rng::new(5).normals(v * c, 1.0);
        let tables = [
            Linear::from_int8(
                Int8Weight::new(&values, v, c, ScaleLayout::Blocks).unwrap(),
                None,
            ),
            Linear::from_blocks(random(BlockType::Q4K, v, c, 3), None),
            Linear::from_blocks(random(BlockType::Q6K, v, c, 4), None),
        ];
        for table in tables {
            let table = table.unwrap();
            let mut widened = table.clone();
            widened.unpack();
            let plain = Embedding::new(widened.weight.clone()).unwrap();
            let mut stored = Embedding::from_stored(table).unwrap();
            assert_eq!((stored.vocab_size(), stored.dim()), (v, c));
            assert!(
                stored.bytes() < plain.bytes() / 2,
                "{} bytes",
                stored.bytes()
            );
            let ids = [0, 17, 39, 17];
            let got = stored.forward(&ids).unwrap();
            assert_eq!(got.data(), plain.forward(&ids).unwrap().data());
            let mut grads = Embedding::new(Tensor::zeros(&[v, c])).unwrap();
            let err = stored.backward(&ids, &got, &mut grads).unwrap_err();
            assert!(err.to_string().contains("load the model in f32"), "{err}");
            stored.unpack();
            assert!(stored.stored().is_none());
            assert_eq!(stored.weight.data(), plain.weight.data());
        }
        let f32_layer = Linear::new(Tensor::zeros(&[2, 3]), None).unwrap();
        assert!(Embedding::from_stored(f32_layer).is_err());
    }
}
