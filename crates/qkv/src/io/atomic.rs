//! Writing a file so that readers see either the old file or the complete new one:
//! write a temporary sibling, flush it to disk, then rename it over the target. A
//! crash or error mid-write leaves no partial output behind.
//!
//! What the rename would wrongly replace is handled first. A symlink is followed, so
//! the file it points to is replaced and the link kept. A target that exists but is not
//! a regular file (a device such as `/dev/null`, a FIFO, a terminal, `/dev/stdout`) is
//! written through, as a shell redirection would: renaming over it would replace the
//! device itself. A folder is refused.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// Temporary names taken by this process so far: each write gets its own.
static TEMPORARIES: AtomicUsize = AtomicUsize::new(0);

fn refuse(path: &Path, why: &str) -> Error {
    Error::io(
        path,
        std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string()),
    )
}

/// Where the bytes for `path` go: the path itself, or what its symlinks lead to.
fn resolve(path: &Path) -> Result<PathBuf> {
    let mut target = path.to_path_buf();
    // a bounded walk: a loop of links ends in an error rather than a hang
    for _ in 0..40 {
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = std::fs::read_link(&target).map_err(|e| Error::io(&target, e))?;
                target = match target.parent() {
                    Some(dir) => dir.join(link),
                    None => link,
                };
            }
            _ => return Ok(target),
        }
    }
    Err(refuse(path, "too many levels of symbolic links"))
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, &mut |w| w.write_all(bytes))
}

/// [`write_atomic`] of what `fill` writes, in pieces (a file too large to build in
/// memory first): the target appears only once `fill` has succeeded.
pub fn write_atomic_with(
    path: &Path,
    fill: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    // `metadata` follows every link, /proc's magic ones too: `/dev/stdout` of a process
    // whose output is a pipe leads to `pipe:[N]`, a name no path walk can follow, but
    // the kernel opens it
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.is_dir() {
            return Err(refuse(path, "is a folder; give a file name"));
        }
        if !meta.is_file() {
            return write_through(path, fill);
        }
    }
    let target = resolve(path)?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // short, so that a target whose own name is near the 255-byte limit still works
    let n = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".qkv-{}-{n}.tmp", std::process::id()));
    let result = (|| {
        // a new file, never one already there: a link planted under the temporary's
        // name would otherwise redirect the write
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let mut buffered = std::io::BufWriter::new(file);
        fill(&mut buffered)?;
        let file = buffered.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &target)
    })();
    if result.is_err() {
        // Best effort: the temporary file is ours and useless after a failure.
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io(path, e))
}

/// Writes into an existing device, FIFO or terminal without replacing it.
fn write_through(
    path: &Path,
    fill: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    fill(&mut file)
        .and_then(|()| file.flush())
        .map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_file_and_leaves_no_temporary() {
        let dir = crate::io::scratch_dir("atomic");
        let path = dir.join("out.bin");
        write_atomic(&path, b"hello").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A target inside a missing folder fails cleanly, naming the path.
        let bad = dir.join("missing").join("x.bin");
        assert!(write_atomic(&bad, b"x")
            .unwrap_err()
            .to_string()
            .contains("x.bin"));
        // a folder is refused by name
        let err = write_atomic(&dir, b"x").unwrap_err().to_string();
        assert!(err.contains("is a folder"), "{err}");
        // the longest name a file may have still works
        let long = dir.join("n".repeat(250) + ".bin");
        write_atomic(&long, b"long").unwrap();
        assert_eq!(std::fs::read(&long).unwrap(), b"long");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_followed_and_devices_written_through() {
        let dir = crate::io::scratch_dir("atomic-link");
        let real = dir.join("real.bin");
        std::fs::write(&real, b"old").unwrap();
        let link = dir.join("link.bin");
        std::os::unix::fs::symlink("real.bin", &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        // /dev/null stays a device
        write_atomic(Path::new("/dev/null"), b"gone").unwrap();
        let meta = std::fs::metadata("/dev/null").unwrap();
        assert!(!meta.is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
