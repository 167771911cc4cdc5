//! The training loop: batches in, AdamW updates out, with a learning-rate schedule,
//! optional gradient clipping, periodic evaluation and checkpoints.
//!
//! One step `s` (0-based) is:
//!
//! ```text
//! batch  = data.train_batch(s, rng)        the only consumer of the trainer's RNG
//! grads  = 0;  loss = model.loss_and_backward(batch)       loss must be finite
//! norm   = ‖grads‖₂ (clipped to `clip` if set)              grads must be finite
//! params = AdamW(params, grads, lr = schedule(s))
//! ```
//!
//! and logs `loss` — the loss *before* that step's update. Evaluation (after the update
//! of every `eval_every`-th step and of the last step) runs the model on held-out
//! batches that are fixed for the run, without touching the training RNG.
//!
//! ## Determinism and resuming
//!
//! A run is a function of its configuration, seed and thread count: the data RNG is
//! seeded from `seed`, the model's kernels reduce in an order that depends only on the
//! thread count, and nothing reads a clock. A checkpoint (see [`super::checkpoint`])
//! holds everything that changes during a run — parameters, AdamW moments and step
//! count, the RNG state, the step (= data position: step `s` consumes the `s`-th
//! batch) — so a resumed run computes bit for bit what the uninterrupted run would have.
//!
//! ## Faults
//!
//! A non-finite loss or gradient stops the run with an error naming the step (and, for
//! a gradient, the parameter) before anything is updated; checkpoints are only written
//! after good steps, so the last one on disk stays intact.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::TensorFile;
use crate::rng::Rng;
use crate::tensor::Tensor;
use crate::train::checkpoint::{self, TrainerState};
use crate::train::loss::{cross_entropy_in_place, IGNORE_INDEX};
use crate::train::optim::{self, AdamW, AdamWConfig, DecayRule};
use crate::train::schedule::Schedule;
use crate::train::tasks::{self, Accuracy, Task};
use crate::train::text_data::{Split, TextData};
use crate::train::trainable::{Batch, Source, TrainableModel};
use crate::weights::DType;

/// Added to the seed for the training-data RNG, so that it never replays the stream a
/// model initialised from the same seed drew its weights from.
const DATA_STREAM: u64 = 0x5eed_da7a_0000_0001;
/// Added to the seed for the held-out batches: a stream disjoint from the training one.
const EVAL_STREAM: u64 = 0x5eed_e0a1_0000_0002;

/// Which parameters weight decay applies to (see [`DecayRule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayParams {
    /// Matrices only: not norms, biases or embeddings ([`DecayRule::Standard`]).
    Standard,
    /// Every parameter, as `torch.optim.AdamW(model.parameters())` does.
    All,
    /// No parameter.
    None,
}

impl DecayParams {
    pub const NAMES: [&'static str; 3] = ["standard", "all", "none"];

    pub fn rule(self) -> DecayRule {
        match self {
            DecayParams::Standard => DecayRule::Standard,
            DecayParams::All => DecayRule::All,
            DecayParams::None => DecayRule::None,
        }
    }
}

/// Options of a training run. Defaults: torch's AdamW (β 0.9/0.999, eps 1e-8, weight
/// decay 0.01), lr 1e-3 with warm-up + cosine decay to 0, no clipping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Total number of updates of the run (the cosine schedule ends here).
    pub steps: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Constant learning rate `lr` instead of warm-up + cosine.
    pub constant_lr: bool,
    /// Linear warm-up steps (cosine schedule only).
    pub warmup: u64,
    /// Learning rate at the end of the cosine decay.
    pub min_lr: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub decay: DecayParams,
    /// Global-norm gradient clipping threshold; `None` = no clipping.
    pub clip: Option<f64>,
    /// Evaluate after every this many steps (0 = only after the last step).
    pub eval_every: u64,
    /// Number of held-out batches per evaluation.
    pub eval_batches: u64,
    /// Write a checkpoint after every this many steps (0 = only at the end).
    pub save_every: u64,
    /// Seed of the data RNG (and, by convention, of the model's initialisation).
    pub seed: u64,
    /// What the products compute in: f32, or bf16 with f32 master weights
    /// ([`TrainableModel::set_train_dtype`]). Runs saved before it existed were f32.
    #[serde(default)]
    pub dtype: DType,
}

