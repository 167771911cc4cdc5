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

mod batches;
mod config;
mod eval;
mod fixed;
mod run_loop;

pub use batches::{BatchSource, TaskBatches, TextBatches};
pub use config::{DecayParams, TrainConfig};
pub use eval::{evaluate, token_accuracy, Eval};
pub use fixed::FixedBatches;
pub use run_loop::{RunOptions, StepLog, Trainer};
