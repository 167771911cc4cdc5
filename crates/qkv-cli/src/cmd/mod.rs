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
use qkv::io::TensorFile;
use qkv::models::{self, Loaded, TokenBatch};

/// Sizes the global rayon pool from a `--threads` flag (`None`: all cores).
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("setting the number of threads")?;
    }
    Ok(())
}

/// Loads a model folder, with the folder named in any error.
pub fn load_model(dir: &Path) -> Result<Loaded> {
    models::load(dir).with_context(|| format!("loading model {}", dir.display()))
}

/// Reads an int64 `[B, T]` ids tensor (and an optional 0/1 mask of the same shape)
/// from `file` into a batch.
pub fn read_batch(
    file: &TensorFile,
    ids_name: &str,
    mask_name: Option<&str>,
) -> Result<TokenBatch> {
    let (shape, ids) = file.ints(ids_name)?;
    if shape.len() != 2 {
        bail!(
            "{}: `{ids_name}` must be [B, T], got shape {shape:?}",
            file.path().display()
        );
    }
    let ids = ids
        .into_iter()
        .map(|id| {
            usize::try_from(id).map_err(|_| {
                anyhow::anyhow!(
                    "{}: `{ids_name}` holds a negative id {id}",
                    file.path().display()
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mask = match mask_name.filter(|m| file.contains(m)) {
        Some(m) => {
            let (mshape, mask) = file.ints(m)?;
            if mshape != shape {
                bail!(
                    "{}: `{m}` has shape {mshape:?} but `{ids_name}` has {shape:?}",
                    file.path().display()
                );
            }
            if let Some(v) = mask.iter().find(|&&v| v != 0 && v != 1) {
                bail!(
                    "{}: `{m}` must hold 0 or 1, found {v}",
                    file.path().display()
                );
            }
            Some(mask.into_iter().map(|v| v == 1).collect())
        }
        None => None,
    };
    Ok(TokenBatch::new(ids, mask, shape[0], shape[1])?)
}