impl Default for TrainConfig {
    fn default() -> Self {
        let adamw = AdamWConfig::default();
        TrainConfig {
            steps: 1000,
            lr: 1e-3,
            constant_lr: false,
            warmup: 0,
            min_lr: 0.0,
            weight_decay: adamw.weight_decay,
            beta1: adamw.beta1,
            beta2: adamw.beta2,
            eps: adamw.eps,
            decay: DecayParams::Standard,
            clip: None,
            eval_every: 0,
            eval_batches: 8,
            save_every: 0,
            seed: 0,
            dtype: DType::F32,
        }
    }
}

impl TrainConfig {
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            decay: self.decay.rule(),
        }
    }

    pub fn schedule(&self) -> Schedule {
        if self.constant_lr {
            Schedule::constant(self.lr)
        } else {
            Schedule::warmup_cosine(self.lr, self.warmup, self.steps, self.min_lr)
        }
    }

    /// Errors on an option no run can use, naming it.
    pub fn validate(&self) -> Result<()> {
        if self.steps == 0 {
            return Err(Error::invalid("steps", "must be at least 1"));
        }
        if let Some(c) = self.clip {
            if !(c.is_finite() && c > 0.0) {
                return Err(Error::invalid(
                    "clip",
                    format!("{c} is not a finite value > 0"),
                ));
            }
        }
        self.adamw().validate()?;
        self.schedule().validate()
    }
}

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

/// Batches given in a safetensors file; step `s` uses batch `s`. Integer tensors:
///
/// | tensor | shape | |
/// |---|---|---|
/// | `input_ids` | `[N, B, T]` | what the model reads (an encoder-decoder's source, `[N, B, S]`) |
/// | `targets` | `[N, B, T]` | already shifted; −100 = not scored |
/// | `attention_mask` | like `input_ids` | optional: 1 = token, 0 = padding |
/// | `decoder_input_ids` | `[N, B, T]` | encoder-decoders only: the decoder's inputs |
#[derive(Clone, Debug)]
pub struct FixedBatches {
    name: String,
    count: usize,
    batch: usize,
    /// T
    len: usize,
    /// `[N·B·T]` what the decoder (or an encoder-only model) reads
    inputs: Vec<usize>,
    targets: Vec<i64>,
    /// `[N·B·T]`, for `inputs` when they are not a source
    mask: Option<Vec<bool>>,
    /// encoder-decoder data: the source ids and mask `[N·B·S]`, and S
    source: Option<(Vec<usize>, Vec<bool>, usize)>,
}

impl FixedBatches {
    /// Reads and checks `path`: the tensors above with matching shapes, every size ≥ 1,
    /// ids ≥ 0, masks 0 or 1, targets ≥ 0 or −100.
    pub fn open(path: &Path) -> Result<Self> {
        let file = TensorFile::open(path)?;
        let name = path.display().to_string();
        let err = |reason: String| Error::Safetensors {
            path: name.clone(),
            reason,
        };
        let (shape, input_ids) = file.token_ids("input_ids", 3)?;
        let mask = match file.contains("attention_mask") {
            true => Some(file.token_mask("attention_mask", &shape, "input_ids")?),
            false => None,
        };
        let (dshape, inputs, mask, source) = match file.contains("decoder_input_ids") {
            true => {
                let (dshape, dec) = file.token_ids("decoder_input_ids", 3)?;
                if dshape[..2] != shape[..2] {
                    return Err(err(format!(
                        "`decoder_input_ids` has shape {dshape:?}; its steps and B must be those of `input_ids` {shape:?}"
                    )));
                }
                let source_mask = mask.unwrap_or_else(|| vec![true; input_ids.len()]);
                (dshape, dec, None, Some((input_ids, source_mask, shape[2])))
            }
            false => (shape.clone(), input_ids, mask, None),
        };
        let (tshape, targets) = file.ints("targets")?;
        if tshape != dshape {
            let of = if source.is_some() {
                "decoder_input_ids"
            } else {
                "input_ids"
            };
            return Err(err(format!(
                "`targets` has shape {tshape:?} but `{of}` has {dshape:?}"
            )));
        }
        if let Some((i, t)) = targets
            .iter()
            .enumerate()
            .find(|&(_, &t)| t < 0 && t != IGNORE_INDEX)
        {
            return Err(err(format!(
                "`targets` holds {t} at flat index {i}: a target is a token id or {IGNORE_INDEX}"
            )));
        }
        Ok(FixedBatches {
            name,
            count: dshape[0],
            batch: dshape[1],
            len: dshape[2],
            inputs,
            targets,
            mask,
            source,
        })
    }

