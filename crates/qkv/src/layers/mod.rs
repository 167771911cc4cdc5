//! Layers with parameters: linear maps, embeddings, norms, feed-forward blocks. Each
//! has a forward, a forward that saves what its backward needs, and a backward that
//! accumulates into a gradient of the layer's own type.

pub mod embedding;
pub mod ffn;
pub mod linear;
pub mod norm;

pub use embedding::Embedding;
pub use ffn::{FeedForward, FeedForwardCache};
pub use linear::Linear;
pub use norm::{maybe_norm, maybe_norm_backward, Norm, NormCache, NormKind, NormTape};
