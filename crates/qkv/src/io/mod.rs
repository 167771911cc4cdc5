//! Reading and writing tensors on disk.

pub mod safetensors;

pub use self::safetensors::TensorFile;
