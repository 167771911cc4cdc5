//! Weights in the 4- to 6-bit blocks of GGUF files (ggml's Q4_0, Q4_K, Q5_K and Q6_K),
//! computed from the blocks as they are stored: a model loaded from such a file holds
//! no f32 copy of these weights.
//!
//! - [`layout`]: the block formats, and their codes, scales and offsets unpacked;
//! - [`dequant`]: a block → its f32 weights, as `gguf.quants.dequantize` gives them
//!   (the twin every form is held to);
//! - [`activations`]: x quantized the way llama.cpp quantizes activations for these
//!   blocks: Q8_K (a float scale and 256 codes a super-block, with sums per 16) for
//!   the K-quants, Q8_0 for Q4_0;
//! - [`weight`], [`panels`]: a `[N, K]` weight of whole blocks, the file's rows
//!   interleaved in panels of 16 rows;
//! - [`product`](mod@product): y (+)= deq(q(x))·deq(W)ᵀ, every row count in tiles of
//!   integer dot products, as llama.cpp computes them: each group's sum exact in i32,
//!   only the sum over super-blocks in f32 (`tile`: `vpdpbusd` on AVX-512 VNNI,
//!   `vpmaddubsw` and `vpmaddwd` on AVX2); without AVX2 a few rows run the same tiles
//!   in plain loops and more dequantize both operands slab by slab into the f32
//!   product;
//! - [`reference`](mod@reference): the twin: x quantized as every form quantizes it,
//!   both operands dequantized, then the f32 product;
//! - [`f16`](mod@f16): a GGUF file's F16 weights, likewise computed from as stored (the
//!   activations rounded to f16 as llama.cpp rounds them, products and sums in f32).

pub mod activations;
pub mod dequant;
pub mod f16;
pub mod layout;
pub mod panels;
pub mod product;
pub mod reference;
mod tile;
pub mod weight;

pub use layout::BlockType;

pub use weight::BlockWeight;
