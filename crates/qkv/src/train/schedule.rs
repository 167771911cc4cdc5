//! Learning-rate schedules: constant, and linear warm-up followed by cosine decay to a
//! minimum — the schedule of `transformers.get_cosine_with_min_lr_schedule_with_warmup`
//! (and, with `min_lr = 0`, of `get_cosine_schedule_with_warmup`).
//!
//! `step` counts the updates already applied: the first update uses `lr(0)`, exactly as
//! torch's `LambdaLR` does when `scheduler.step()` follows `optimizer.step()`.
//!
//! Warm-up + cosine, with peak `lr`, `W` warm-up steps, `N` total steps and floor
//! `min_lr`:
//!
//! ```text
//! s < W:       lr(s) = lr · s / max(1, W)                       (so lr(0) = 0 when W > 0)
//! W ≤ s ≤ N:   p = (s − W) / max(1, N − W)
//!              lr(s) = min_lr + (lr − min_lr) · ½(1 + cos(π·p))
//! s > N:       lr(s) = min_lr                                   (transformers would rise again)
//! ```
//!
//! transformers writes the cosine part as `lr·(f·(1 − r) + r)` with `r = min_lr / lr`,
//! the same value. Computed in f64 like the Python original.
//!
//! ```
//! use qkv::train::schedule::Schedule;
//! let s = Schedule::warmup_cosine(1e-3, 10, 110, 1e-4);
//! assert_eq!(s.lr(0), 0.0);
//! assert!((s.lr(5) - 5e-4).abs() < 1e-15);
//! assert!((s.lr(10) - 1e-3).abs() < 1e-15);          // peak at the end of warm-up
//! assert!((s.lr(60) - 5.5e-4).abs() < 1e-15);        // half-way: (lr + min_lr) / 2
//! assert!((s.lr(110) - 1e-4).abs() < 1e-15);
//! assert_eq!(s.lr(1000), 1e-4);
//! ```

use crate::error::{Error, Result};

/// A learning rate as a function of the number of updates already applied.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// `lr(s) = lr` for every step.
    Constant {
        lr: f64,
    },
    WarmupCosine(WarmupCosine),
}

/// Linear warm-up from 0 over `warmup_steps`, then cosine decay from `lr` to `min_lr` at
/// `total_steps`, constant `min_lr` afterwards (module docs: formula).
#[derive(Clone, Debug, PartialEq)]
pub struct WarmupCosine {
    pub lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub min_lr: f64,
}

impl Schedule {
    pub fn constant(lr: f64) -> Self {
        Schedule::Constant { lr }
    }

    pub fn warmup_cosine(lr: f64, warmup_steps: u64, total_steps: u64, min_lr: f64) -> Self {
        Schedule::WarmupCosine(WarmupCosine {
            lr,
            warmup_steps,
            total_steps,
            min_lr,
        })
    }

    /// Errors on a negative or non-finite rate, `min_lr > lr`, or a warm-up longer
    /// than the run.
    pub fn validate(&self) -> Result<()> {
        match self {
            Schedule::Constant { lr } => rate("lr", *lr),
            Schedule::WarmupCosine(c) => c.validate(),
        }
    }

    /// The learning rate of the update that follows `step` applied updates.
    pub fn lr(&self, step: u64) -> f64 {
        match self {
            Schedule::Constant { lr } => *lr,
            Schedule::WarmupCosine(c) => c.lr(step),
        }
    }
}

/// A rate must be finite and ≥ 0.
fn rate(field: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("{v} is not a finite value ≥ 0"),
        ))
    }
}

impl WarmupCosine {
    fn validate(&self) -> Result<()> {
        rate("lr", self.lr)?;
        rate("min_lr", self.min_lr)?;
        if self.min_lr > self.lr {
            return Err(Error::invalid(
                "min_lr",
                format!("{} is above the peak lr {}", self.min_lr, self.lr),
            ));
        }
        if self.warmup_steps > self.total_steps {
            return Err(Error::invalid(
                "warmup_steps",
                format!(
                    "{} is more than the {} total steps",
                    self.warmup_steps, self.total_steps
                ),
            ));
        }
        Ok(())
    }

    fn lr(&self, step: u64) -> f64 {
        let (lr, warmup, total) = (self.lr, self.warmup_steps, self.total_steps);
        if step < warmup {
            return lr * step as f64 / warmup.max(1) as f64;
        }
        if step > total {
            return self.min_lr;
        }
        let progress = (step - warmup) as f64 / total.saturating_sub(warmup).max(1) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        // transformers: lr · max(0, cosine·(1 − r) + r), r = min_lr / lr
        if lr == 0.0 {
            return 0.0;
        }
        let r = self.min_lr / lr;
        lr * (cosine * (1.0 - r) + r).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_and_validation() {
        assert_eq!(Schedule::constant(0.3).lr(12345), 0.3);
        assert!(Schedule::constant(-1.0).validate().is_err());
        assert!(Schedule::warmup_cosine(1e-3, 5, 4, 0.0).validate().is_err());
        assert!(Schedule::warmup_cosine(1e-3, 5, 10, 2e-3)
            .validate()
            .is_err());
        assert!(Schedule::warmup_cosine(1e-3, 5, 10, 1e-4)
            .validate()
            .is_ok());
    }

    #[test]
    fn cosine_is_monotone_after_warmup_and_ends_at_min() {
        let s = Schedule::warmup_cosine(1.0, 3, 20, 0.1);
        let lrs: Vec<f64> = (0..=25).map(|t| s.lr(t)).collect();
        assert!(lrs[..=3].windows(2).all(|w| w[0] < w[1]));
        assert!(lrs[3..=20].windows(2).all(|w| w[0] > w[1]));
        assert!((lrs[20] - 0.1).abs() < 1e-15);
        assert!(lrs[20..].iter().all(|&l| (l - 0.1).abs() < 1e-15));
    }
}
