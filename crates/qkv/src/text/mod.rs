//! Tokenizers: Hugging Face `tokenizer.json` files through the `tokenizers` crate,
//! SentencePiece models converted for it (Marian, T5), the
//! byte tokenizer that byte-level models are saved with, and readable labels of tokens
//! for attention maps.

pub mod bytes;
pub mod chat;
pub mod chat_process;
mod gguf_vocab;
mod gguf_vocab_out;
mod guards;
pub mod labels;
mod marian;
mod sentencepiece;
pub mod token_bytes;
pub mod tokenizer;

pub use chat::ChatTemplate;
pub use chat_process::Renderer;
pub use gguf_vocab_out::folder_gguf_metadata;
pub use labels::TokenLabel;
pub use tokenizer::{TextStream, Tokenizer};
