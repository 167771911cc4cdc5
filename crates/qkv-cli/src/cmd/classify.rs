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
    #[command(flatten)]
    dtype: super::DTypeFlag,
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
    super::show_load_warnings(model.encoder());
    let inputs: Vec<(&str, Option<&str>)> = args
        .text
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), args.pair.get(i).map(String::as_str)))
        .collect();
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
