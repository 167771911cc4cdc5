//! Reading and writing tensors and model folders on disk.

pub mod atomic;
pub mod checkpoint;
pub mod config;
pub mod files;
pub mod gguf;
pub mod memory;
pub mod safetensors;
mod token_tensors;

pub use self::atomic::{write_atomic, write_atomic_with};
pub use self::checkpoint::{Checkpoint, TensorSource};
pub use self::config::{
    aliased_size, bad_field, check_heads, check_positive, eps, epsilon, field_error, json_f32,
    read_config, read_json, read_json_or_default, read_text, size, yes,
};
pub use self::files::{check_regular, inside, open_regular, read_regular, read_regular_text};
pub use self::safetensors::{save, TensorFile};

/// A fresh, empty folder for one unit test: `qkv-{name}-{pid}` in the temporary folder.
#[cfg(test)]
pub(crate) fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
