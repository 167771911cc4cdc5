//! Checks of `qkv experiment`'s JSON reports shared by `tests/demo` (the quick runs
//! inside `qkv demo`) and `tests/experiment.rs` (the command itself, and the runs on
//! all-MiniLM-L6-v2).

use std::path::Path;

use serde_json::Value;

/// The contract every experiment keeps: the keys, a verdict from the three, the claim
/// in both languages, figures that are SVG documents on disk, and the report saved as
/// `dir/NAME.json`.
pub fn check_contract(report: &Value, name: &str, dir: &Path) {
    assert_eq!(report["name"], name);
    assert!(["supported", "not supported", "inconclusive"]
        .contains(&report["verdict"].as_str().unwrap()));
    assert!(!report["claim"]["zh"].as_str().unwrap().is_empty());
    assert!(!report["claim"]["en"].as_str().unwrap().is_empty());
    assert!(!report["rule"].as_str().unwrap().is_empty());
    assert!(report["metrics"].is_object());
    let figures = report["figures"].as_array().unwrap();
    assert_eq!(report["figure"], figures[0]);
    for f in figures {
        let svg = std::fs::read_to_string(f.as_str().unwrap()).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{f}"
        );
    }
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    assert_eq!(&saved, report);
}

/// The precision experiment's per-type rows of model `m`, by type name.
pub fn precision_types(report: &Value, m: usize) -> Vec<(String, Value)> {
    let model = &report["metrics"]["models"][m];
    let types = model["types"].as_array().unwrap();
    let names: Vec<&str> = types.iter().map(|t| t["dtype"].as_str().unwrap()).collect();
    assert_eq!(names, ["bf16", "int8", "int8-row"], "{model:#}");
    let heads = model["layers"].as_u64().unwrap() * model["heads"].as_u64().unwrap();
    for t in types {
        let per_head: usize = t["head_js_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|layer| layer.as_array().unwrap().len())
            .sum();
        assert_eq!(per_head as u64, heads, "one divergence per head: {t:#}");
    }
    names
        .iter()
        .map(|n| n.to_string())
        .zip(types.iter().cloned())
        .collect()
}

/// The verdict the attribution experiment's stated rule gives for `rho` (mean ρ per
/// method, weights first): recomputed here from the reported numbers.
pub fn attribution_verdict(rho: &serde_json::Map<String, Value>) -> &'static str {
    let get = |m: &str| rho[m].as_f64().unwrap();
    let best = ["weights", "value-norm", "rollout", "flow", "grad"]
        .iter()
        .map(|m| get(m))
        .fold(f64::NEG_INFINITY, f64::max);
    let weights = get("weights");
    if best - weights >= 0.1 {
        "not supported"
    } else if weights >= 0.5 {
        "supported"
    } else {
        "inconclusive"
    }
}
