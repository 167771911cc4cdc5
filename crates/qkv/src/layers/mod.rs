//! Layers with parameters: linear maps, embeddings, norms, feed-forward blocks.

pub mod embedding;
pub mod ffn;
pub mod linear;
pub mod norm;

pub use embedding::Embedding;
pub use ffn::FeedForward;
pub use linear::Linear;
pub use norm::{LayerNorm, RmsNorm};
