//! Layers with parameters: linear maps, embeddings, norms, feed-forward blocks.

pub mod embedding;
pub mod ffn;
pub mod linear;
pub mod norm;

pub use embedding::{Embedding, EmbeddingGrads};
pub use ffn::{FeedForward, FeedForwardCache, FeedForwardGrads};
pub use linear::{Linear, LinearGrads};
pub use norm::{LayerNorm, LayerNormCache, LayerNormGrads, RmsNorm, RmsNormCache, RmsNormGrads};
