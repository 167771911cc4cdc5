//! An experiment's report as files and as the JSON document `qkv experiment --json` and
//! `qkv demo --json` print: `{"name", "claim", "verdict", "rule", "metrics", "figure",
//! "figures"}`, where `figure` is the main SVG's path and `figures` every SVG's path
//! (both `null` / empty when nothing is written).
//!
//! Files, each written atomically into the folder: `NAME.svg` (the main figure),
//! `NAME-2.svg` and so on (any further figures), and `NAME.json` (the document).

use std::path::Path;

use anyhow::Result;
use qkv::experiments::Report;
use qkv::io::write_atomic;
use serde_json::{json, Value};

use super::figure;

/// The drawn report.
pub struct Drawn {
    /// The JSON document above.
    pub doc: Value,
    /// Every figure as an SVG document, the main one first.
    pub svgs: Vec<String>,
}

/// Draws `report`'s figures and, when `dir` is given, writes them and the document
/// there.
pub fn draw(report: &Report, dir: Option<&Path>) -> Result<Drawn> {
    let mut svgs = Vec::new();
    let mut paths = Vec::new();
    for (i, fig) in report.figures.iter().enumerate() {
        let svg = figure::svg(fig)?;
        if let Some(dir) = dir {
            let file = match i {
                0 => format!("{}.svg", report.name),
                _ => format!("{}-{}.svg", report.name, i + 1),
            };
            let path = dir.join(file);
            write_atomic(&path, svg.as_bytes())?;
            paths.push(path.display().to_string());
        }
        svgs.push(svg);
    }
    let doc = json!({
        "name": report.name,
        "claim": report.claim,
        "verdict": report.verdict,
        "rule": report.rule,
        "metrics": report.metrics,
        "figure": paths.first(),
        "figures": paths,
    });
    if let Some(dir) = dir {
        let text = serde_json::to_string_pretty(&doc).expect("a report serialises");
        write_atomic(
            &dir.join(format!("{}.json", report.name)),
            format!("{text}\n").as_bytes(),
        )?;
    }
    Ok(Drawn { doc, svgs })
}
