//! Held-out evaluation: loss and token accuracy of a model on fixed batches.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::tensor::Tensor;
use crate::train::loss::cross_entropy_in_place;
use crate::train::tasks::{self, Accuracy};
use crate::train::trainable::{Batch, TrainableModel};

/// Loss and token accuracy on held-out batches.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Eval {
    /// Mean cross-entropy over every scored target of all batches.
    pub loss: f32,
    /// Fraction of scored targets whose most likely token (argmax of the logits) is right.
    pub accuracy: f64,
    /// Number of scored targets.
    pub scored: usize,
}

/// Loss and token accuracy of `model` on `batches` (see [`Eval`]).
pub fn evaluate(model: &dyn TrainableModel, batches: &[Batch]) -> Result<Eval> {
    let mut loss_sum = 0.0f64;
    let mut acc = Accuracy::default();
    for batch in batches {
        let mut logits = model.logits(batch)?;
        let batch_acc = token_accuracy(&logits, &batch.targets)?;
        let loss = cross_entropy_in_place(&mut logits, &batch.targets)?;
        loss_sum += loss as f64 * batch_acc.total as f64;
        acc += batch_acc;
    }
    Ok(Eval {
        loss: if acc.total == 0 {
            0.0
        } else {
            (loss_sum / acc.total as f64) as f32
        },
        accuracy: acc.fraction(),
        scored: acc.total,
    })
}

/// Token accuracy of argmax predictions, as [`tasks::accuracy`] counts it.
pub fn token_accuracy(logits: &Tensor, targets: &[i64]) -> Result<Accuracy> {
    let v = logits.last_dim().max(1);
    let predictions: Vec<usize> = logits
        .data()
        .chunks_exact(v)
        .map(crate::ops::argmax)
        .collect();
    tasks::accuracy(&predictions, targets)
}
