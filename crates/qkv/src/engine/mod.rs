//! What a server runs between its requests and the model: a prefix cache of keys and
//! values shared between sequences.

pub mod prefix;

pub use prefix::{reusable_positions, PrefixCache, PrefixStats};
