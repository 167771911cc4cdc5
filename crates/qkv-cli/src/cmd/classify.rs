//! `qkv classify`: a `…ForSequenceClassification` folder's labels and scores for texts,
//! or text pairs read together (a cross-encoder's query and document).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use qkv::models::{SequenceClassifier, Truncate};

use super::flags::in_flags;

#[derive(clap::Args)]
pub struct ClassifyArgs {
    /// Hugging Face folder of a BERT, RoBERTa, XLM-RoBERTa or DistilBERT
    /// `…ForSequenceClassification` model (a cross-encoder reranker is one)
    #[arg(long)]
    model: PathBuf,
    /// Text to classify; repeat for several
    #[arg(long, required_unless_present = "input", conflicts_with = "input")]
    text: Vec<String>,
    /// Second text of each pair (`[CLS] text [SEP] pair [SEP]`); one per --text
    #[arg(long, conflicts_with = "input")]
    pair: Vec<String>,
    /// Print JSON: per input, each label's logit and score
    #[arg(long, conflicts_with = "output")]
    json: bool,
    /// An input longer than the model takes (its positions, or the tokenizer's
    /// model_max_length): `warn` cuts it (the longer text of a pair first) and says so,
    /// `cut` cuts it without a word, `refuse` stops with an error
    #[arg(long, default_value = "warn", value_parser = parse_truncate)]
    truncate: Truncate,
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
    /// Classify the texts of FILE (.txt, .jsonl or .parquet) into --output's Parquet
    /// parts: a corpus job
    #[arg(long, value_name = "FILE", requires = "output")]
    input: Option<PathBuf>,
    #[command(flatten)]
    corpus: super::corpus::CorpusFlags,
}

fn parse_truncate(name: &str) -> Result<Truncate, String> {
    Truncate::parse(name).map_err(|_| "one of warn, cut, refuse".to_string())
}

#[derive(serde::Serialize)]
struct Scored<'a> {
    label: &'a str,
    score: f32,
    logit: f32,
}

pub fn run(args: &ClassifyArgs, out: &mut impl Write) -> Result<()> {
    if !args.pair.is_empty() && args.pair.len() != args.text.len() {
        bail!(
            "--pair: {} given for {} --text; give one second text per --text, or none",
            args.pair.len(),
            args.text.len()
        );
    }
    let model = SequenceClassifier::load(&args.model, args.dtype.dtype)?;
    super::load::show_load_warnings(model.encoder());
    if let Some(input) = &args.input {
        return corpus_job(&model, args, input);
    }
    let inputs: Vec<(&str, Option<&str>)> = args
        .text
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), args.pair.get(i).map(String::as_str)))
        .collect();
    let name = |i: usize| match args.pair.is_empty() {
        true => format!("--text {}", i + 1),
        false => format!("--text {} with its --pair", i + 1),
    };
    warn(model.check_lengths(&inputs, args.truncate, name))?;
    let logits = model.classify(&inputs)?;
    // each input's labels, best first, as the pipeline lists them with top_k=None
    let ranked: Vec<Vec<Scored>> = logits
        .iter()
        .map(|row| {
            let scores = model.scoring().apply(row);
            let mut s: Vec<Scored> = model
                .labels()
                .iter()
                .zip(scores.iter().zip(row))
                .map(|(label, (&score, &logit))| Scored {
                    label,
                    score,
                    logit,
                })
                .collect();
            s.sort_by(|a, b| b.score.total_cmp(&a.score));
            s
        })
        .collect();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&ranked)?)?;
        return Ok(());
    }
    for ((text, pair), labels) in inputs.iter().zip(&ranked) {
        match pair {
            Some(p) => writeln!(out, "{text} | {p}")?,
            None => writeln!(out, "{text}")?,
        }
        for s in labels {
            writeln!(
                out,
                "  {:<16} {:.4}  (logit {:+.4})",
                s.label, s.score, s.logit
            )?;
        }
    }
    Ok(())
}

/// `--input FILE --output DIR`: every text's top label, its score and every label's
/// score, into Parquet parts.
fn corpus_job(model: &SequenceClassifier, args: &ClassifyArgs, input: &Path) -> Result<()> {
    let runner = super::corpus::Runner {
        command: "classify",
        model: &args.model,
        dtype: args.dtype.dtype.to_string(),
    };
    super::corpus::run(runner, input, &args.corpus, |first, texts| {
        let inputs: Vec<(&str, Option<&str>)> = texts.iter().map(|&t| (t, None)).collect();
        let name = |i: usize| format!("--input row {}", first + i as u64);
        warn(model.check_lengths(&inputs, args.truncate, name))?;
        let logits = model.classify(&inputs)?;
        let rows = logits.iter().map(|logits| {
            let scores = model.scoring().apply(logits);
            let (label, score) = model.top(&scores);
            (label.to_string(), score, scores)
        });
        Ok(super::corpus::Results::Classes(rows.collect()))
    })
}

/// Prints the length check's warnings, or its refusal in this command's flags.
fn warn(checked: qkv::Result<Vec<String>>) -> Result<()> {
    for w in checked.map_err(in_flags::<ClassifyArgs>)? {
        eprintln!("warning: {}", super::flags::as_flags::<ClassifyArgs>(&w));
    }
    Ok(())
}
