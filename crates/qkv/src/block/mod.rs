//! The pieces every model is assembled from, shared by all families and by training:
//! the attention sub-layer ([`MultiHeadAttention`]) and the residual [`Block`] around
//! it and the feed-forward network. Each has a forward (inference, with an optional KV
//! cache), the same forward keeping what the backward needs, and a backward that
//! accumulates into a gradient tree of its own type.

pub mod attention;
pub mod layer;

pub use attention::{
    Attend, Attended, AttnGrads, AttnTape, CrossKv, Keys, MultiHeadAttention, Segment,
};
pub use layer::{Block, BlockTape, LayerGrads, LayerOut, LayerRule, Residual};
