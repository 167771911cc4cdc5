//! Where a run's batches come from ([`BatchSource`]), and the sources drawn afresh
//! each step: a built-in synthetic task, or windows of a text.

use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::train::tasks::Task;
use crate::train::text_data::{Split, TextData};
use crate::train::trainable::Batch;

/// Added to the seed for the held-out batches: a stream disjoint from the training one.
const EVAL_STREAM: u64 = 0x5eed_e0a1_0000_0002;

/// Where a run's batches come from. Step `s` gets the `s`-th batch; any randomness is
/// drawn from the trainer's `rng` only, so the trainer's state fully determines the
/// data stream.
pub trait BatchSource {
    /// The training batch of step `step`.
    fn train_batch(&mut self, step: u64, rng: &mut Rng) -> Result<Batch>;

    /// `count` held-out batches, the same for a given `seed` (empty when the source
    /// has no held-out data).
    fn eval_batches(&self, seed: u64, count: u64) -> Result<Vec<Batch>>;

    /// Input tokens per training batch (B·T), for throughput.
    fn tokens_per_batch(&self) -> usize;

    /// Checks that the batches fit a model with a vocabulary of `vocab` and
    /// `max_positions` positions (when it has a limit), for a run of `steps` steps.
    fn check(&self, vocab: usize, max_positions: Option<usize>, steps: u64) -> Result<()>;
}

/// The common check of a source of `(vocab, T)` against a model.
fn check_fits(
    what: &str,
    (need_vocab, len): (usize, usize),
    vocab: usize,
    max_positions: Option<usize>,
) -> Result<()> {
    if need_vocab > vocab {
        return Err(Error::invalid(
            "vocab",
            format!("{what} uses {need_vocab} token ids but the model's vocabulary has {vocab}"),
        ));
    }
    match max_positions {
        Some(max) if len > max => Err(Error::invalid(
            "seq_len",
            format!(
                "{what} has sequences of {len} tokens, longer than the model's {max} positions"
            ),
        )),
        _ => Ok(()),
    }
}

/// A built-in synthetic task, fresh examples every step.
pub struct TaskBatches {
    pub task: Task,
    pub batch_size: usize,
}

impl BatchSource for TaskBatches {
    fn train_batch(&mut self, _step: u64, rng: &mut Rng) -> Result<Batch> {
        Ok(self.task.batch(self.batch_size, rng))
    }

    fn eval_batches(&self, seed: u64, count: u64) -> Result<Vec<Batch>> {
        let mut rng = Rng::new(seed.wrapping_add(EVAL_STREAM));
        Ok((0..count)
            .map(|_| self.task.batch(self.batch_size, &mut rng))
            .collect())
    }

    fn tokens_per_batch(&self) -> usize {
        self.batch_size * self.task.seq_len()
    }

    fn check(&self, vocab: usize, max_positions: Option<usize>, _steps: u64) -> Result<()> {
        let what = format!("task {}", self.task);
        check_fits(
            &what,
            (self.task.vocab_size(), self.task.seq_len()),
            vocab,
            max_positions,
        )
    }
}

/// Byte-level language modelling: random windows of the training split; held-out
/// batches from the validation split.
pub struct TextBatches {
    pub data: TextData,
    pub batch_size: usize,
}

impl BatchSource for TextBatches {
    fn train_batch(&mut self, _step: u64, rng: &mut Rng) -> Result<Batch> {
        self.data.batch(Split::Train, self.batch_size, rng)
    }

    fn eval_batches(&self, seed: u64, count: u64) -> Result<Vec<Batch>> {
        if !self.data.has_validation() {
            return Ok(Vec::new());
        }
        let mut rng = Rng::new(seed.wrapping_add(EVAL_STREAM));
        (0..count)
            .map(|_| {
                self.data
                    .batch(Split::Validation, self.batch_size, &mut rng)
            })
            .collect()
    }

    fn tokens_per_batch(&self) -> usize {
        self.batch_size * self.data.seq_len()
    }

    fn check(&self, vocab: usize, max_positions: Option<usize>, _steps: u64) -> Result<()> {
        let what = format!("text {}", self.data.name());
        check_fits(
            &what,
            (self.data.vocab_size(), self.data.seq_len()),
            vocab,
            max_positions,
        )
    }
}
