//! Numerical building blocks: the f32 matrix product, softmax, activations, the
//! instruction-set plumbing and the thread pool. Weights stored in other number types
//! are [`crate::weights`]'.

pub mod activation;
pub(crate) mod aligned;
pub(crate) mod disjoint;
pub mod fastmath;
pub mod isa;
pub mod matmul;
pub mod pool;
pub mod simd;
pub mod softmax;
mod team;
pub mod vector;
pub mod vmath;

pub use activation::Activation;
pub use matmul::{gemm, gemm_packed, matmul, MatMut, MatRef, PackedWeight, Par};
pub use pool::{for_each_task, on_pool};
pub use softmax::{argmax, softmax, softmax_backward, softmax_rows};
