//! Outputs checked before any work is done: a bad output path is reported at once,
//! not after a forward or a training run, and before any other output is written.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// Fails unless `path` can be written as the output is (a new file renamed into its
/// folder, or written through to an existing device or FIFO), so that a bad output is
/// reported before the model runs. Asks the OS (`access`) rather than creating a
/// probe file, which would leave a trace beside a device such as `/dev/stdout`.
pub fn check_writable(flag: &str, path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let meta = std::fs::metadata(path).ok();
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        bail!("{flag} {}: is a folder", path.display());
    }
    // an existing device, FIFO or socket is written through, not replaced
    if meta.is_some_and(|m| !m.is_file()) {
        return writable(path, libc::W_OK)
            .with_context(|| format!("{flag} {}: cannot write to it", path.display()));
    }
    if !dir.is_dir() {
        bail!(
            "{flag} {}: folder {} does not exist",
            path.display(),
            dir.display()
        );
    }
    writable(dir, libc::W_OK | libc::X_OK).with_context(|| {
        format!(
            "{flag} {}: cannot write in {}",
            path.display(),
            dir.display()
        )
    })
}

/// `access(2)` for `mode`: the OS's answer (read-only file systems included) without
/// opening anything.
fn writable(path: &Path, mode: libc::c_int) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    match unsafe { libc::access(c.as_ptr(), mode) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
