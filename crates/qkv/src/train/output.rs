//! A training run's output folder, made ready before the first step: refused when it
//! would overwrite what the run does not own, created and checked writable, and locked
//! for the run so that two runs cannot write into one folder at once.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::checkpoint;
use crate::error::{Error, Result};

/// The lock file a run holds in its output folder (a dot file: never part of a
/// checkpoint's file set).
pub const LOCK_FILE: &str = ".qkv-train.lock";

/// Files a model folder may hold that `--overwrite` clears, so that a stale tokenizer
/// or shard of the folder's earlier model cannot be read with the new weights.
const MODEL_FILES: [&str; 10] = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
];

fn refuse(dir: &Path, why: String) -> Error {
    Error::io(dir, std::io::Error::other(why))
}

/// Makes `dir` ready for a new run: it must be missing, empty, or (with `overwrite`) a
/// folder whose model files may be replaced. A training checkpoint is refused here:
/// continuing it is `--resume`'s job.
pub fn prepare(dir: &Path, overwrite: bool) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(refuse(dir, "is not a folder".into()));
    }
    if checkpoint::exists(dir) {
        return Err(refuse(
            dir,
            "already holds a training checkpoint: continue it with --resume, or choose another --out".into(),
        ));
    }
    let mut entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::io(dir, e))?,
        Err(_) => Vec::new(),
    };
    entries.retain(|n| n != LOCK_FILE);
    if !entries.is_empty() {
        if !overwrite {
            return Err(refuse(
                dir,
                format!(
                    "is not empty ({} entries) and is not a training checkpoint: choose an empty or new --out, or pass --overwrite to replace its model files",
                    entries.len()
                ),
            ));
        }
        for name in MODEL_FILES {
            let path = dir.join(name);
            if path.is_file() {
                std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    Ok(())
}

/// The run's hold on its output folder; dropping it releases the folder.
#[derive(Debug)]
pub struct Lock {
    path: PathBuf,
}

/// Whether the process `pid` is running (on Linux; elsewhere every lock is trusted).
fn alive(pid: u32) -> bool {
    match Path::new("/proc").is_dir() {
        true => Path::new("/proc").join(pid.to_string()).exists(),
        false => true,
    }
}

impl Lock {
    /// Takes `dir`'s lock, creating the folder if needed. A lock left by a run that has
    /// died is taken over; one held by a live run is an error naming it. Creating the
    /// lock also proves the folder writable before any work is done.
    pub fn acquire(dir: &Path) -> Result<Lock> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(LOCK_FILE);
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    write!(f, "{}", std::process::id()).map_err(|e| Error::io(&path, e))?;
                    return Ok(Lock { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match holder {
                        Some(pid) if pid != std::process::id() && alive(pid) => {
                            return Err(refuse(
                                dir,
                                format!(
                                    "another `qkv train` (process {pid}) is writing to this folder"
                                ),
                            ))
                        }
                        // a dead run's lock (or an unreadable one): take it over
                        _ => std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?,
                    }
                }
                Err(e) => return Err(Error::io(dir, e)),
            }
        }
        Err(refuse(dir, "could not take the folder's lock".into()))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // only while the file is still this process's (a run that found it dead may
        // have taken it over)
        let mine = std::fs::read_to_string(&self.path)
            .is_ok_and(|s| s.trim() == std::process::id().to_string());
        if mine {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qkv-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_foreign_folder_is_refused_unless_overwritten() {
        let dir = scratch("foreign");
        prepare(&dir, false).unwrap();
        assert!(dir.is_dir());
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        let err = prepare(&dir, false).unwrap_err().to_string();
        assert!(
            err.contains("is not empty") && err.contains("--overwrite"),
            "{err}"
        );
        prepare(&dir, true).unwrap();
        assert!(!dir.join("tokenizer.json").exists() && !dir.join("config.json").exists());
        assert!(
            dir.join("notes.txt").exists(),
            "only model files are cleared"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_live_lock_is_refused_and_a_dead_one_taken_over() {
        let dir = scratch("lock");
        let held = Lock::acquire(&dir).unwrap();
        // pid 1 is always alive on Linux: a lock it held would be refused
        std::fs::write(dir.join(LOCK_FILE), "1").unwrap();
        let err = Lock::acquire(&dir).unwrap_err().to_string();
        assert!(err.contains("process 1"), "{err}");
        // a pid no process has
        std::fs::write(dir.join(LOCK_FILE), "4294967295").unwrap();
        let again = Lock::acquire(&dir).unwrap();
        drop(held);
        drop(again);
        assert!(!dir.join(LOCK_FILE).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
