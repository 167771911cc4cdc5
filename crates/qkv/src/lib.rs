//! # qkv — the Transformer's core mechanism, in Rust
//!
//! Scaled dot-product attention `softmax(Q·Kᵀ/√d_k + bias)·V` and what the
//! Transformer builds around it: the three parallel projections W_Q, W_K, W_V,
//! causal and padding masks, multi-head (and grouped-query) attention, self- and
//! cross-attention, position encodings (sinusoidal, learned, RoPE, ALiBi, T5
//! relative buckets), norms and the feed-forward block.
//!
//! ## Shape legend
//!
//! Every doc comment writes shapes with these letters:
//!
//! `B` batch · `T` query length · `S` key length · `C` model width · `H` heads ·
//! `G` key/value heads · `D` head width · `Dv` value head width · `F` FFN width ·
//! `V` vocabulary.
//!
//! Attention takes Q `[B,T,H,D]`, K `[B,S,G,D]`, V `[B,S,G,Dv]` and returns
//! `[B,T,H,Dv]`; weights, when asked for, are `[B,H,T,S]`.
//!
//! ```
//! use qkv::{attention, AttentionSpec, CausalAlign, Tensor};
//! let (b, t, h, d) = (1, 4, 2, 8);
//! let q = Tensor::from_fn(&[b, t, h, d], |i| (i as f32 * 0.37).sin());
//! let k = Tensor::from_fn(&[b, t, h, d], |i| (i as f32 * 0.11).cos());
//! let v = Tensor::from_fn(&[b, t, h, d], |i| i as f32 * 0.01);
//! let spec = AttentionSpec { causal: Some(CausalAlign::TopLeft), want_weights: true, ..Default::default() };
//! let a = attention(&q, &k, &v, &spec)?;
//! assert_eq!(a.out.shape(), &[1, 4, 2, 8]);
//! // the first query can only see the first key
//! assert_eq!(a.weights.unwrap().data()[0..4], [1.0, 0.0, 0.0, 0.0]);
//! # Ok::<(), qkv::Error>(())
//! ```

pub mod attention;
pub mod attribution;
pub mod batch;
pub mod block;
#[cfg(feature = "models")]
pub mod engine;
pub mod error;
#[cfg(feature = "models")]
pub mod experiments;
#[cfg(feature = "io")]
pub mod io;
pub mod layers;
#[cfg(feature = "models")]
pub mod models;
pub mod module;
pub mod ops;
pub mod position;
pub mod rng;
pub mod rnn;
pub mod tensor;
#[cfg(feature = "text")]
pub mod text;
#[cfg(feature = "models")]
pub mod train;
pub mod weights;

pub use attention::{
    attention, AttentionOutput, AttentionSpec, Bias, Broadcast, CausalAlign, Kernel,
};
pub use block::MultiHeadAttention;
pub use error::{Error, Result};
pub use tensor::Tensor;
