//! Numerical building blocks: matrix products, softmax, activations.

pub mod activation;
pub(crate) mod aligned;
pub mod amx;
pub mod bf16;
pub mod blocks;
pub(crate) mod disjoint;
pub mod dtype;
pub mod fastmath;
pub mod int8;
pub mod isa;
pub mod matmul;
pub mod pool;
pub mod simd;
pub mod softmax;
pub mod stored;
pub mod vector;
pub mod vmath;

pub use activation::Activation;
pub use dtype::DType;
pub use matmul::{gemm, gemm_packed, matmul, MatMut, MatRef, PackedWeight, Par};
pub use pool::on_pool;
pub use softmax::{argmax, softmax, softmax_backward, softmax_rows};
