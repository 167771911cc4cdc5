//! The training every experiment shares: a synthetic task drawn batch by batch, one
//! recipe of optimiser and schedule, and the position encodings by name.

use crate::error::Result;
use crate::models::Position;
use crate::position::SinusoidalLayout;
use crate::rng::Rng;
use crate::train::trainable::{Batch, TrainableModel};
use crate::train::trainer::{BatchSource, RunOptions, TrainConfig, Trainer};

/// An experiment's own synthetic task: `draw(batch_size, rng)` makes a batch of rows of
/// `len` tokens. Held-out batches come from `seed ^ salt`, a different stream per task.
pub(super) struct Drawn {
    pub(super) batch_size: usize,
    pub(super) len: usize,
    pub(super) salt: u64,
    pub(super) draw: fn(usize, &mut Rng) -> Batch,
}

impl BatchSource for Drawn {
    fn train_batch(&mut self, _step: u64, rng: &mut Rng) -> Result<Batch> {
        Ok((self.draw)(self.batch_size, rng))
    }

    fn eval_batches(&self, seed: u64, count: u64) -> Result<Vec<Batch>> {
        let mut rng = Rng::new(seed ^ self.salt);
        Ok((0..count)
            .map(|_| (self.draw)(self.batch_size, &mut rng))
            .collect())
    }

    fn tokens_per_batch(&self) -> usize {
        self.batch_size * self.len
    }

    fn check(&self, _vocab: usize, _max_positions: Option<usize>, _steps: u64) -> Result<()> {
        Ok(())
    }
}

/// Trains `model` on `data` for `steps` steps with the one recipe every experiment
/// uses (AdamW at 3e-3, 20 warm-up steps, cosine decay to 3e-4, clipping at 1), with
/// no evaluation during the run; returns the training loss of every step.
pub(super) fn train(
    model: &mut dyn TrainableModel,
    data: &mut dyn BatchSource,
    steps: u64,
    seed: u64,
) -> Result<Vec<f64>> {
    let config = TrainConfig {
        steps,
        lr: 3e-3,
        warmup: 20,
        min_lr: 3e-4,
        clip: Some(1.0),
        eval_every: 0,
        seed,
        ..TrainConfig::default()
    };
    let mut losses = Vec::new();
    let mut trainer = Trainer::new(model, config, serde_json::Value::Null)?;
    trainer.run(data, &[], RunOptions::default(), &mut |log| {
        losses.push(log.loss as f64)
    })?;
    Ok(losses)
}

/// The position encoding called `name` (none, sinusoidal, learned, rope, alibi) for
/// sequences of up to `max_len` tokens.
pub(super) fn position(name: &str, max_len: usize) -> Position {
    match name {
        "sinusoidal" => Position::Sinusoidal {
            max_len,
            layout: SinusoidalLayout::Interleaved,
        },
        "learned" => Position::Learned { max_len },
        "rope" => Position::Rope {
            theta: 10_000.0,
            scaling: crate::position::RopeScaling::None,
            max_len: Some(max_len),
            rotary_dim: None,
        },
        "alibi" => Position::Alibi,
        _ => Position::None,
    }
}
