//! What every test of the `qkv` binary needs: running it, the library's fixtures, and
//! a scratch folder per test.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `qkv` with `args`.
pub fn qkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(args)
        .output()
        .expect("the qkv binary runs")
}

/// The library's tiny model fixture `name` (`crates/qkv/tests/fixtures/models/NAME`).
pub fn fixture(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

/// `crates/qkv/tests/fixtures`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures")
}

/// A fresh folder for one test, named after it and this process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
