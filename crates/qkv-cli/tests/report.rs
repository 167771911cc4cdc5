//! `qkv demo`'s report in a real browser: headless Chromium loads `index.html` from
//! disk; every figure must have a non-zero size, the console must log no error and
//! the page must request nothing. Ignored by `cargo test` because it needs Chromium
//! and Playwright; `.ci/run` installs both (`tools/browser/setup.sh`) and runs it with
//! `QKV_BROWSER_PYTHON` set to the Python that has Playwright. Run by hand:
//! `QKV_BROWSER_PYTHON=$(bash tools/browser/setup.sh | tail -n 1) cargo test -p qkv-cli --test report -- --ignored`.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs headless Chromium and Playwright: run by .ci/run (tools/browser/setup.sh)"]
fn the_demo_report_renders_in_chromium() {
    let python = std::env::var("QKV_BROWSER_PYTHON").unwrap_or_else(|_| {
        panic!(
            "QKV_BROWSER_PYTHON is not set: the browser test cannot run. \
             Set it to the Python that `bash tools/browser/setup.sh` prints."
        )
    });
    let dir = std::env::temp_dir().join(format!("qkv-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let demo = Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(["demo", "--quiet", "--out", dir.to_str().unwrap()])
        .output()
        .expect("qkv runs");
    assert!(
        demo.status.success(),
        "{}",
        String::from_utf8_lossy(&demo.stderr)
    );
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
    std::fs::remove_dir_all(&dir).unwrap();
}
