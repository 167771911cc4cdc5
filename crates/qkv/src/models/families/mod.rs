//! The checkpoint families: each file reads its `config.json` into an
//! [`Arch`](crate::models::Arch), names where its tensors live, and holds its quirks;
//! `registry.rs` lists them.

pub mod bert;
pub mod bloom;
mod checks;
mod def;
pub mod distilbert;
pub mod gemma;
pub mod gpt2;
pub mod gpt_neox;
pub mod keys;
pub mod llama;
pub mod marian;
pub mod modernbert;
pub(crate) mod names;
mod native;
pub mod phi3;
mod registry;
pub mod roberta;
pub(crate) mod special;
pub mod t5;

pub use def::{ClassifierLayout, PoolActivation};
pub use names::Loc;
pub use native::NATIVE_ARCHITECTURE;
pub use registry::{supported, Family};
pub use special::SpecialTokens;
