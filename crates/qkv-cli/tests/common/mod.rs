//! What every test of the `qkv` binary needs: running it, the library's fixtures, and
//! a scratch folder per test.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

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

/// Where the demo tests leave the report of their text-mode `qkv demo` run, and the
/// file that names the binary which wrote it: the browser test (tests/report.rs) loads
/// that report instead of running the demo a third time (2–3 minutes of CI) when the
/// binary is still the same build.
pub fn shared_report() -> (PathBuf, PathBuf) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    (tmp.join("demo-report"), tmp.join("demo-report.binary"))
}

/// The built `qkv` binary's size and modification time: what tells one build from another.
pub fn binary_stamp() -> String {
    let meta = std::fs::metadata(env!("CARGO_BIN_EXE_qkv")).expect("the qkv binary is built");
    let modified = meta
        .modified()
        .expect("the file system keeps modification times");
    format!("{} bytes, modified {modified:?}", meta.len())
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A copy of fixture `name` in `dir/name`, with `patch`'s keys set in its config.json.
pub fn patched(dir: &Path, name: &str, patch: serde_json::Value) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
    }
    let path = out.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (k, v) in patch.as_object().unwrap() {
        config[k] = v.clone();
    }
    std::fs::write(&path, config.to_string()).unwrap();
    out
}

/// Runs `qkv args`, checking it took under 20 s; returns the output.
pub fn timed(args: &[&str]) -> Output {
    let t = Instant::now();
    let out = qkv(args);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "{args:?} took {:?}",
        t.elapsed()
    );
    out
}

/// `qkv args` fails with one line containing `expected`, and did not abort.
pub fn fails(args: &[&str], expected: &str) {
    let out = timed(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains(expected), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
}

/// Runs `qkv args` as [`qkv`] does, also returning the most memory the process held
/// (its peak resident size in bytes, which the kernel reports when it is reaped).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(clippy::zombie_processes)] // reaped by `wait4`, which also gives its usage
pub fn qkv_peak(args: &[&str]) -> (Output, u64) {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the qkv binary runs");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        out.read_to_end(&mut bytes).map(|_| bytes)
    });
    let mut stderr = Vec::new();
    err.read_to_end(&mut stderr).unwrap();
    let stdout = reader.join().unwrap().unwrap();
    let mut status = 0;
    // SAFETY: wait4 writes only into the status and the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(reaped, child.id() as libc::pid_t, "waiting for {args:?}");
    let output = Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout,
        stderr,
    };
    (output, usage.ru_maxrss as u64 * 1024)
}
