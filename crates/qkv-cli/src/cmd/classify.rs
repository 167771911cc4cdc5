//! `qkv classify`: a `…ForSequenceClassification` folder's labels and scores for texts,
//! or text pairs read together (a cross-encoder's query and document).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use qkv::models::SequenceClassifier;

#[derive(clap::Args)]
pub struct ClassifyArgs {
    /// Hugging Face folder of a BERT, RoBERTa, XLM-RoBERTa or DistilBERT
    /// `…ForSequenceClassification` model (a cross-encoder reranker is one)
    #[arg(long)]
    model: PathBuf,
    /// Text to classify; repeat for several
    #[arg(long, required = true)]
    text: Vec<String>,
    /// Second text of each pair (`[CLS] text [SEP] pair [SEP]`); one per --text
    #[arg(long)]
    pair: Vec<String>,
    /// Print JSON: per input, each label's logit and score
    #[arg(long)]
    json: bool,
    /// An input longer than the model takes (its positions, or the tokenizer's
    /// model_max_length): `warn` cuts it (the longer text of a pair first) and says so,
    /// `cut` cuts it without a word, `refuse` stops with an error
    #[arg(long, value_enum, default_value = "warn")]
    truncate: Truncate,
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
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
