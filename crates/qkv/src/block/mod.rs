//! The pieces a Transformer layer is assembled from, shared by every model family.

pub mod attention_layer;

pub use attention_layer::{AttendOpts, AttentionLayer, CrossKv};
