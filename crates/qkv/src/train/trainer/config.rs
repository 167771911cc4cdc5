//! A run's options ([`TrainConfig`]): the optimiser's, the schedule's, clipping,
//! evaluation and checkpoint cadence, the seed and the compute type, as stored in a
//! checkpoint's `config.train`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::train::optim::{AdamWConfig, DecayRule};
use crate::train::schedule::Schedule;
use crate::weights::DType;

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
    ///
    /// [`TrainableModel::set_train_dtype`]: crate::train::trainable::TrainableModel::set_train_dtype
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

/// The trainer's and the caller's parts of a stored `config`.
pub(super) fn split_config(
    config: &serde_json::Value,
) -> std::result::Result<(TrainConfig, serde_json::Value), String> {
    let train = config.get("train").ok_or("lacks `train`")?.clone();
    let train: TrainConfig = serde_json::from_value(train).map_err(|e| format!("train: {e}"))?;
    Ok((train, config.get("run").cloned().unwrap_or_default()))
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
