//! Subcommands over real checkpoints (forward, generate, attention, embed, inspect),
//! training, and benchmarks.

pub mod attention;
pub mod bench;
pub mod embed;
pub mod experiment;
pub mod forward;
pub mod generate;
pub mod inspect;
mod machine;
pub mod train;
mod writable;

use std::path::Path;

use anyhow::{bail, Context, Result};
use qkv::models::{self, Loaded, Transformer};
use qkv::text::Tokenizer;

pub use writable::check_writable;

/// Most threads `--threads` may ask for: far more than any machine's cores, few enough
/// that starting them is quick (100 000 took 19 s and failed in the OS).
const MAX_THREADS: usize = 1024;

/// Sizes the global rayon pool from a `--threads` flag (`None`: all cores).
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        if n > MAX_THREADS {
            bail!("--threads {n}: at most {MAX_THREADS}");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("setting the number of threads")?;
    }
    Ok(())
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

/// Loads a model folder, with the folder named in any error.
/// Tensors the model does not read are named in a warning (the first few of them).
pub fn load_model(dir: &Path) -> Result<Loaded> {
    let loaded = models::load(dir).with_context(|| format!("loading model {}", dir.display()))?;
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
