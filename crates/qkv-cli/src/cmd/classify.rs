//! `qkv classify`: a `…ForSequenceClassification` folder's labels and scores for texts,
//! or text pairs read together (a cross-encoder's query and document).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use qkv::models::SequenceClassifier;

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
    #[arg(long, value_enum, default_value = "warn")]
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

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Truncate {
    Warn,
    Cut,
    Refuse,
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
    if args.truncate != Truncate::Cut {
        for (i, n) in model.overlong(&inputs)? {
            let which = match args.pair.is_empty() {
                true => format!("--text {}", i + 1),
                false => format!("--text {} with its --pair", i + 1),
            };
            let what = format!(
                "{which} is {n} tokens, more than the {} the model takes",
                model.max_len()
            );
            match args.truncate {
                Truncate::Refuse => bail!("{what} (--truncate refuse)"),
                _ => eprintln!(
                    "warning: {what}: cut to them (--truncate cut to cut without this warning, refuse to stop)"
                ),
            }
        }
    }
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
        if args.truncate != Truncate::Cut {
            for (i, n) in model.overlong(&inputs)? {
                let what = format!(
                    "--input row {} is {n} tokens, more than the {} the model takes",
                    first + i as u64,
                    model.max_len()
                );
                match args.truncate {
                    Truncate::Refuse => bail!("{what} (--truncate refuse)"),
                    _ => eprintln!("warning: {what}: cut to them (--truncate cut: no warning)"),
                }
            }
        }
        let logits = model.classify(&inputs)?;
        let rows = logits.iter().map(|logits| {
            let scores = model.scoring().apply(logits);
            let top = (0..scores.len())
                .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
                .unwrap_or(0);
            let label = model.labels().get(top).cloned().unwrap_or_default();
            (
                label,
                scores.get(top).copied().unwrap_or(f32::NAN),
                scores.to_vec(),
            )
        });
        Ok(super::corpus::Results::Classes(rows.collect()))
    })
}
