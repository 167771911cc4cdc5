//! `qkv experiment NAME [--quick] [--json] [--out DIR] [--model DIR]...`: measure one of the articles'
//! claims (`qkv::experiments`), draw its figures as SVG into DIR, and print the verdict
//! (or, with `--json`, the document of [`crate::report::files`]).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use qkv::experiments::{self, Options, Report};

use crate::report::files;

#[derive(Args)]
pub struct ExperimentArgs {
    /// The experiment: long_range, parallel, scaling, mask, order, positions, cross, heads,
    /// precision, attribution
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
    /// `precision` and `attribution` only: a model folder to measure as well
    /// (repeatable; attribution: a sentence-transformers folder), e.g. all-MiniLM-L6-v2,
    /// read over the experiment's own sentences
    #[arg(long = "model")]
    models: Vec<PathBuf>,
}

pub fn run(args: &ExperimentArgs, out: &mut impl Write) -> Result<()> {
    if !experiments::NAMES.contains(&args.name.as_str()) {
        bail!(
            "unknown experiment `{}`; known: {}",
            args.name,
            experiments::NAMES.join(", ")
        );
    }
    if !args.models.is_empty() && !["precision", "attribution"].contains(&args.name.as_str()) {
        bail!(
            "--model is read by the precision and attribution experiments only, not by `{}`",
            args.name
        );
    }
    super::shared_flags::set_threads(args.threads)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating --out {}", args.out.display()))?;
    let options = Options {
        quick: args.quick,
        seed: args.seed,
        memory: Some(crate::counting::probe()),
        checkpoints: &args.models,
    };
    let quiet = args.quiet;
    let report = experiments::run(&args.name, &options, &mut |line| {
        if !quiet {
            eprintln!("{}: {line}", args.name);
        }
    })?;
    let drawn = files::draw(&report, Some(&args.out))?;
    if args.json {
        writeln!(out, "{}", drawn.doc)?;
    } else {
        print_summary(&report, &drawn.doc, out)?;
    }
    Ok(())
}

fn print_summary(report: &Report, doc: &serde_json::Value, out: &mut impl Write) -> Result<()> {
    let verdict = serde_json::to_value(report.verdict).expect("a verdict serialises");
    writeln!(out, "{}", report.name)?;
    writeln!(out, "  claim: {}", report.claim.zh)?;
    writeln!(out, "         {}", report.claim.en)?;
    writeln!(out, "  verdict: {}", verdict.as_str().unwrap_or("?"))?;
    writeln!(out, "  rule: {}", report.rule)?;
    for f in doc["figures"].as_array().into_iter().flatten() {
        writeln!(out, "  figure: {}", f.as_str().unwrap_or("?"))?;
    }
    Ok(())
}
