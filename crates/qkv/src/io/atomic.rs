//! Writing a file so that readers see either the old file or the complete new one:
//! write a temporary sibling, flush it to disk, then rename it over the target. A
//! crash or error mid-write leaves no partial output behind.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        // Best effort: the temporary file is ours and useless after a failure.
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("qkv-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
