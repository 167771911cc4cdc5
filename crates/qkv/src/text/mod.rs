//! Tokenizers: Hugging Face `tokenizer.json` files through the `tokenizers` crate.

pub mod tokenizer;

pub use tokenizer::Tokenizer;
