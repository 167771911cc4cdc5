//! [`Trainer`]: a run's state (model, optimiser, schedule, data RNG, step) and its loop,
//! from a fresh start or a checkpoint ([the trainer's module docs](super) give one step).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::train::checkpoint::{self, TrainerState};
use crate::train::optim::{self, AdamW};
use crate::train::schedule::Schedule;
use crate::train::trainable::{Batch, TrainableModel};

use super::batches::BatchSource;
use super::config::{split_config, TrainConfig};
use super::eval::{evaluate, Eval};

/// Added to the seed for the training-data RNG, so that it never replays the stream a
/// model initialised from the same seed drew its weights from.
const DATA_STREAM: u64 = 0x5eed_da7a_0000_0001;

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

    /// Writes a checkpoint of the run into `dir` (see [`crate::train::checkpoint`]).
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

fn checkpoint_error(dir: &Path, field: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        path: dir.join(checkpoint::STATE_FILE).display().to_string(),
        field: field.into(),
        reason: reason.into(),
    }
}
