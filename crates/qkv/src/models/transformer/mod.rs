//! [`Transformer`]: one model for every family and for both uses. It runs checkpoints
//! (with a KV cache when generating), trains (a forward that keeps what the backward
//! needs, and the backward), returns attention weights when asked, and saves itself in
//! its family's layout.
//!
//! - `model.rs`: the struct, its inputs and outputs, and the entry points (inference
//!   with or without a cache, the training forward and backward);
//! - `dtype.rs`: what the linear layers compute in (packing as bf16 or int8, keeping
//!   only the packed copies, their bytes);
//! - `attribution_hooks.rs`: what attribution asks of a forward (the maps' gradients,
//!   value norms, a key hidden).

mod attribution_hooks;
mod dtype;
mod model;

pub use model::{Attentions, Input, Output, Transformer};
