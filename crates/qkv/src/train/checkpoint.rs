//! Training checkpoints: a model folder that `qkv generate` loads as it is, plus what a
//! run needs to continue exactly where it stopped.
//!
//! ```text
//! DIR/config.json             the model (written by TrainableModel::save)
//! DIR/model.safetensors       the model's parameters, Hugging Face names
//! DIR/optimizer.safetensors   AdamW moments `{param}.exp_avg`, `{param}.exp_avg_sq`;
//!                             metadata `step` = updates applied
//! DIR/trainer_state.json      TrainerState: step, RNG state, data position, the run's
//!                             configuration, losses so far, and a digest of every file
//! ```
//!
//! ## Never a torn checkpoint
//!
//! Every file is written atomically (temporary file + rename), but a checkpoint is a
//! *set* of files, and a crash between two renames would pair new weights with an old
//! optimiser. So a save is a small transaction:
//!
//! 1. write the whole set into a staging folder of its own,
//!    `DIR/.checkpoint-staging-{pid}-{n}/`, `trainer_state.json` last (its presence marks
//!    the staged set complete);
//! 2. move the files into `DIR` one by one, `trainer_state.json` last;
//! 3. remove the staging folder.
//!
//! Opening a checkpoint (and every save) first finishes an interrupted step 2 (a staging
//! folder with a `trainer_state.json`; of several, the latest step's), and discards
//! incomplete step 1s (those without), so `DIR` always holds one complete set: the
//! previous one or the new one. One run writes a folder at a time (`train::output::Lock`);
//! the staging names keep even writers that bypass the lock out of each other's files. The digests in
//! `trainer_state.json` (length + 64-bit hash of each file) then catch a folder whose
//! files were mixed up by hand.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::{write_atomic, TensorFile};
use crate::train::optim::{AdamW, Params};
use crate::train::trainable::TrainableModel;

/// The trainer's state file; written last, so its presence marks a complete set.
pub const STATE_FILE: &str = "trainer_state.json";
/// The optimiser's moments.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Where a save stages its files before moving them into the checkpoint folder: the
/// prefix of each save's own staging folder (older versions used the bare name).
pub const STAGING_DIR: &str = ".checkpoint-staging";
/// Version of the `trainer_state.json` layout.
pub const FORMAT: u32 = 1;

/// Everything besides the tensors that resuming needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Layout version ([`FORMAT`]).
    pub format: u32,
    /// Updates applied so far; the next step to run.
    pub step: u64,
    /// State of the trainer's random number generator (data sampling).
    pub rng_state: u64,
    /// Batches consumed so far (equal to `step`: one batch per step).
    pub data_position: u64,
    /// The run's configuration: the trainer's options and whatever the caller adds
    /// (model options, task, data file), so that a resumed run can be checked against it.
    pub config: serde_json::Value,
    /// The loss of every step so far, before that step's update.
    pub losses: Vec<f32>,
    /// Length and hash of every other file of the checkpoint, by file name.
    pub files: BTreeMap<String, FileDigest>,
}

/// A file's length and a 64-bit hash of its bytes: enough to tell that a checkpoint's
/// files belong together (not a cryptographic guarantee).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub len: u64,
    pub hash: String,
}

impl FileDigest {
    pub fn of(path: &Path) -> Result<FileDigest> {
        let io_err = |e| Error::io(path, e);
        let mut file = crate::io::open_regular(path)?;
        let mut hasher = Hasher::default();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).map_err(io_err)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(FileDigest {
            len: hasher.len,
            hash: format!("{:016x}", hasher.finish()),
        })
    }
}

/// FNV-1a over 8-byte little-endian words (the tail byte by byte), with a final mix.
/// Word-wise so that hashing a large checkpoint costs little next to writing it.
#[derive(Default)]
struct Hasher {
    state: u64,
    len: u64,
    pending: Vec<u8>,
}

