//! `qkv demo`'s report in a real browser: headless Chromium loads `index.html` from
//! disk; every figure must have a non-zero size, the console must log no error and
//! the page must request nothing. Ignored by `cargo test` because it needs Chromium
//! and Playwright; `.ci/run` installs both (`tools/browser/setup.sh`) and runs it with
//! `QKV_BROWSER_PYTHON` set to the Python that has Playwright. Run by hand:
//! `QKV_BROWSER_PYTHON=$(bash tools/browser/setup.sh | tail -n 1) cargo test -p qkv-cli --test report -- --ignored`.
//!
//! The page is the one the demo tests' text run left (tests/demo) when the same build
//! of `qkv` wrote it, as in CI, where they run first; otherwise this runs the demo.

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A folder holding `qkv demo`'s report from this build, and whether it is this test's
/// own: the demo tests' when their stamp names this binary, else a fresh run's.
fn demo_report() -> (PathBuf, bool) {
    let (shared, stamp) = common::shared_report();
    if std::fs::read_to_string(&stamp).ok() == Some(common::binary_stamp()) {
        eprintln!(
            "the report of this build's demo tests: {}",
            shared.display()
        );
        return (shared, false);
    }
    let dir = common::scratch("report");
    let demo = common::qkv(&["demo", "--quiet", "--out", dir.to_str().unwrap()]);
    assert!(demo.status.success(), "{}", common::stderr(&demo));
    (dir, true)
}

#[test]
#[ignore = "needs headless Chromium and Playwright: run by .ci/run (tools/browser/setup.sh)"]
fn the_demo_report_renders_in_chromium() {
    let python = std::env::var("QKV_BROWSER_PYTHON").unwrap_or_else(|_| {
        panic!(
            "QKV_BROWSER_PYTHON is not set: the browser test cannot run. \
             Set it to the Python that `bash tools/browser/setup.sh` prints."
        )
    });
    let (dir, own) = demo_report();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/browser/check_page.py");
    let shot = dir.join("screenshot.png");
    let check = Command::new(&python)
        .arg(&script)
        .arg(dir.join("index.html"))
        .arg(&shot)
        .output()
        .unwrap_or_else(|e| panic!("running {python} {}: {e}", script.display()));
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "the page failed in Chromium:\n{report}\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(&report).expect("one JSON object");
    // every figure of the page was measured: 3 tables have none, 10 experiments 17
    let figures = result["figures"].as_array().unwrap();
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert_eq!(figures.len(), page.matches("<figure>").count());
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    if own {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
