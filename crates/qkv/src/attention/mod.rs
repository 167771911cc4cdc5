//! Scaled dot-product attention, `softmax(Q·Kᵀ·scale + bias)·V`: the one entry point
//! every layer and model calls, with masks and position biases as parts of one spec.
//!
//! Layout: Q `[B,T,H,D]`, K `[B,S,G,D]`, V `[B,S,G,Dv]`, output `[B,T,H,Dv]`. G key/value
//! heads serve H query heads (G = H: multi-head, 1 < G < H: grouped-query, G = 1:
//! multi-query); kernels read the shared heads through strides, never copying K/V.

mod backward;
mod cache;
mod call;
mod decode;
mod kv_span;
mod micro;
mod output;
mod panels;
mod reference;
mod scratch;
mod spec;
mod tiled;
mod tiled_bf16;
mod view;

pub use backward::{attention_backward, attention_backward_views, weight_grads, AttentionGrads};
pub use cache::{KvCache, KvDType, LayerKv, Step};
pub use call::{attention, attention_views};
pub use kv_span::KvSpan;
pub use output::AttentionOutput;
pub use spec::{validate, AttentionSpec, Bias, Broadcast, CausalAlign, Dims, Kernel};
pub use view::HeadsView;
