//! Opening input files: only regular files. A FIFO named `config.json` would block a
//! reader forever and a device would be read without end, so both are refused before
//! they are opened, as are folders (whose OS error, "Is a directory", names no flag).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// What `path` is, when it is not a regular file (symlinks followed).
fn not_regular(path: &Path) -> Result<Option<&'static str>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(None);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return Ok(Some("a FIFO"));
        }
        if ft.is_char_device() || ft.is_block_device() {
            return Ok(Some("a device"));
        }
        if ft.is_socket() {
            return Ok(Some("a socket"));
        }
    }
    Ok(Some(if ft.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    }))
}

/// Fails unless `path` is a regular file, naming what it is instead.
pub fn check_regular(path: &Path) -> Result<()> {
    match not_regular(path)? {
        None => Ok(()),
        Some(what) => Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("is {what}, not a regular file"),
            ),
        )),
    }
}

/// Opens a regular file for reading.
pub fn open_regular(path: &Path) -> Result<File> {
    check_regular(path)?;
    File::open(path).map_err(|e| Error::io(path, e))
}

/// The whole of a regular file.
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// The whole of a regular file, as UTF-8 text.
pub fn read_regular_text(path: &Path) -> Result<String> {
    let bytes = read_regular(path)?;
    String::from_utf8(bytes).map_err(|e| {
        Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
        )
    })
}

/// `dir` joined with `rel`, a path a file inside the folder names (a shard in an index,
/// a module in `modules.json`): refused when absolute or climbing out with `..`, so a
/// model folder cannot make qkv read files outside it.
pub fn inside(dir: &Path, rel: &str, named_in: &Path) -> Result<std::path::PathBuf> {
    use std::path::Component;
    let path = Path::new(rel);
    let escapes = path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err(Error::io(
            named_in,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("names `{rel}`, a path outside the model folder"),
            ),
        ));
    }
    Ok(dir.join(path))
}
/// Fails unless `path` can be an output file: not a folder, and in a folder that
/// exists. (Write permission is left to the write itself, which is atomic.)
pub fn check_output(path: &Path) -> Result<()> {
    let refuse = |why: String| {
        Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
        )
    };
    if path.is_dir() {
        return Err(refuse("is a folder; give a file name".into()));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match dir.is_dir() {
        true => Ok(()),
        false => Err(refuse(format!("folder {} does not exist", dir.display()))),
    }
}
