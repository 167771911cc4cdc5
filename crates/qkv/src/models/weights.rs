//! Looking up a model's tensors by checkpoint name under a prefix, so each family's
//! loader mirrors the checkpoint's tree (`encoder.layer.0.attention.self.query`).

use crate::error::Result;
use crate::io::Checkpoint;
use crate::layers::{Embedding, LayerNorm, Linear, RmsNorm};
use crate::tensor::Tensor;

#[derive(Clone, Copy)]
pub struct Weights<'a> {
    pub ckpt: &'a Checkpoint,
    prefix: &'a str,
}

impl<'a> Weights<'a> {
    /// Picks the first of `prefixes` under which `probe` exists (checkpoints saved from
    /// a base model lack the task model's prefix, e.g. `bert.` or `transformer.`);
    /// falls back to the first prefix so the missing-tensor error names the usual path.
    pub fn detect(ckpt: &'a Checkpoint, prefixes: &[&'a str], probe: &str) -> Self {
        let prefix = prefixes
            .iter()
            .find(|p| ckpt.has(&format!("{p}{probe}")))
            .or(prefixes.first())
            .copied()
            .unwrap_or("");
        Weights { ckpt, prefix }
    }

    pub fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub fn has(&self, name: &str) -> bool {
        self.ckpt.has(&self.name(name))
    }

    /// A tensor that must have `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.ckpt.tensor_shaped(&self.name(name), shape)
    }

    /// `{name}.weight` `[out, in]` and, if `bias`, `{name}.bias` `[out]`.
    pub fn linear(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        let w = self.tensor(&format!("{name}.weight"), &[out, inp])?;
        let b = if bias {
            Some(self.tensor(&format!("{name}.bias"), &[out])?)
        } else {
            None
        };
        Linear::new(w, b)
    }

    /// LayerNorm `{name}.weight` and `{name}.bias`, both `[c]`.
    pub fn layer_norm(&self, name: &str, c: usize, eps: f32) -> Result<LayerNorm> {
        LayerNorm::new(
            self.tensor(&format!("{name}.weight"), &[c])?,
            Some(self.tensor(&format!("{name}.bias"), &[c])?),
            eps,
        )
    }

    /// RMSNorm `{name}.weight` `[c]`.
    pub fn rms_norm(&self, name: &str, c: usize, eps: f32) -> Result<RmsNorm> {
        RmsNorm::new(self.tensor(&format!("{name}.weight"), &[c])?, eps)
    }

    /// Embedding table `{name}.weight` `[v, c]`.
    pub fn embedding(&self, name: &str, v: usize, c: usize) -> Result<Embedding> {
        Embedding::new(self.tensor(&format!("{name}.weight"), &[v, c])?)
    }
}
