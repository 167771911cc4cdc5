//! Filling a model's weights from a source of tensors under its family's checkpoint
//! names (a folder's safetensors, a GGUF file), and what a load returns.

use std::collections::HashSet;

use super::families::names::{self, Place};
use super::families::Family;
use super::net::arch::{Arch, Head};
use super::net::weights::Weights;
use super::transformer::Transformer;
use crate::error::Result;
use crate::io::TensorSource;
use crate::layers::{Embedding, Linear};
use crate::tensor::Tensor;
use crate::weights::DType;

/// A loaded model with what its checkpoint says about itself.
pub struct Loaded {
    pub model: Transformer,
    /// Elements stored in the checkpoint (a tied matrix counts once).
    pub parameters: usize,
    /// Dtypes on disk with their element counts.
    pub dtypes: Vec<(String, usize)>,
    /// Checkpoint tensors the model does not read (sorted), besides the buffers and
    /// heads no qkv output needs (see `unused_tensors`).
    pub unused: Vec<String>,
}

/// A linear layer read straight from its stored form, for the checkpoint tensor `name`
/// that holds a weight of `shape`: `None` when the tensor is to be read as f32.
pub(super) type StoredLinear<'a> = &'a dyn Fn(&str, &[usize]) -> Result<Option<Linear>>;

/// The weights `arch` needs from `ckpt`, the logits bias where the head has one,
/// and the checkpoint names that were read. The linear layers are packed in `dtype` as
/// they are read, except those `stored` gives as they are stored.
pub(super) fn read_weights(
    ckpt: &dyn TensorSource,
    arch: &Arch,
    family: Family,
    dtype: DType,
    stored: StoredLinear,
) -> Result<(Weights, Option<Tensor>, HashSet<String>)> {
    // The tree's zero tensors are allocated zeroed and never written where a loaded
    // tensor replaces them, so their pages never become resident.
    let mut weights = Weights::new(arch)?;
    // A linear layer's weight is found by its address among the parameters, then
    // packed at once (f32 only fills the tree) or taken as stored.
    let linears: Vec<*const Tensor> = weights
        .linears_mut()
        .map(|l| &l.weight as *const Tensor)
        .collect();
    let mut placer = Placer {
        packed: (0..linears.len()).map(|_| None).collect(),
        linears,
        table: &weights.embed_tokens.weight,
        stored_table: None,
        dtype,
        stored,
    };
    let aliases = |n: &str| family.aliases(n);
    let mut used = names::read(
        ckpt,
        &mut weights,
        &family.locator(arch),
        &aliases,
        &mut placer,
    )?;
    for (layer, copy) in weights.linears_mut().zip(placer.packed) {
        if let Some(copy) = copy {
            layer.adopt_weight(copy)?;
        }
    }
    if let Some(table) = placer.stored_table {
        weights.embed_tokens = Embedding::from_stored(table)?;
    }
    let logits_bias = match arch.head {
        Head::Lm {
            logits_bias: true, ..
        } if ckpt.has("final_logits_bias") => {
            let b = ckpt.tensor_shaped("final_logits_bias", &[1, arch.vocab])?;
            used.insert("final_logits_bias".into());
            Some(b.reshape(&[arch.vocab])?)
        }
        Head::Lm {
            logits_bias: true, ..
        } => Some(Tensor::zeros(&[arch.vocab])),
        _ => None,
    };
    Ok((weights, logits_bias, used))
}

/// Packs each linear layer's weight as it is read (see [`read_weights`]).
struct Placer<'a> {
    /// the linear layers' weights in the tree, by address
    linears: Vec<*const Tensor>,
    /// each linear layer's packed or stored copy, adopted once all is read
    packed: Vec<Option<Linear>>,
    /// the token table in the tree, by address, and the layer holding it as stored
    /// when the source gives it so (a GGUF file's blocks), adopted likewise
    table: *const Tensor,
    stored_table: Option<Linear>,
    dtype: DType,
    stored: StoredLinear<'a>,
}

impl Placer<'_> {
    fn linear(&self, param: &Tensor) -> Option<usize> {
        self.linears.iter().position(|&p| std::ptr::eq(p, param))
    }
}

impl Place for Placer<'_> {
    fn value(&mut self, param: &mut Tensor, value: Tensor) -> Result<()> {
        match self.linear(param).filter(|_| self.dtype != DType::F32) {
            Some(i) => {
                let mut layer = Linear::new(value, None)?;
                layer.pack_as(self.dtype);
                // a layer with no inputs or outputs has no copy; it keeps its empty weight
                if layer.dtype() == self.dtype {
                    layer.keep_packed_only()?;
                }
                self.packed[i] = Some(layer);
            }
            None => *param = value,
        }
        Ok(())
    }

    fn stored(&mut self, param: &mut Tensor, name: &str) -> Result<bool> {
        if std::ptr::eq(self.table, param) {
            // only a table with no f32 weight beside it saves anything
            let layer = (self.stored)(name, param.shape())?.filter(|l| !l.has_f32_weight());
            let taken = layer.is_some();
            self.stored_table = layer;
            return Ok(taken);
        }
        let Some(i) = self.linear(param) else {
            return Ok(false);
        };
        let layer = (self.stored)(name, param.shape())?;
        let taken = layer.is_some();
        self.packed[i] = layer;
        Ok(taken)
    }
}

/// Why `arch` cannot be what a checkpoint of `stored` values holds, if it cannot: checked
/// before anything is allocated for it. Up to twice what is stored (plus 16 M values) is
/// left to the loader, whose error names the missing or misshapen tensor; sizes far
/// beyond are refused here.
pub(super) fn sizes_unlike(arch: &Arch, stored: usize) -> Option<String> {
    let count = Weights::count(arch);
    if count.is_some_and(|n| n <= stored.saturating_mul(2).saturating_add(1 << 24)) {
        return None;
    }
    let first = arch.encoder.or(arch.decoder).expect("validated: a stack");
    let described = match count {
        Some(n) => format!("{n} parameters"),
        None => "more parameters than a machine can address".into(),
    };
    Some(format!(
        "the sizes describe {described} (hidden {}, {} layers, {} heads of width {}, FFN {}, vocabulary {}) but the checkpoint stores {stored} values: one of them does not match the weights",
        arch.d_model, first.layers, first.heads, first.head_dim, first.ffn_dim, arch.vocab
    ))
}

/// A loaded model set to compute in `dtype`, its linear layers (packed as they were read)
/// kept in that type alone; in f32 it is as loaded.
pub(super) fn for_inference_in(mut model: Transformer, dtype: DType) -> Result<Transformer> {
    if dtype != DType::F32 {
        model.set_dtype(dtype)?;
        model.keep_packed_only()?;
    }
    Ok(model)
}
