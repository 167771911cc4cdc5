//! What the linear layers of a [`Transformer`] compute in: packing their weights (f32,
//! bf16, int8), keeping only the packed copies for inference, and what they then hold.

use crate::error::{Error, Result};
use crate::weights::DType;

use super::model::Transformer;

impl Transformer {
    /// Packs every linear layer for inference ([`crate::layers::Linear::pack`]): faster
    /// products for a sentence or a prompt, at the cost of a second copy of the
    /// projection weights. Training afterwards stays correct (a changed weight is
    /// used as it is), but the copies are then dead weight.
    pub fn pack_weights(&mut self) {
        self.weights.pack_weights(DType::F32);
    }

    /// Computes with the weights of every linear layer in `dtype` from now on
    /// ([`crate::layers::Linear::pack_as`]); [`DType::F32`] packs them as
    /// [`Transformer::pack_weights`] does. Norms, embeddings, attention and a tied head
    /// stay f32. [`Transformer::dtype`] says which type the layers compute in. The copy
    /// sits beside the f32 weights: one the machine's free memory cannot hold is refused
    /// before it is made.
    ///
    /// A model kept as [`Transformer::keep_packed_only`] packs again from its widened
    /// copies; in f32 it then holds f32 weights (the rounded values) again.
    pub fn set_dtype(&mut self, dtype: DType) -> Result<()> {
        let weights: usize = self
            .weights
            .linears_mut()
            .map(|l| l.out_features() * l.in_features())
            .sum();
        let bytes = (weights as f64 * dtype.bytes_per_weight()).ceil() as usize;
        let what = format!("a {dtype} copy of the linear layers' weights");
        crate::io::memory::check(Some(bytes), &what)?;
        self.weights.pack_weights(dtype);
        self.dtype = dtype;
        if dtype == DType::F32 {
            self.weights.embed_tokens.unpack();
            self.packed_only = 0;
        }
        Ok(())
    }

    /// Drops the f32 weights of the linear layers, which then hold only their copies in
    /// the model's reduced type ([`crate::layers::Linear::keep_packed_only`]): an
    /// inference model in bf16 holds its projections in half the bytes, in int8 in a
    /// quarter. It still runs every forward, and refuses [`Transformer::forward_train`]
    /// and [`Transformer::save`]. [`crate::models::load_in`] loads a folder this way.
    pub fn keep_packed_only(&mut self) -> Result<()> {
        if self.dtype == DType::F32 {
            return Err(Error::invalid(
                "dtype",
                "a model keeps its linear layers packed only in bf16 or int8, not f32",
            ));
        }
        let mut packed_only = 0;
        for l in self.weights.linears_mut() {
            // an empty layer (no inputs or outputs) has no copy and nothing to drop
            if l.out_features() * l.in_features() > 0 {
                l.keep_packed_only()?;
                packed_only += l.out_features() * l.in_features();
            }
        }
        self.packed_only = packed_only;
        Ok(())
    }

    /// Takes the model's type and what it holds only packed from its linear layers,
    /// each packed as it was read (a GGUF file's Q8_0 blocks as stored, its other
    /// weights in the load's type): the model's type is the one most of their weights
    /// compute in.
    pub(crate) fn adopt_layer_types(&mut self) {
        let mut counts: Vec<(DType, usize)> = Vec::new();
        let mut packed_only = 0;
        for l in self.weights.linears_mut() {
            let size = l.out_features() * l.in_features();
            if !l.has_f32_weight() {
                packed_only += size;
            }
            match counts.iter_mut().find(|(t, _)| *t == l.dtype()) {
                Some((_, n)) => *n += size,
                None => counts.push((l.dtype(), size)),
            }
        }
        self.dtype = counts
            .into_iter()
            .max_by_key(|&(_, n)| n)
            .map_or(DType::F32, |(t, _)| t);
        // a token table held as stored has no f32 weight either
        if let Some(table) = self.weights.embed_tokens.stored() {
            packed_only += table.out_features() * table.in_features();
        }
        self.packed_only = packed_only;
    }

    /// Whether the linear layers hold their f32 weights (see
    /// [`Transformer::keep_packed_only`]).
    pub fn has_f32_weights(&self) -> bool {
        self.packed_only == 0
    }

    /// Errors when the model holds no f32 weights to `what` (train, save) with.
    pub(crate) fn expect_f32_weights(&self, what: &str) -> Result<()> {
        match self.packed_only {
            0 => Ok(()),
            _ => Err(Error::Unsupported(format!(
                "cannot {what}: the model keeps its linear layers only in {} (loaded for inference); load it in f32",
                self.dtype
            ))),
        }
    }

    /// Drops the linear layers' packed copies: they compute with their f32 weights
    /// again, unpacked (as a model trains in f32); a model kept packed only holds its
    /// copies widened, and a token table held as stored is widened too.
    pub fn unpack_weights(&mut self) {
        self.weights.linears_mut().for_each(|l| l.unpack());
        self.weights.embed_tokens.unpack();
        self.dtype = DType::F32;
        self.packed_only = 0;
    }

    /// Packs again, in the model's type, each linear layer's copy that its weight's
    /// update left stale: a training step in bf16 computes with copies of the weights
    /// the last update left (the f32 weights are the master copies).
    pub fn repack_weights(&mut self) {
        let dtype = self.dtype;
        self.weights.linears_mut().for_each(|l| l.repack(dtype));
    }

    /// Bytes the weights take as the forward reads them: `(linear, rest)`, the linear
    /// layers' weights in their type ([`Transformer::set_dtype`]) and everything else
    /// (embeddings, norms, biases, a tied head) in f32.
    pub fn weight_bytes(&mut self) -> (usize, usize) {
        let (mut linear, mut linear_params) = (0, 0);
        for l in self.weights.linears_mut() {
            linear += l.weight_bytes();
            linear_params += l.out_features() * l.in_features();
        }
        let table = &self.weights.embed_tokens;
        match table.stored() {
            // the table counts at its stored size, not as f32
            Some(_) => {
                let table_params = table.vocab_size() * table.dim();
                let rest = 4 * (self.num_params() - linear_params - table_params);
                (linear, rest + table.bytes())
            }
            None => (linear, 4 * (self.num_params() - linear_params)),
        }
    }

    /// The number type the linear layers compute in ([`Transformer::set_dtype`]).
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}
