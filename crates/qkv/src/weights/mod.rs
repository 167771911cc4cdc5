//! Weights stored in other number types than f32, and their products with f32
//! activations: what every type shares ([`stored`]: the [`StoredWeight`](stored::StoredWeight) interface, the
//! forms a product takes, the panel sweep, the widened form and the twin), bf16
//! ([`bf16`]), int8 codes with a scale per 32 or per row ([`int8`]), a GGUF file's f16
//! values and 4- to 6-bit blocks as ggml stores them ([`ggml`]), Intel AMX's tile
//! registers ([`amx`]), and the names of the types ([`dtype`]).

pub mod amx;
pub mod bf16;
pub mod dtype;
pub mod ggml;
pub mod int8;
pub mod stored;

pub use dtype::DType;
