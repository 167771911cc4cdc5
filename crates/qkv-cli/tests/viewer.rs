//! The attention viewer in a real browser: `qkv attention --out FILE.html`, opened from
//! disk by headless Chromium and driven by `tools/browser/check_viewer.py` (thumbnails,
//! hovering a token, switching head and kind, the special-token toggle, no console
//! error, no request). Ignored by `cargo test` because it needs Chromium, Playwright
//! and all-MiniLM-L6-v2; `.ci/run` installs them and runs it with `QKV_BROWSER_PYTHON`
//! and `QKV_MINILM_DIR` set.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{fixture, qkv, scratch, stderr};
use serde_json::Value;

fn env_path(name: &str, how: &str) -> PathBuf {
    match std::env::var_os(name) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => panic!("{name} is not set: the browser test cannot run. {how}"),
    }
}

/// Writes the viewer of `args`, drives it, and returns what the driver measured.
fn drive(dir: &Path, name: &str, args: &[&str], extra: &[&str]) -> Value {
    let python = env_path(
        "QKV_BROWSER_PYTHON",
        "Set it to the Python that `bash tools/browser/setup.sh` prints.",
    );
    let page = dir.join(format!("{name}.html"));
    let mut all = vec!["attention"];
    all.extend(args);
    all.extend(["--out", page.to_str().unwrap()]);
    let out = qkv(&all);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/browser/check_viewer.py");
    let shots = dir.join(name);
    let check = Command::new(&python)
        .arg(&script)
        .arg(&page)
        .arg(&shots)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("running {} {}: {e}", python.display(), script.display()));
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{name}: the viewer failed in Chromium:\n{report}\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shot in ["model.png", "head.png", "matrix.png"] {
        assert!(
            std::fs::metadata(shots.join(shot)).unwrap().len() > 10_000,
            "{name} {shot}"
        );
    }
    serde_json::from_str(&report).expect("one JSON object")
}

#[test]
#[ignore = "needs headless Chromium, Playwright and all-MiniLM-L6-v2: run by .ci/run"]
fn the_viewer_shows_minilm_linking_it_to_animal() {
    let minilm = env_path(
        "QKV_MINILM_DIR",
        "Run `tools/fetch_minilm.sh DIR` and set QKV_MINILM_DIR=DIR, as .ci/run does.",
    );
    let dir = scratch("viewer-minilm");
    let args = [
        "--model",
        minilm.to_str().unwrap(),
        "--text",
        "The animal didn't cross the street because it was too tired.",
        "--compare",
        "The tired dog stayed on the pavement.",
    ];
    // layer 3, head 1: where `it` attends most to `animal` (tests/minilm.rs)
    let found = drive(&dir, "minilm", &args, &["--open", "3,1", "--query", "it"])["found"].clone();
    assert_eq!(found["thumbnails"], 6 * 12);
    assert_eq!(found["hovered_query"]["label"], "it");
    assert_eq!(found["heaviest_key"], "animal");
    // every method is in the page, with a target (the cosine) for grad and ablation
    let methods = &found["methods"];
    for (name, thumbnails) in [
        ("weights", 6 * 12),
        ("value-norm", 6 * 12),
        ("rollout", 6),
        ("flow", 6),
        ("grad", 6),
        ("ablation", 0),
    ] {
        assert_eq!(methods[name]["thumbnails"], thumbnails, "{name}");
        assert_eq!(methods[name]["bars"], 16, "{name}");
    }
    assert!(dir.join("minilm/method-ablation.png").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs headless Chromium and Playwright: run by .ci/run"]
fn the_viewer_switches_between_the_three_attentions_of_t5() {
    let dir = scratch("viewer-t5");
    let t5 = fixture("t5");
    let args = [
        "--model",
        t5.to_str().unwrap(),
        "--input-ids",
        "92,19,39,36,67,26,50,57,1",
        "--max-new-tokens",
        "6",
    ];
    let report = drive(&dir, "t5", &args, &[]);
    assert_eq!(
        report["kinds"],
        serde_json::json!(["encoder", "decoder", "cross"])
    );
    assert_eq!(report["found"]["kind_switch"]["thumbnails"], 2 * 4);
    // an encoder-decoder's page has every method; the bars credit the source tokens
    // for the next token (flow has no cross-attention, so no bars)
    let methods = &report["found"]["methods"];
    assert_eq!(methods.as_object().unwrap().len(), 6, "{methods}");
    for name in ["weights", "value-norm", "rollout", "grad", "ablation"] {
        assert_eq!(methods[name]["bars"], 9, "{name}");
    }
    assert_eq!(methods["flow"]["bars"], 0);
    assert!(dir.join("t5/kind.png").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}