    /// `(N, B, T)`.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.count, self.batch, self.len)
    }

    /// Checks the batches against a model: every id and target below `vocab`, `T` (and
    /// S) at most `max_positions` (when the model has a limit), and at least `steps`
    /// batches.
    fn check_model(&self, vocab: usize, max_positions: Option<usize>, steps: u64) -> Result<()> {
        let err = |reason: String| Error::Safetensors {
            path: self.name.clone(),
            reason,
        };
        if (self.count as u64) < steps {
            return Err(err(format!(
                "holds {} batches but the run has {steps} steps (step s uses batch s)",
                self.count
            )));
        }
        let (ids_name, src) = match &self.source {
            Some((ids, _, s)) => ("decoder_input_ids", Some((ids, *s))),
            None => ("input_ids", None),
        };
        let lengths =
            std::iter::once((ids_name, self.len)).chain(src.map(|(_, s)| ("input_ids", s)));
        for (tensor, len) in lengths {
            if let Some(max) = max_positions.filter(|&max| len > max) {
                return Err(err(format!(
                    "`{tensor}` has sequences of {len} tokens, longer than the model's {max} positions"
                )));
            }
        }
        let all =
            std::iter::once((ids_name, &self.inputs)).chain(src.map(|(ids, _)| ("input_ids", ids)));
        for (tensor, ids) in all {
            if let Some((i, id)) = ids.iter().enumerate().find(|&(_, &id)| id >= vocab) {
                return Err(err(format!(
                    "`{tensor}` holds id {id} at flat index {i}, outside the model's vocabulary of {vocab}"
                )));
            }
        }
        if let Some((i, t)) = self
            .targets
            .iter()
            .enumerate()
            .find(|&(_, &t)| t != IGNORE_INDEX && t as u64 >= vocab as u64)
        {
            return Err(err(format!(
                "`targets` holds id {t} at flat index {i}, outside the model's vocabulary of {vocab}"
            )));
        }
        Ok(())
    }

    /// Batch `i`.
    pub fn get(&self, i: usize) -> Result<Batch> {
        if i >= self.count {
            return Err(Error::OutOfRange {
                what: format!("batch of {}", self.name),
                index: i,
                size: self.count,
            });
        }
        let n = self.batch * self.len;
        let r = i * n..(i + 1) * n;
        Ok(Batch {
            inputs: self.inputs[r.clone()].to_vec(),
            targets: self.targets[r.clone()].to_vec(),
            batch: self.batch,
            len: self.len,
            mask: self.mask.as_ref().map(|m| m[r].to_vec()),
            source: self.source.as_ref().map(|(ids, mask, s)| {
                let r = i * self.batch * s..(i + 1) * self.batch * s;
                Source {
                    ids: ids[r.clone()].to_vec(),
                    mask: mask[r].to_vec(),
                    len: *s,
                }
            }),
        })
    }
}

impl BatchSource for FixedBatches {
    fn train_batch(&mut self, step: u64, _rng: &mut Rng) -> Result<Batch> {
        self.get(usize::try_from(step).unwrap_or(usize::MAX))
    }

    fn eval_batches(&self, _seed: u64, _count: u64) -> Result<Vec<Batch>> {
        Ok(Vec::new())
    }

    fn tokens_per_batch(&self) -> usize {
        self.batch * self.len
    }

    fn check(&self, vocab: usize, max_positions: Option<usize>, steps: u64) -> Result<()> {
        self.check_model(vocab, max_positions, steps)
    }
}

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

/// What one step did; one line of a run's JSON log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLog {
    /// 0-based; the step used batch `step`.
    pub step: u64,
    /// Loss on the step's batch, before its update.
    pub loss: f32,
    /// Learning rate of the update.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Held-out loss after the update (on evaluation steps only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f32>,
    /// Held-out token accuracy after the update (on evaluation steps only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
}

/// How [`Trainer::run`] saves and where it stops.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions<'a> {
    /// Checkpoint folder (written every `save_every` steps and at the end).
    pub out: Option<&'a Path>,
    /// Stop (and save) once this many steps are done, before `steps`: an
    /// interruption on purpose, which `--resume` continues.
    pub stop_after: Option<u64>,
}

