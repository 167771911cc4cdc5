//! The interface between a trainable model and the training loop: the trainer only
//! needs a loss with gradients, the parameters (for the optimiser) and persistence.

use std::path::Path;

use crate::error::Result;
use crate::tensor::Tensor;

/// A batch of next-token training data. For an encoder-decoder model, `inputs` are
/// the decoder's (teacher-forced) inputs and `source` is what the encoder reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// [B·T] input token ids
    pub inputs: Vec<usize>,
    /// [B·T] the token each position must predict; −100 = not scored
    pub targets: Vec<i64>,
    pub batch: usize,
    pub len: usize,
    /// The encoder's input of an encoder-decoder batch; `None` for a decoder-only model.
    pub source: Option<Source>,
}

/// The source sequences of an encoder-decoder batch: B rows of S tokens, padded.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    /// `[B·S]` token ids (any valid id at padded positions)
    pub ids: Vec<usize>,
    /// `[B·S]` `true` for real tokens, `false` for padding (never attended to)
    pub mask: Vec<bool>,
    /// S
    pub len: usize,
}

/// A model the trainer can optimise. It owns its gradient buffers, one per parameter.
pub trait TrainableModel: Send {
    /// Sets every gradient to zero.
    fn zero_grads(&mut self);

    /// Forward and backward on one batch: returns the mean cross-entropy over scored
    /// targets and ADDS its gradient into the model's gradient buffers.
    fn loss_and_backward(&mut self, batch: &Batch) -> Result<f32>;

    /// Logits `[B, T, V]` for `batch.inputs` (evaluation, no gradients).
    fn logits(&self, batch: &Batch) -> Result<Tensor>;

    /// Visits every parameter with its gradient, in a fixed order, under its
    /// checkpoint name (Hugging Face naming where the model has one).
    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor));

    /// Writes the model as a folder (`config.json` + `model.safetensors`, atomically).
    fn save(&self, dir: &Path) -> Result<()>;
}
