//! Models: one [`Transformer`] built from one [`Arch`], for every family, for inference
//! and for training.
//!
//! - [`net`]: the network (the architecture, its parameters, forward, backward);
//! - [`families`]: the checkpoint families, one file each (its `config.json` read into
//!   an [`Arch`], its tensor-name table, its quirks) and their registry;
//! - `transformer/`, `folder.rs`, `info.rs`: the model, a model folder in and out, what
//!   `qkv inspect` says of it;
//! - [`generate`]: greedy, sampled and beam generation under a folder's settings;
//! - [`sentence`]: sentence-transformers embeddings.
//!
//! | family | architectures | what it exercises |
//! |---|---|---|
//! | [`bert`] | `BertModel`, `BertForMaskedLM`, … | encoder, learned positions, token types, post-norm, masked-LM head |
//! | [`roberta`] | `RobertaModel`, `XLMRobertaModel`, their `…ForMaskedLM` | BERT with positions counted from `padding_idx + 1` |
//! | [`distilbert`] | `DistilBertModel`, `DistilBertForMaskedLM` | BERT without token types, its own names |
//! | [`modernbert`] | `ModernBertModel`, `ModernBertForMaskedLM` | a pre-norm encoder with RoPE, local layers windowed on both sides, GeGLU, no biases |
//! | [`gpt2`] | `GPT2LMHeadModel` | decoder-only, causal, learned positions, pre-norm, Conv1D weights |
//! | [`llama`] | `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM` | RoPE (and its scalings), RMSNorm, SwiGLU, GQA, sliding window, Q/K/V biases, per-head q/k norms |
//! | [`bloom`] | `BloomForCausalLM` | ALiBi, fused per-head QKV, embedding LayerNorm |
//! | [`gemma`] | `Gemma2ForCausalLM`, `Gemma3ForCausalLM` | √C embeddings, 1 + w RMSNorm, sandwich norms, GeGLU, soft caps, local/global layers, per-layer RoPE bases, q/k norms |
//! | [`phi3`] | `Phi3ForCausalLM` | fused QKV and gate/up blocks, LongRoPE, partial rotary |
//! | [`gpt_neox`] | `GPTNeoXForCausalLM` | parallel residual, partial rotary, fused per-head QKV |
//! | [`marian`] | `MarianMTModel` | the original encoder-decoder: sinusoidal, post-norm, cross-attention |
//! | [`t5`] | `T5ForConditionalGeneration` | relative position buckets, unscaled scores, gated FFN |
//! | qkv | `QkvTransformer` | any [`Arch`] no Hugging Face class has (ALiBi + post-norm, …) |

mod classify;
pub mod explain;
pub mod families;
mod folder;
pub mod generate;
mod gguf;
mod info;
pub mod net;
mod reading;
mod rows;
pub mod sentence;
mod transformer;
mod varlen;

pub use classify::{Scoring, SequenceClassifier, Truncate};
pub use families::{
    bert, bloom, distilbert, gemma, gpt2, gpt_neox, llama, marian, modernbert, phi3, roberta, t5,
};
pub use families::{supported, Family, Loc, SpecialTokens, NATIVE_ARCHITECTURE};
pub use folder::{load, load_in};
pub use generate::{config as generation_config, request};
pub use gguf::{load_gguf, save_gguf};
pub use info::ModelInfo;
pub use net::arch::{Arch, Head, ModelKind, Position, StackDims};
pub use net::backward::Tape;
pub use net::forward::Encoded;
pub use net::weights::{HeadWeights, Stack, Weights};
pub use net::{arch, weights};
pub use reading::Loaded;
pub use rows::Chunk;
pub use transformer::{Attentions, Input, Output, Transformer};

pub use crate::attention::{KvCache, KvDType, LayerKv, Step};
pub use crate::batch::TokenBatch;