/// A training run over a model it borrows.
pub struct Trainer<'m> {
    model: &'m mut dyn TrainableModel,
    config: TrainConfig,
    /// What the caller wants stored with the run (model options, data): opaque here.
    run_config: serde_json::Value,
    optimizer: AdamW,
    schedule: Schedule,
    rng: Rng,
    step: u64,
    losses: Vec<f32>,
}

impl<'m> Trainer<'m> {
    /// A fresh run. `run_config` is stored in checkpoints under `config.run`.
    pub fn new(
        model: &'m mut dyn TrainableModel,
        config: TrainConfig,
        run_config: serde_json::Value,
    ) -> Result<Self> {
        config.validate()?;
        model.set_train_dtype(config.dtype)?;
        Ok(Trainer {
            model,
            optimizer: AdamW::new(config.adamw()),
            schedule: config.schedule(),
            rng: Rng::new(config.seed.wrapping_add(DATA_STREAM)),
            step: 0,
            losses: Vec::new(),
            config,
            run_config,
        })
    }

    /// Continues the run saved in `dir`, whose state [`checkpoint::open`] returned;
    /// `model` must have been loaded from `dir`'s model files.
    pub fn resume(
        model: &'m mut dyn TrainableModel,
        dir: &Path,
        state: TrainerState,
    ) -> Result<Self> {
        let (config, run_config) = split_config(&state.config)
            .map_err(|reason| checkpoint_error(dir, "config", reason))?;
        let mut trainer = Trainer::new(model, config, run_config)?;
        checkpoint::load_optimizer(dir, &mut trainer.optimizer, &mut *trainer.model)?;
        if trainer.optimizer.step_count() != state.step {
            return Err(checkpoint_error(
                dir,
                "step",
                format!(
                    "{} but the optimiser has taken {} steps",
                    state.step,
                    trainer.optimizer.step_count()
                ),
            ));
        }
        if state.data_position != state.step {
            return Err(checkpoint_error(
                dir,
                "data_position",
                format!("{} differs from step {}", state.data_position, state.step),
            ));
        }
        trainer.rng = Rng::new(state.rng_state);
        trainer.step = state.step;
        trainer.losses = state.losses;
        Ok(trainer)
    }

    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    pub fn run_config(&self) -> &serde_json::Value {
        &self.run_config
    }

    /// Replaces the caller's part of the stored configuration (e.g. a data file that
    /// moved since the checkpoint), for the checkpoints written from now on.
    pub fn set_run_config(&mut self, run_config: serde_json::Value) {
        self.run_config = run_config;
    }

    /// Steps done so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The loss of every step so far.
    pub fn losses(&self) -> &[f32] {
        &self.losses
    }

    pub fn model(&self) -> &dyn TrainableModel {
        &*self.model
    }

    /// Changes the run's total number of steps (to extend a resumed run). Only a
    /// constant learning rate allows it: the cosine schedule is a function of the
    /// total, so changing it would change every later step.
    pub fn set_steps(&mut self, steps: u64) -> Result<()> {
        if steps == self.config.steps {
            return Ok(());
        }
        if !self.config.constant_lr {
            return Err(Error::invalid(
                "steps",
                format!(
                    "{steps} differs from the run's {} and the learning rate follows a cosine \
                     schedule over exactly that many steps (only a constant-lr run can be extended)",
                    self.config.steps
                ),
            ));
        }
        if steps < self.step {
            return Err(Error::invalid(
                "steps",
                format!("{steps} is fewer than the {} steps already done", self.step),
            ));
        }
        self.config.steps = steps;
        self.schedule = self.config.schedule();
        Ok(())
    }

    /// The state a checkpoint stores.
    pub fn state(&self) -> TrainerState {
        TrainerState {
            format: checkpoint::FORMAT,
            step: self.step,
            rng_state: self.rng.state(),
            data_position: self.step,
            config: serde_json::json!({
                "train": serde_json::to_value(&self.config).expect("TrainConfig serialises"),
                "run": self.run_config,
            }),
            losses: self.losses.clone(),
            files: Default::default(),
        }
    }

    /// Writes a checkpoint of the run into `dir` (see [`super::checkpoint`]).
    pub fn save(&self, dir: &Path) -> Result<()> {
        checkpoint::save(dir, &*self.model, &self.optimizer, &self.state())
    }

