//! Corpus jobs: `qkv embed|classify --input FILE --output DIR` runs a file's texts
//! chunk by chunk into a folder of Parquet parts, with a progress bar, and `--resume`
//! goes on after the last whole part of a killed run (the result equals an
//! uninterrupted run's: a resumed job cuts the same chunks).

mod input;
mod parts;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use input::{Format, Texts};
use parts::Parts;
pub use parts::Results;

/// A corpus job's flags, beside `--input` and `--model`.
#[derive(Args)]
pub struct CorpusFlags {
    /// Write the results to this folder as Parquet parts (`id` and the results) instead
    /// of printing them: a corpus job, read from --input as it goes
    #[arg(long, value_name = "DIR", requires = "input")]
    pub output: Option<PathBuf>,
    /// Continue the job that wrote --output, after its last whole part
    #[arg(long, requires = "output")]
    pub resume: bool,
    /// Rows a part holds (the most work a killed job loses)
    #[arg(long, default_value_t = 10_000, requires = "output")]
    pub chunk: u64,
    /// The text's field in a .jsonl --input [default: text]
    #[arg(long, requires = "output")]
    pub text_field: Option<String>,
}

/// The model a job runs: its folder and number type (the job's description records
/// them) and the command's name.
pub struct Runner<'a> {
    pub command: &'a str,
    pub model: &'a Path,
    pub dtype: String,
}

/// Runs `input`'s texts through `compute`, a chunk a call (the chunk's first row id
/// and its texts), into `flags.output`'s parts.
pub fn run(
    runner: Runner,
    input: &Path,
    flags: &CorpusFlags,
    mut compute: impl FnMut(u64, &[&str]) -> Result<Results>,
) -> Result<()> {
    let output = flags.output.as_deref().expect("a corpus job has --output");
    if flags.chunk == 0 {
        bail!("--chunk must be at least 1");
    }
    let format = Format::of(input, flags.text_field.as_deref())?;
    let absolute = |p: &Path| -> Result<String> {
        let full = p
            .canonicalize()
            .with_context(|| format!("{}", p.display()))?;
        Ok(full.display().to_string())
    };
    let input_bytes = std::fs::metadata(input)
        .with_context(|| format!("--input {}", input.display()))?
        .len();
    let job = json!({
        "command": runner.command,
        "input": absolute(input)?,
        "input_bytes": input_bytes,
        "text_field": flags.text_field,
        "model": absolute(runner.model)?,
        "dtype": runner.dtype,
        "chunk": flags.chunk,
    });
    let total = Texts::count(input, &format)?;
    if total == 0 {
        bail!("--input {}: no texts", input.display());
    }
    let (parts, done) = Parts::open(output, &job, flags.resume)?;
    let mut texts = Texts::open(input, format)?;
    let mut row = texts.skip(done * flags.chunk)?;
    let bar = progress(total, row);
    let (start, first) = (Instant::now(), row);
    let mut index = done;
    loop {
        let mut chunk = Vec::new();
        while (chunk.len() as u64) < flags.chunk {
            match texts.next_text()? {
                Some(text) => chunk.push(text),
                None => break,
            }
        }
        if chunk.is_empty() {
            break;
        }
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let results = compute(row, &refs)?;
        parts.write(index, row, &results)?;
        index += 1;
        row += chunk.len() as u64;
        bar.set_position(row);
        if bar.is_hidden() {
            // a log's view: a line a part
            let rate = (row - first) as f64 / start.elapsed().as_secs_f64().max(1e-9);
            eprintln!(
                "{index} parts: {row}/{total} texts, {rate:.1} texts/s, ETA {:.0} s",
                total.saturating_sub(row) as f64 / rate
            );
        }
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{} texts in {} parts to {} ({} this run, {:.1} texts/s)",
        row,
        index,
        output.display(),
        row - first,
        (row - first) as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// A bar of `total` texts at `at` with rate and ETA, on stderr when it is a terminal.
fn progress(total: u64, at: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} texts  {per_sec}  ETA {eta}")
        {
            bar.set_style(style);
        }
    }
    bar.set_position(at);
    bar.reset_eta();
    bar
}
