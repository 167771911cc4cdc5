//! Runs the built `qkv demo` twice, side by side (once for its JSON, once for its text),
//! and checks what its numbers must honestly show, the JSON contract and the numbers of
//! its experiments (`experiments.rs`), the report it writes, and that the two runs agree.
//! (That the report renders in a browser is `tests/report.rs`, which loads the text
//! run's report, left where `common::shared_report` says.)

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/experiment_checks.rs"]
mod experiment_checks;
mod experiments;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{qkv, scratch};
use serde_json::Value;

/// The names `--json` keys its experiments by, exactly.
const EXPERIMENTS: [&str; 10] = [
    "long_range",
    "parallel",
    "scaling",
    "order",
    "positions",
    "mask",
    "cross",
    "heads",
    "precision",
    "attribution",
];

/// `qkv demo --json --out DIR`, run once and shared by the tests.
fn report() -> &'static Value {
    static REPORT: OnceLock<Value> = OnceLock::new();
    REPORT.get_or_init(|| {
        let dir = scratch("json");
        let out = qkv(&["demo", "--json", "--out", dir.to_str().unwrap()]);
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
fn the_report_holds_every_experiment_and_its_figures() {
    let experiments = report()["experiments"].as_object().unwrap();
    let mut names: Vec<&str> = experiments.keys().map(String::as_str).collect();
    names.sort();
    let mut want = EXPERIMENTS;
    want.sort();
    // (each one's contract and numbers: experiments.rs)
    assert_eq!(names, want);
    // the page holds every figure inline and asks for nothing outside itself
    let index = report()["report"].as_str().unwrap();
    let page = std::fs::read_to_string(index).unwrap();
    let figures: usize = experiments
        .values()
        .map(|e| e["figures"].as_array().unwrap().len())
        .sum();
    assert_eq!(page.matches("<figure><svg").count(), figures);
    for name in EXPERIMENTS {
        assert!(page.contains(&format!("<section id=\"{name}\">")), "{name}");
    }
    // (an SVG's namespace is a name, not a request)
    let namespaces = page.matches("http://www.w3.org/2000/svg").count();
    assert_eq!(page.matches("http").count(), namespaces);
    assert!(!page.contains("<script"));
}

/// Everything but `parallel`'s measurements and the files' paths. Its seconds vary from
/// run to run, and so, by a few tens of KB, does the extra memory it counts: a worker
/// thread's first call allocates its scratch, and which worker takes which call is the
/// scheduler's choice. (Its memory slopes are asserted in experiments.rs.)
fn without_timings(mut v: Value) -> Value {
    let parallel = &mut v["experiments"]["parallel"];
    for key in ["verdict", "rule", "metrics"] {
        parallel[key] = Value::Null;
    }
    for e in v["experiments"].as_object_mut().unwrap().values_mut() {
        e["figure"] = Value::Null;
        e["figures"] = Value::Null;
    }
    v["report"] = Value::Null;
    v
}

/// `qkv demo --out DIR` in text mode, run once and shared: its stdout and DIR. DIR is
/// the one the browser test may load ([`common::shared_report`]), stamped with this
/// build once the run succeeded.
fn text_run() -> &'static (String, PathBuf) {
    static RUN: OnceLock<(String, PathBuf)> = OnceLock::new();
    RUN.get_or_init(|| {
        let (dir, stamp) = common::shared_report();
        let _ = std::fs::remove_file(&stamp);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = qkv(&["demo", "--quiet", "--out", dir.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&stamp, common::binary_stamp()).unwrap();
        (String::from_utf8(out.stdout).unwrap(), dir)
    })
}

/// The text run's experiments, each saved as `DIR/NAME.json`, equal the JSON run's:
/// the same seeds give the same numbers in another process.
#[test]
fn runs_are_deterministic() {
    let (_, dir) = text_run();
    let mut saved = serde_json::Map::new();
    for name in EXPERIMENTS {
        let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        saved.insert(name.into(), serde_json::from_str(&text).unwrap());
    }
    let mut json_run = report().clone();
    json_run["experiments"] = Value::Object(saved);
    assert_eq!(without_timings(json_run), without_timings(report().clone()));
}

#[test]
fn text_mode_shows_every_section() {
    let (text, dir) = text_run();
    for needle in ["Food delivery", "狗咬人", "人咬狗", "Scaling by √d_k"]
        .into_iter()
        .chain(EXPERIMENTS)
    {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(text.contains(&format!("Report: {}", dir.join("index.html").display())));
    assert!(dir.join("index.html").is_file() && dir.join("cross-2.svg").is_file());
}

#[test]
fn unknown_flag_fails_with_nonzero_exit() {
    let out = qkv(&["demo", "--no-such-flag"]);
    assert!(!out.status.success());
    assert!(!out.stderr.is_empty());
}
