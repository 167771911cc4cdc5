//! `qkv experiment`: the command runs an experiment end to end and saves its report,
//! measures all-MiniLM-L6-v2 given with `--model`, and refuses what it cannot run. (The
//! quick experiments' numbers: tests/demo, which runs each of them once.)

mod common;
#[path = "common/experiment_checks.rs"]
mod experiment_checks;

use std::path::PathBuf;

use common::{qkv, scratch};
use experiment_checks::{attribution_verdict, check_contract, precision_types};
use serde_json::Value;

/// Runs `qkv experiment NAME --quick --json` into a fresh folder; returns the report
/// and the folder.
fn quick(name: &str) -> (Value, PathBuf) {
    quick_with(name, name, &[])
}

/// [`quick`] with `extra` flags, into a folder named `label`.
fn quick_with(name: &str, label: &str, extra: &[&str]) -> (Value, PathBuf) {
    let dir = scratch(label);
    let mut args = vec!["experiment", name, "--quick", "--json", "--threads", "2"];
    args.extend(extra);
    args.extend(["--out", dir.to_str().unwrap()]);
    let out = qkv(&args);
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    (report, dir)
}

/// The real all-MiniLM-L6-v2 folder.
fn minilm() -> String {
    std::env::var("QKV_MINILM_DIR")
        .expect("QKV_MINILM_DIR is not set (.ci/run fetches all-MiniLM-L6-v2 and sets it)")
}

/// The command end to end on its quickest experiment (every quick experiment's
/// numbers are checked in tests/demo, which runs them all once).
#[test]
fn cross_runs_as_a_command_and_saves_its_report() {
    let (report, dir) = quick("cross");
    check_contract(&report, "cross", &dir);
    assert_eq!(report["verdict"], "supported", "{report:#}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn precision_compares_minilm_given_with_model() {
    let (report, dir) = quick_with("precision", "precision-minilm", &["--model", &minilm()]);
    check_contract(&report, "precision", &dir);
    assert_eq!(report["metrics"]["sentences"].as_array().unwrap().len(), 6);
    let types = precision_types(&report, 1);
    let t = |name: &str| &types.iter().find(|(n, _)| n == name).unwrap().1;
    // the contract, on these sentences' token vectors: 0.999 bf16, 0.99 int8
    assert!(t("bf16")["output_min_cosine"].as_f64().unwrap() >= 0.999);
    assert!(t("int8")["output_min_cosine"].as_f64().unwrap() >= 0.99);
    for (name, t) in &types {
        let js = t["worst_head_js_bits"].as_f64().unwrap();
        assert!(js > 0.0 && js < 0.01, "{name}: {js}");
    }
    assert_eq!(report["figures"].as_array().unwrap().len(), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn attribution_on_minilm_asks_where_it_points_under_each_method() {
    let (report, dir) = quick_with("attribution", "attribution-minilm", &["--model", &minilm()]);
    check_contract(&report, "attribution", &dir);
    let metrics = &report["metrics"];
    assert_eq!(metrics["decided_on"], "minilm");
    let model = &metrics["sentence_encoders"][0];
    assert_eq!(model["texts"], 16);
    assert_eq!(
        report["verdict"],
        attribution_verdict(model["mean_spearman_with_ablation"].as_object().unwrap())
    );
    // every method and ablation answers the articles' question about "it"
    let it = model["it_in_the_articles_sentence"].as_object().unwrap();
    assert_eq!(it.len(), 6);
    for (method, answer) in it {
        let (animal, street) = (
            answer["animal"].as_f64().unwrap(),
            answer["street"].as_f64().unwrap(),
        );
        let said = if animal > street { "animal" } else { "street" };
        assert_eq!(answer["points_at"], said, "{method}");
    }
    // hiding "animal" moves "it" more than hiding "street" does (0.19 against 0.06)
    assert_eq!(it["ablation"]["points_at"], "animal");
    assert_eq!(report["figures"].as_array().unwrap().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn model_folders_go_to_precision_and_attribution_only() {
    let out = qkv(&[
        "experiment",
        "heads",
        "--model",
        "x",
        "--out",
        scratch("m").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--model") && err.contains("precision"),
        "{err}"
    );
}

#[test]
fn an_unknown_experiment_is_named() {
    let out = qkv(&[
        "experiment",
        "nope",
        "--out",
        scratch("nope").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("unknown experiment `nope`")
            && err.contains("long_range"),
        "{err}"
    );
}