    /// One training step (module docs). On error nothing of the model or optimiser
    /// has changed.
    pub fn train_step(&mut self, data: &mut dyn BatchSource) -> Result<StepLog> {
        let step = self.step;
        let batch = data.train_batch(step, &mut self.rng)?;
        self.model.zero_grads();
        // Weights grown non-finite make the forward fail its input checks before any
        // loss exists: that stops training like a non-finite loss does.
        let loss = self.model.loss_and_backward(&batch).map_err(|e| match e {
            Error::NonFinite { .. } => Error::invalid(
                "training",
                format!("step {step}: the run diverged ({e}); training stopped"),
            ),
            e => e,
        })?;
        if !loss.is_finite() {
            return Err(Error::invalid(
                "loss",
                format!("step {step}: the loss is {loss}; training stopped"),
            ));
        }
        // The norm is logged, and checks every gradient is finite before any update.
        let grad_norm = optim::grad_norm(&mut *self.model).map_err(|e| {
            Error::invalid("gradients", format!("step {step}: {e}; training stopped"))
        })?;
        let scale = match self.config.clip {
            Some(max) => optim::clip_coefficient(grad_norm, max)?,
            None => 1.0,
        };
        let lr = self.schedule.lr(step);
        self.optimizer.step_scaled(lr, scale, &mut *self.model)?;
        self.step += 1;
        self.losses.push(loss);
        Ok(StepLog {
            step,
            loss,
            lr,
            grad_norm,
            eval_loss: None,
            eval_accuracy: None,
        })
    }

    /// Loss and token accuracy of the model on `batches` (no gradients, no RNG).
    pub fn evaluate(&self, batches: &[Batch]) -> Result<Eval> {
        evaluate(&*self.model, batches)
    }

    /// Runs steps until `config.steps` (or `opts.stop_after`), evaluating on `eval`
    /// when due and calling `on_step` after each step. Checkpoints go to `opts.out`
    /// every `save_every` steps and when the run stops; on an error the run stops
    /// without saving, so the last checkpoint written stays the last good one.
    pub fn run(
        &mut self,
        data: &mut dyn BatchSource,
        eval: &[Batch],
        opts: RunOptions<'_>,
        on_step: &mut dyn FnMut(&StepLog),
    ) -> Result<()> {
        let end = opts
            .stop_after
            .map_or(self.config.steps, |s| s.min(self.config.steps));
        let mut saved_at = None;
        while self.step < end {
            let mut log = self.train_step(data)?;
            let done = self.step;
            let every = self.config.eval_every;
            if !eval.is_empty()
                && ((every > 0 && done.is_multiple_of(every)) || done == self.config.steps)
            {
                let e = self.evaluate(eval)?;
                log.eval_loss = Some(e.loss);
                log.eval_accuracy = Some(e.accuracy);
            }
            on_step(&log);
            let every = self.config.save_every;
            if let Some(dir) = opts.out {
                if every > 0 && done.is_multiple_of(every) {
                    self.save(dir)?;
                    saved_at = Some(done);
                }
            }
        }
        if let Some(dir) = opts.out {
            if saved_at != Some(self.step) {
                self.save(dir)?;
            }
        }
        Ok(())
    }
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

fn checkpoint_error(dir: &Path, field: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        path: dir.join(checkpoint::STATE_FILE).display().to_string(),
        field: field.into(),
        reason: reason.into(),
    }
}

/// The trainer's and the caller's parts of a stored `config`.
fn split_config(
    config: &serde_json::Value,
) -> std::result::Result<(TrainConfig, serde_json::Value), String> {
    let train = config.get("train").ok_or("lacks `train`")?.clone();
    let train: TrainConfig = serde_json::from_value(train).map_err(|e| format!("train: {e}"))?;
    Ok((train, config.get("run").cloned().unwrap_or_default()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_through_json_and_validates() {
        let c = TrainConfig {
            clip: Some(1.0),
            ..TrainConfig::default()
        };
        let v = serde_json::json!({"train": c, "run": {"task": "copy"}});
        let (back, run) = split_config(&v).unwrap();
        assert_eq!(back, c);
        assert_eq!(run["task"], "copy");
        assert!(TrainConfig {
            steps: 0,
            ..c.clone()
        }
        .validate()
        .is_err());
        assert!(TrainConfig {
            clip: Some(0.0),
            ..c.clone()
        }
        .validate()
        .is_err());
        assert!(TrainConfig { warmup: 5000, ..c }.validate().is_err());
    }
}
