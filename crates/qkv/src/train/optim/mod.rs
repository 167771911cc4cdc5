//! AdamW (decoupled weight decay) matching `torch.optim.AdamW`, global-norm gradient
//! clipping matching `torch.nn.utils.clip_grad_norm_`, and the [`Params`] visitor through
//! which a model hands its parameters and gradients to both without copying them.
//!
//! ## The update (one call of [`AdamW::step`], step count `t` after incrementing)
//!
//! For every parameter `p` with gradient `g`, exactly as torch's single-tensor path
//! (the one it uses on CPU) orders the operations:
//!
//! ```text
//! p ← p · (1 − lr·wd)                      only if p decays (see DecayRule) and wd ≠ 0
//! m ← m + (1 − β₁)·(g − m)                 torch: exp_avg.lerp_(g, 1 − β₁)
//! v ← v·β₂ + (1 − β₂)·g·g                  torch: exp_avg_sq.mul_(β₂).addcmul_(g, g, 1 − β₂)
//! denom = √v / √(1 − β₂ᵗ) + eps            eps is added *after* the bias correction
//! p ← p + (−lr / (1 − β₁ᵗ))·m / denom
//! ```
//!
//! Hyperparameters and the scalars derived from them are `f64`, like the Python floats
//! torch computes them in; each is rounded to `f32` where torch hands it to an `f32`
//! kernel. Tensors are `f32`.
//!
//! ## Feeding parameters
//!
//! The optimiser visits parameters through [`Params::visit`], the same callback as
//! [`TrainableModel::visit_params`] (every trainable model is a [`Params`]): `f(name,
//! param, grad)` for every trainable tensor, always in the same order. The optimiser
//! keeps its moments in that order and checks the names on every step, so a model whose
//! visiting order changed is an error, not silent corruption. [`NamedParam`] lists,
//! borrowed triples and [`VisitFn`] closures implement the trait too.
//!
//! ## Clipping
//!
//! Gradients are visited read-only, so clipping does not rewrite them: [`grad_norm`]
//! gives the total norm, [`clip_coefficient`] torch's factor `min(max_norm / (norm +
//! 1e-6), 1)`, and [`AdamW::step_scaled`] multiplies each gradient element by it as it
//! reads it — the same f32 product torch's in-place `grad.mul_(coef)` stores, so the
//! update is bit-for-bit the one after `clip_grad_norm_`. [`AdamW::step_clipped`] does
//! all three. [`clip_grad_norm`] clips gradients in place where the caller holds them
//! mutably.
//!
//! ```
//! use qkv::train::optim::{AdamW, AdamWConfig, NamedParam};
//! use qkv::Tensor;
//! let mut params = vec![NamedParam::new("layer.weight", Tensor::from_fn(&[2, 3], |i| i as f32))];
//! params[0].grad.data_mut().fill(0.5);
//! let mut opt = AdamW::new(AdamWConfig::default());
//! opt.step(1e-3, &mut params[..])?;
//! assert_eq!(opt.step_count(), 1);
//! // first step: m̂/√v̂ = g/|g| = 1, so each weight moves by lr (after decay by lr·wd)
//! let w1 = params[0].value.data()[1];
//! assert!((w1 - (1.0 * (1.0 - 1e-3 * 0.01) - 1e-3)).abs() < 1e-6);
//! # Ok::<(), qkv::Error>(())
//! ```
//!
//! [`TrainableModel::visit_params`]: crate::train::trainable::TrainableModel::visit_params

mod adamw;
mod chunks;
mod clip;
mod config;
mod params;
mod state;

pub use adamw::AdamW;
pub use clip::{clip_coefficient, clip_grad_norm, grad_norm};
pub use config::{AdamWConfig, DecayRule, NO_DECAY_SUBSTRINGS};
pub use params::{NamedParam, Params, VisitFn};
