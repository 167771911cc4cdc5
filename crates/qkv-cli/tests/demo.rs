//! Runs the built `qkv demo` and checks what its numbers must honestly show.

use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

fn qkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(args)
        .output()
        .expect("the qkv binary runs")
}

/// `qkv demo --json`, run once and shared by the tests.
fn report() -> &'static Value {
    static REPORT: OnceLock<Value> = OnceLock::new();
    REPORT.get_or_init(|| {
        let out = qkv(&["demo", "--json"]);
        assert!(
            out.status.success(),
            "demo --json failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // from_slice rejects anything after the object: stdout holds exactly one.
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
    })
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

#[test]
fn food_weights_sum_to_one_and_spicy_cheap_wins() {
    let food = &report()["food"];
    let w = floats(&food["weights"]);
    assert_eq!(w.len(), 3, "weights for A, B, C");
    assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-6, "{w:?}");
    let labels: Vec<&str> = food["dishes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["A", "B", "C"]);
    assert!(
        w[1] > w[0] && w[1] > w[2],
        "B (spicy & cheap) must win: {w:?}"
    );
    assert_eq!(food["top"], "B");
    // Softmax is monotone: the weights rank the dishes as the scores do.
    let s = floats(&food["scores"]);
    assert!(s[1] > s[2] && s[2] > s[0] && w[2] > w[0], "{s:?} {w:?}");
}

#[test]
fn food_output_is_the_weighted_sum_of_values() {
    let food = &report()["food"];
    let w = floats(&food["weights"]);
    let out = floats(&food["output"]);
    let dishes = food["dishes"].as_array().unwrap();
    for (c, &got) in out.iter().enumerate() {
        let want: f64 = dishes
            .iter()
            .zip(&w)
            .map(|(d, wj)| wj * floats(&d["value"])[c])
            .sum();
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "output[{c}]: {got} vs {want}"
        );
    }
}

#[test]
fn order_matters_only_with_positions() {
    let order = &report()["order"];
    assert_eq!(order["equivariant_without_pe"], true);
    assert_eq!(order["equivariant_with_pe"], false);
    let tol = order["tolerance"].as_f64().unwrap();
    for run in order["runs"].as_array().unwrap() {
        let diff = run["max_abs_diff"].as_f64().unwrap();
        assert_eq!(run["equivariant"].as_bool().unwrap(), diff < tol, "{run}");
        assert_eq!(run["tokens"].as_array().unwrap().len(), 3);
    }
}

#[test]
fn scaling_variances_match_theory() {
    let scaling = report()["scaling"].as_array().unwrap();
    let dims: Vec<u64> = scaling.iter().map(|e| e["d_k"].as_u64().unwrap()).collect();
    assert_eq!(dims, [16, 64, 256, 1024]);
    for e in scaling {
        let d = e["d_k"].as_f64().unwrap();
        let n = e["samples"].as_f64().unwrap();
        // q·k is a sum of d unit-variance products with fourth moment 3d² + 6d, so the
        // sample variance over n pairs has relative standard error √((2 + 6/d)/n):
        // 1.6% for n = 10 000. Six standard errors leave no room for a fluke.
        let tol = 6.0 * ((2.0 + 6.0 / d) / n).sqrt();
        let unscaled = e["var_unscaled"].as_f64().unwrap() / d;
        let scaled = e["var_scaled"].as_f64().unwrap();
        assert!(
            (unscaled - 1.0).abs() < tol,
            "Var(q·k)/d_k = {unscaled} at d_k {d}"
        );
        assert!(
            (scaled - 1.0).abs() < tol,
            "Var(q·k/√d_k) = {scaled} at d_k {d}"
        );
    }
    let last = &scaling[3];
    assert!(
        last["max_weight_unscaled"].as_f64().unwrap() > last["max_weight_scaled"].as_f64().unwrap(),
        "unscaled softmax must be sharper at d_k = 1024: {last}"
    );
}

#[test]
fn json_is_deterministic() {
    let again: Value = serde_json::from_slice(&qkv(&["demo", "--json"]).stdout).unwrap();
    assert_eq!(&again, report());
}

#[test]
fn text_mode_shows_every_section() {
    let out = qkv(&["demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in ["Food delivery", "狗咬人", "人咬狗", "Scaling by √d_k"] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn unknown_flag_fails_with_nonzero_exit() {
    let out = qkv(&["demo", "--no-such-flag"]);
    assert!(!out.status.success());
    assert!(!out.stderr.is_empty());
}