impl Hasher {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn update(&mut self, mut bytes: &[u8]) {
        if self.len == 0 {
            self.state = Self::OFFSET;
        }
        self.len += bytes.len() as u64;
        if !self.pending.is_empty() {
            let take = (8 - self.pending.len()).min(bytes.len());
            self.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending.len() < 8 {
                return;
            }
            let word = u64::from_le_bytes(self.pending[..8].try_into().expect("8 bytes"));
            self.mix(word);
            self.pending.clear();
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.mix(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        self.pending.extend_from_slice(words.remainder());
    }

    fn mix(&mut self, word: u64) {
        self.state = (self.state ^ word).wrapping_mul(Self::PRIME);
    }

    fn finish(mut self) -> u64 {
        if self.len == 0 {
            self.state = Self::OFFSET;
        }
        for b in std::mem::take(&mut self.pending) {
            self.mix(b as u64);
        }
        let mut z = self.state ^ self.len;
        z = (z ^ (z >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        z ^ (z >> 33)
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(path, e)
}

/// Flushes a folder's entries (the renames in it) to disk. Best effort: not every
/// platform lets a folder be opened for syncing.
fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// The staging folders in `dir` (none when `dir` cannot be read).
pub fn staged(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(STAGING_DIR))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

/// A staging folder no save has used: this process's id and a count of its saves.
fn new_staging(dir: &Path) -> PathBuf {
    static SAVES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("{STAGING_DIR}-{}-{n}", std::process::id()))
}

/// Whether `dir` holds a checkpoint (or a staged one that [`open`] would complete).
pub fn exists(dir: &Path) -> bool {
    dir.join(STATE_FILE).is_file() || staged(dir).iter().any(|s| s.join(STATE_FILE).is_file())
}

/// Writes a checkpoint of `model`, `optimizer` and `state` into `dir` (created if
/// missing) as one transaction (module docs). `state.files` is filled in here.
pub fn save(
    dir: &Path,
    model: &dyn TrainableModel,
    optimizer: &AdamW,
    state: &TrainerState,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    // A leftover of an earlier save, if complete, is finished first, so the folder
    // never goes back to an older set than the one a crash left staged.
    recover(dir)?;
    let staging = new_staging(dir);
    std::fs::create_dir(&staging).map_err(io_err(&staging))?;

    model.save(&staging)?;
    let opt_path = staging.join(OPTIMIZER_FILE);
    let moments = optimizer.state_tensors();
    let named: Vec<(&str, &crate::tensor::Tensor)> =
        moments.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let meta = HashMap::from([("step".to_string(), optimizer.step_count().to_string())]);
    crate::io::save(&opt_path, &named, Some(meta))?;

    let mut state = state.clone();
    state.files.clear();
    for entry in std::fs::read_dir(&staging).map_err(io_err(&staging))? {
        let entry = entry.map_err(io_err(&staging))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !entry.path().is_file() {
            continue; // a temporary file of an atomic write, never part of the set
        }
        state.files.insert(name, FileDigest::of(&entry.path())?);
    }
    let json = serde_json::to_string_pretty(&state)
        .map_err(|e| Error::invalid("trainer state", e.to_string()))?;
    write_atomic(&staging.join(STATE_FILE), json.as_bytes())?;
    sync_dir(&staging);
    commit(dir, &staging, &state)
}

/// Moves the files staged in `staging` into `dir`, the state file last, then removes
/// the staging folder. Files already moved by an interrupted commit are skipped.
fn commit(dir: &Path, staging: &Path, state: &TrainerState) -> Result<()> {
    let names = state.files.keys().map(String::as_str).chain([STATE_FILE]);
    for name in names {
        let from = staging.join(name);
        if from.is_file() {
            std::fs::rename(&from, dir.join(name)).map_err(io_err(&from))?;
        }
    }
    sync_dir(dir);
    std::fs::remove_dir_all(staging).map_err(io_err(staging))?;
    sync_dir(dir);
    Ok(())
}

/// Finishes the latest complete save a crash left staged and discards every other
/// staging folder (module docs).
fn recover(dir: &Path) -> Result<()> {
    let mut complete: Vec<(TrainerState, PathBuf)> = Vec::new();
    for staging in staged(dir) {
        let staged_state = staging.join(STATE_FILE);
        match staged_state.is_file() {
            true => complete.push((read_state(&staged_state)?, staging)),
            false => std::fs::remove_dir_all(&staging).map_err(io_err(&staging))?,
        }
    }
    complete.sort_by_key(|(state, _)| state.step);
    let Some((latest, staging)) = complete.pop() else {
        return Ok(());
    };
    for (_, older) in complete {
        std::fs::remove_dir_all(&older).map_err(io_err(&older))?;
    }
    commit(dir, &staging, &latest)
}

fn read_state(path: &Path) -> Result<TrainerState> {
    let state: TrainerState = crate::io::read_json(path)?;
    if state.format != FORMAT {
        return Err(Error::Config {
            path: path.display().to_string(),
            field: "format".into(),
            reason: format!("version {} is not the supported {FORMAT}", state.format),
        });
    }
    Ok(state)
}

/// Opens the checkpoint in `dir`: completes or discards a save a crash interrupted,
/// reads `trainer_state.json` and checks every file against its digest.
pub fn open(dir: &Path) -> Result<TrainerState> {
    if !exists(dir) {
        return Err(Error::invalid(
            "resume",
            format!(
                "{} holds no training checkpoint (no {STATE_FILE})",
                dir.display()
            ),
        ));
    }
    recover(dir)?;
    let state_path = dir.join(STATE_FILE);
    let state = read_state(&state_path)?;
    for (name, want) in &state.files {
        let path = dir.join(name);
        let got = FileDigest::of(&path)?;
        if &got != want {
            return Err(Error::Config {
                path: state_path.display().to_string(),
                field: format!("files.{name}"),
                reason: format!(
                    "{} does not belong to this checkpoint (length {} hash {}, expected length {} hash {})",
                    path.display(),
                    got.len,
                    got.hash,
                    want.len,
                    want.hash
                ),
            });
        }
    }
    if state.losses.len() as u64 != state.step {
        return Err(Error::Config {
            path: state_path.display().to_string(),
            field: "losses".into(),
            reason: format!("{} losses for {} steps", state.losses.len(), state.step),
        });
    }
    Ok(state)
}

/// Restores the optimiser saved in `dir` (after [`open`]), checking its moments against
/// the model's parameters.
pub fn load_optimizer<P: Params + ?Sized>(
    dir: &Path,
    optimizer: &mut AdamW,
    params: &mut P,
) -> Result<()> {
    let path: PathBuf = dir.join(OPTIMIZER_FILE);
    let file = TensorFile::open(&path)?;
    let step: u64 = file
        .metadata()?
        .get("step")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Safetensors {
            path: path.display().to_string(),
            reason: "metadata lacks the optimiser's `step`".into(),
        })?;
    let tensors = file
        .names()?
        .into_iter()
        .map(|name| file.tensor(&name).map(|t| (name, t)))
        .collect::<Result<Vec<_>>>()?;
    optimizer.load_state(step, tensors, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_does_not_depend_on_how_bytes_are_fed() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut whole = Hasher::default();
        whole.update(&bytes);
        let mut parts = Hasher::default();
        for chunk in bytes.chunks(13) {
            parts.update(chunk);
        }
        assert_eq!(whole.finish(), parts.finish());
        let mut other = Hasher::default();
        let mut changed = bytes.clone();
        changed[500] ^= 1;
        other.update(&changed);
        let mut again = Hasher::default();
        again.update(&bytes);
        assert_ne!(other.finish(), again.finish());
    }
}
