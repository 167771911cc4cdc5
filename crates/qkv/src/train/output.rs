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
fn prepare(dir: &Path, overwrite: bool) -> Result<()> {
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

/// A run's hold on a folder: an exclusive `flock` on `DIR/.qkv-train.lock`, kept for
/// as long as the value lives. The kernel takes it atomically (two runs started at the
/// same instant cannot both have it) and drops it when the process dies, so a crashed
/// run's lock never needs taking over. The file holds the holder's pid, for the message
/// of a refused run.
#[derive(Debug)]
pub struct Lock {
    file: std::fs::File,
    path: PathBuf,
    /// the folder, when this lock created it: removed again on release if the run left
    /// nothing in it
    created: Option<PathBuf>,
}

/// Whether `file` (open) is still the file at `path`: a holder removes the lock file
/// when it lets go, so a lock taken on a file opened just before that removal is a lock
/// on a file no one else can find.
#[cfg(unix)]
fn still_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_at(_file: &std::fs::File, path: &Path) -> bool {
    path.is_file()
}

impl Lock {
    /// Takes the lock of the existing folder `dir`, or fails naming the run that holds
    /// it. Creating the lock file also proves the folder writable before any work.
    pub fn acquire(dir: &Path) -> Result<Lock> {
        if !dir.is_dir() {
            return Err(refuse(dir, "is not a folder".into()));
        }
        Lock::take(dir, None)
    }

    /// Takes `dir` for a new run: creates it when missing, locks it, and only then
    /// checks that the run may write there (missing, empty, or with `overwrite` a
    /// model folder to replace; never a checkpoint), so that no other run can
    /// start between the check and the lock. A folder this call created is removed
    /// again when the claim fails or the run ends leaving it empty.
    pub fn claim(dir: &Path, overwrite: bool) -> Result<Lock> {
        if dir.exists() && !dir.is_dir() {
            return Err(refuse(dir, "is not a folder".into()));
        }
        let created = match dir.exists() {
            true => None,
            false => {
                if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
                }
                match std::fs::create_dir(dir) {
                    Ok(()) => Some(dir.to_path_buf()),
                    // made by a run started at the same moment: its lock decides
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                    Err(e) => return Err(Error::io(dir, e)),
                }
            }
        };
        let lock = Lock::take(dir, created)?;
        prepare(dir, overwrite)?;
        Ok(lock)
    }

    fn take(dir: &Path, created: Option<PathBuf>) -> Result<Lock> {
        use std::io::Seek;
        let path = dir.join(LOCK_FILE);
        // a few rounds: each lost one means a holder let go between our open and lock
        for _ in 0..16 {
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path);
            let mut file = match opened {
                Ok(f) => f,
                // the folder was removed by a run that created it and then failed
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(refuse(dir, "was removed while this run started".into()))
                }
                Err(e) => return Err(Error::io(&path, e)),
            };
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Err(held(dir, &path)),
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            }
            if !still_at(&file, &path) {
                continue;
            }
            let pid = std::process::id().to_string();
            let written = file
                .set_len(0)
                .and_then(|_| file.rewind())
                .and_then(|_| file.write_all(pid.as_bytes()));
            written.map_err(|e| Error::io(&path, e))?;
            return Ok(Lock {
                file,
                path,
                created,
            });
        }
        Err(refuse(dir, "could not take the folder's lock".into()))
    }
}

/// The error of a run refused because another holds `dir`.
fn held(dir: &Path, path: &Path) -> Error {
    // the holder writes its pid just after it takes the lock: a moment's wait for it
    let pid = || {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    let holder = (0..20)
        .find_map(|_| {
            pid().or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                None
            })
        })
        .map_or(String::new(), |pid| format!(" (process {pid})"));
    refuse(
        dir,
        format!("another `qkv train`{holder} is writing to this folder"),
    )
}

impl Drop for Lock {
    fn drop(&mut self) {
        // removed while still held, so no other run can have it at that moment; one
        // that opened the file just before sees it gone and opens a new one
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
        // `remove_dir` takes only an empty folder: one a run wrote into stays
        if let Some(dir) = &self.created {
            let _ = std::fs::remove_dir(dir);
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
    fn a_held_lock_is_refused_and_a_left_over_file_taken() {
        let dir = scratch("lock");
        let held = Lock::claim(&dir, false).unwrap();
        // the file says who holds it; the refusal quotes it
        let err = Lock::acquire(&dir).unwrap_err().to_string();
        let me = format!("process {}", std::process::id());
        assert!(
            err.contains(&me) && err.contains("another `qkv train`"),
            "{err}"
        );
        drop(held);
        assert!(
            !dir.exists(),
            "a folder the claim made, left empty, is removed"
        );

        // a lock file a crashed run left (its pid, no lock held) is no obstacle
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(LOCK_FILE), "1").unwrap();
        let again = Lock::claim(&dir, false).unwrap();
        std::fs::write(dir.join("model.safetensors"), "x").unwrap();
        drop(again);
        assert!(!dir.join(LOCK_FILE).exists());
        assert!(dir.is_dir(), "a folder the claim did not make is kept");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn of_many_simultaneous_claims_exactly_one_wins() {
        let dir = scratch("race");
        for round in 0..20 {
            let n = 8;
            let start = std::sync::Barrier::new(n);
            let results: Vec<Result<Lock>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..n)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            Lock::claim(&dir, false)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let won = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(won, 1, "round {round}: {results:?}");
            for e in results.iter().filter_map(|r| r.as_ref().err()) {
                let e = e.to_string();
                assert!(e.contains("another `qkv train`"), "round {round}: {e}");
            }
            drop(results);
            // only the claim that made the folder removes it, and it may have lost
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
