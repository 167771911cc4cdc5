//! The flags several commands share: `--dtype`, `--kv-dtype`, and `--threads`, which
//! sizes the pool.

use anyhow::Result;
use qkv::models::KvDType;
use qkv::weights::DType;

use super::flags::in_flags;

/// Sizes the global rayon pool from a `--threads` flag (`None`: all cores).
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    qkv::ops::pool::use_threads(threads).map_err(in_flags::<Threads>)
}

/// `--dtype`, for the commands that run a model.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct DTypeFlag {
    /// Number type of the linear layers' weights: f32; bf16 (half the bytes, products
    /// summed in f32); int8 (8-bit codes, a scale per 32 weights of a row as GGUF's
    /// Q8_0, activations quantized per 32 on the fly); or int8-row (a scale per row).
    /// Norms, softmax and the residual stream stay f32
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DType,
}

pub fn parse_dtype(s: &str) -> std::result::Result<DType, String> {
    s.parse::<DType>().map_err(|e| e.to_string())
}

/// `--kv-dtype`, for the commands that decode through a KV cache.
#[derive(clap::Args, Clone, Copy)]
pub struct KvDTypeFlag {
    /// Number type the KV cache stores keys and values in: f32, or bf16 (half the bytes
    /// a decoding step reads from the cache; attention still computes in f32)
    #[arg(long, default_value = "f32", value_parser = parse_kv_dtype)]
    pub kv_dtype: KvDType,
}

fn parse_kv_dtype(s: &str) -> std::result::Result<KvDType, String> {
    s.parse::<KvDType>().map_err(|e| e.to_string())
}

/// The one flag every command that sizes the pool has.
#[derive(clap::Args)]
struct Threads {
    #[arg(long)]
    threads: Option<usize>,
}
