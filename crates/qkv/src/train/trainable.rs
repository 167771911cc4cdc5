//! The interface between a trainable model and the training loop: the trainer only
//! needs a loss with gradients, the parameters (for the optimiser) and persistence.
//! Every [`Transformer`] is one, whatever its family.

use std::path::Path;

use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::models::{Input, ModelKind, Transformer};
use crate::module::{self, Module};
use crate::tensor::Tensor;
use crate::train::loss::cross_entropy_in_place;
use crate::weights::DType;

/// A batch of training data. `inputs` are what the model reads token by token: a
/// decoder's (teacher-forced) inputs, or an encoder-only model's tokens; `source` is
/// what an encoder-decoder's encoder reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// [B·T] input token ids
    pub inputs: Vec<usize>,
    /// [B·T] the token each position must predict; −100 = not scored
    pub targets: Vec<i64>,
    pub batch: usize,
    pub len: usize,
    /// [B·T] `false` where `inputs` holds padding (never attended to); `None`: all real.
    pub mask: Option<Vec<bool>>,
    /// The encoder's input of an encoder-decoder batch; `None` otherwise.
    pub source: Option<Source>,
}

impl Batch {
    /// `batch` rows of `len` real tokens with their targets, for a decoder (or an
    /// encoder-only model): no padding, no source.
    pub fn rows(inputs: Vec<usize>, targets: Vec<i64>, batch: usize, len: usize) -> Batch {
        Batch {
            inputs,
            targets,
            batch,
            len,
            mask: None,
            source: None,
        }
    }
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

    /// Logits `[B, T, V]` for the batch (evaluation, no gradients).
    fn logits(&self, batch: &Batch) -> Result<Tensor>;

    /// Visits every parameter with its gradient, in a fixed order, under its name.
    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor));

    /// Writes the model as a folder (`config.json` + `model.safetensors`, atomically).
    fn save(&self, dir: &Path) -> Result<()>;

    /// Makes the coming steps' products compute in `dtype`: f32, or (where the model
    /// offers it) bf16 with its f32 weights as master copies. A model that trains in
    /// f32 only refuses anything else, naming the setting.
    fn set_train_dtype(&mut self, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 => Ok(()),
            other => Err(Error::invalid(
                "dtype",
                format!("this model trains in f32 only, not {other}"),
            )),
        }
    }
}

/// The batch's token batches: (source, inputs), checked against the model's kind.
fn tokens(model: &Transformer, batch: &Batch) -> Result<(Option<TokenBatch>, TokenBatch)> {
    let inputs = TokenBatch::new(
        batch.inputs.clone(),
        batch.mask.clone(),
        batch.batch,
        batch.len,
    )?;
    if batch.targets.len() != inputs.ids.len() {
        return Err(Error::Shape {
            tensor: "batch targets".into(),
            expected: format!("[{}, {}] like the inputs", batch.batch, batch.len),
            got: vec![batch.targets.len()],
        });
    }
    let source = match (model.kind(), &batch.source) {
        (ModelKind::EncoderDecoder, Some(s)) => Some(TokenBatch::new(
            s.ids.clone(),
            Some(s.mask.clone()),
            batch.batch,
            s.len,
        )?),
        (ModelKind::EncoderDecoder, None) => {
            return Err(Error::invalid(
                "batch.source",
                "an encoder-decoder model needs a source (see tasks::source_target_batch)",
            ))
        }
        (_, Some(_)) => {
            return Err(Error::invalid(
                "batch.source",
                "only an encoder-decoder model reads a source",
            ))
        }
        (_, None) => None,
    };
    Ok((source, inputs))
}

fn input<'a>(
    model: &Transformer,
    source: Option<&'a TokenBatch>,
    inputs: &'a TokenBatch,
) -> Input<'a> {
    match model.kind() {
        ModelKind::Encoder => Input {
            source: Some(inputs),
            ..Default::default()
        },
        _ => Input {
            source,
            target: Some(inputs),
            token_types: None,
        },
    }
}

impl TrainableModel for Transformer {
    fn zero_grads(&mut self) {
        self.weights.zero_grads_in(&mut self.grads);
    }

    /// A non-finite loss is returned as it is, without a backward (the trainer reports
    /// it); the gradients are then unchanged.
    fn loss_and_backward(&mut self, batch: &Batch) -> Result<f32> {
        match self.dtype() {
            DType::F32 => {}
            DType::Bf16 => self.repack_weights(),
            other => return Err(train_dtype_error(other)),
        }
        let (source, inputs) = tokens(self, batch)?;
        let (mut logits, tape) = self.forward_train(&input(self, source.as_ref(), &inputs))?;
        // the logits become d loss / d logits in place
        let loss = cross_entropy_in_place(&mut logits, &batch.targets)?;
        if !loss.is_finite() {
            return Ok(loss);
        }
        self.backward(tape, &logits)?;
        Ok(loss)
    }

    fn logits(&self, batch: &Batch) -> Result<Tensor> {
        let (source, inputs) = tokens(self, batch)?;
        Ok(self
            .forward(&input(self, source.as_ref(), &inputs), false)?
            .logits)
    }

    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        let grads = self.grads.get_or_insert_with(|| self.weights.zeros_like());
        // the gradient tree has the parameters' type: the i-th tensor of one walk is the
        // i-th of the other
        let mut g = Vec::new();
        grads.visit(&mut module::Path::default(), &mut |_, t| g.push(t));
        let mut g = g.into_iter();
        self.weights
            .visit_mut(&mut module::Path::default(), &mut |name, p| {
                f(name, p, g.next().expect("one gradient per parameter"))
            });
    }

    fn save(&self, dir: &Path) -> Result<()> {
        Transformer::save(self, dir)
    }

    /// bf16: every linear layer's products, forward and backward, read a bf16 copy of
    /// its weight made again after each update; activations, norms, attention, a tied
    /// head, the gradients and AdamW stay f32. Evaluation between steps reads the f32
    /// weights.
    fn set_train_dtype(&mut self, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 => {
                self.unpack_weights();
                Ok(())
            }
            DType::Bf16 => self.set_dtype(dtype),
            other => Err(train_dtype_error(other)),
        }
    }
}

/// The error for a number type a Transformer does not train in.
fn train_dtype_error(dtype: DType) -> Error {
    Error::invalid(
        "dtype",
        format!("a model trains in f32 or bf16 (mixed precision), not {dtype}"),
    )
}
