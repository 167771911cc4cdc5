//! Sentence embeddings as sentence-transformers computes them: a BERT-family encoder,
//! then pooling over each text's real tokens, then (optionally) L2 normalisation.

mod encoder;
mod files;
mod pooling;

pub use encoder::SentenceEncoder;
pub use pooling::{l2_normalize, pool, PoolingMode};
