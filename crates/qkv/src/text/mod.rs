//! Tokenizers: Hugging Face `tokenizer.json` files through the `tokenizers` crate, and
//! readable labels of tokens for attention maps.

pub mod labels;
pub mod tokenizer;

pub use labels::TokenLabel;
pub use tokenizer::{TextStream, Tokenizer};
