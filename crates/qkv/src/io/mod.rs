//! Reading and writing tensors and model folders on disk.

pub mod atomic;
pub mod checkpoint;
pub mod config;
pub mod safetensors;

pub use self::atomic::write_atomic;
pub use self::checkpoint::Checkpoint;
pub use self::config::{bad_field, read_config};
pub use self::safetensors::{save, TensorFile};
