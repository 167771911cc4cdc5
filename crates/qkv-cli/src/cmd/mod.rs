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

use std::path::Path;

use anyhow::{bail, Context, Result};
use qkv::models::{self, Loaded};

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

/// Bytes this machine can still give a process: `MemAvailable` plus free swap, from
/// `/proc/meminfo` (None where that file does not exist).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kib("MemAvailable:")? + kib("SwapFree:").unwrap_or(0)) * 1024)
}

/// Refuses work estimated to need `need` bytes (`None`: more than can be counted) when
/// the machine has less available, saying both figures.
pub fn check_memory(need: Option<usize>, what: &str) -> Result<()> {
    let gb = |b: f64| b / 1e9;
    let Some(have) = available_memory() else {
        return Ok(());
    };
    match need {
        Some(n) if (n as u64) <= have => Ok(()),
        Some(n) => bail!(
            "{what} needs about {:.1} GB; this machine has {:.1} GB available",
            gb(n as f64),
            gb(have as f64)
        ),
        None => bail!(
            "{what} needs more memory than can be counted; this machine has {:.1} GB available",
            gb(have as f64)
        ),
    }
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
