//! Subcommands over real checkpoints (forward, generate, attention, embed, inspect),
//! training, and benchmarks.

pub mod attention;
pub mod bench;
pub mod classify;
pub mod convert;
pub mod embed;
pub mod experiment;
mod flags;
pub mod forward;
pub mod generate;
pub mod inspect;
mod machine;
pub mod train;
mod writable;

use std::path::Path;

use anyhow::{Context, Result};
use qkv::models::{self, KvDType, Loaded, Transformer};
use qkv::text::Tokenizer;
use qkv::weights::DType;

pub use flags::{as_flags, in_flags};
pub use writable::check_writable;

/// A chat-template renderer whose workers are this binary's hidden `render-templates`
/// (qkv::text::chat_process: a template's memory and time bounded apart from the model).
pub fn template_renderer() -> Result<qkv::text::Renderer> {
    let exe = std::env::current_exe().context("the path of the qkv binary")?;
    Ok(qkv::text::Renderer::new(
        exe,
        vec!["render-templates".into()],
    ))
}

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

/// Prints the model's load warnings (`config.json` keys qkv does not know, special ids
/// outside the vocabulary), one line each on stderr.
pub fn show_load_warnings(model: &Transformer) {
    for w in &model.load_warnings {
        eprintln!("warning: {w}");
    }
}

/// The tokenizer of the folder `dir` for `model`: required when text is to be read,
/// else the folder's if it has one; refused when it does not fit the model's vocabulary.
pub fn tokenizer(dir: &Path, model: &Transformer, required: bool) -> Result<Option<Tokenizer>> {
    let tok = match required {
        true => Some(Tokenizer::from_dir(dir)?),
        false => Tokenizer::optional(dir)?,
    };
    Ok(tok
        .map(|t| t.fitting(model.arch.token_rows()))
        .transpose()?)
}

/// Loads a model folder with its linear layers in `dtype` (in bf16 or int8 with no f32
/// copy of them: [`models::load_in`]), with the folder named in any error.
/// Tensors the model does not read are named in a warning (the first few of them), and
/// so is what the folder says that qkv reads differently ([`show_load_warnings`]).
pub fn load_model(dir: &Path, dtype: DType) -> Result<Loaded> {
    let loaded =
        models::load_in(dir, dtype).with_context(|| format!("loading model {}", dir.display()))?;
    show_load_warnings(&loaded.model);
    if !loaded.unused.is_empty() {
        let shown: Vec<&str> = loaded.unused.iter().take(5).map(String::as_str).collect();
        let more = match loaded.unused.len() - shown.len() {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        eprintln!(
            "warning: {}: the model does not use {} tensors of the checkpoint: {}{more}",
            dir.display(),
            loaded.unused.len(),
            shown.join(", ")
        );
    }
    Ok(loaded)
}
