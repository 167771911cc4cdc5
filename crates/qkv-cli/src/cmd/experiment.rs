//! `qkv experiment NAME [--quick] [--json] [--out DIR]`: measure one of the articles'
//! claims (`qkv::experiments`), draw its figures as SVG, and print the verdict.
//!
//! Files, each written atomically: `DIR/NAME.svg` (the main figure), `DIR/NAME-2.svg`
//! and so on (any further figures), and `DIR/NAME.json` (the whole report). With
//! `--json`, stdout is one object: `{"name", "claim", "verdict", "rule", "metrics",
//! "figure", "figures"}`, `figure` being the main SVG's path.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use qkv::experiments::{self, Options, Report};
use qkv::io::write_atomic;
use serde_json::json;

use crate::report::figure;

#[derive(Args)]
pub struct ExperimentArgs {
    /// The experiment: long_range, parallel, scaling, mask, order, positions
    name: String,
    /// The small version: at most about two minutes on two cores
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object (progress still goes to stderr)
    #[arg(long)]
    json: bool,
    /// Folder for the figures and the JSON report
    #[arg(long, default_value = "qkv-experiments")]
    out: PathBuf,
    /// Seed of the data and the models' initial weights
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Threads (results are reproducible for a given seed and thread count) [default: all cores]
    #[arg(long)]
    threads: Option<usize>,
    /// No progress lines on stderr
    #[arg(long)]
    quiet: bool,
}

pub fn run(args: &ExperimentArgs, out: &mut impl Write) -> Result<()> {
    if !experiments::NAMES.contains(&args.name.as_str()) {
        bail!(
            "unknown experiment `{}`; known: {}",
            args.name,
            experiments::NAMES.join(", ")
        );
    }
    if let Some(n) = args.threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("setting the number of threads")?;
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating --out {}", args.out.display()))?;
    let options = Options {
        quick: args.quick,
        seed: args.seed,
        memory: Some(crate::counting::probe()),
    };
    let quiet = args.quiet;
    let report = experiments::run(&args.name, &options, &mut |line| {
        if !quiet {
            eprintln!("{}: {line}", args.name);
        }
    })?;
    let mut paths = Vec::new();
    for (i, fig) in report.figures.iter().enumerate() {
        let file = match i {
            0 => format!("{}.svg", report.name),
            _ => format!("{}-{}.svg", report.name, i + 1),
        };
        let path = args.out.join(file);
        write_atomic(&path, figure::svg(fig)?.as_bytes())?;
        paths.push(path.display().to_string());
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
    let json_path = args.out.join(format!("{}.json", report.name));
    let text = serde_json::to_string_pretty(&doc).expect("a report serialises");
    write_atomic(&json_path, format!("{text}\n").as_bytes())?;
    if args.json {
        writeln!(out, "{doc}")?;
    } else {
        print_summary(&report, &paths, out)?;
    }
    Ok(())
}

fn print_summary(report: &Report, figures: &[String], out: &mut impl Write) -> Result<()> {
    let verdict = serde_json::to_value(report.verdict).expect("a verdict serialises");
    writeln!(out, "{}", report.name)?;
    writeln!(out, "  claim: {}", report.claim.zh)?;
    writeln!(out, "         {}", report.claim.en)?;
    writeln!(out, "  verdict: {}", verdict.as_str().unwrap_or("?"))?;
    writeln!(out, "  rule: {}", report.rule)?;
    for f in figures {
        writeln!(out, "  figure: {f}")?;
    }
    Ok(())
}
