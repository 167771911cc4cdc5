//! `qkv embed`: sentence embeddings as the folder's sentence-transformers files define.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use qkv::models::sentence::SentenceEncoder;

#[derive(clap::Args)]
pub struct EmbedArgs {
    /// sentence-transformers model folder (modules.json, 1_Pooling/, …)
    #[arg(long)]
    model: PathBuf,
    /// Print a JSON array of vectors
    #[arg(long)]
    json: bool,
    /// Sentences to embed
    #[arg(required = true)]
    texts: Vec<String>,
    #[command(flatten)]
    dtype: super::DTypeFlag,
}

pub fn run(args: &EmbedArgs, out: &mut impl Write) -> Result<()> {
    let encoder = SentenceEncoder::load_in(&args.model, args.dtype.dtype)?;
    super::show_load_warnings(encoder.encoder());
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let vectors = encoder.embed(&texts)?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&vectors)?)?;
        return Ok(());
    }
    // Cosine similarity of every pair: the embeddings' use in one glance.
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    for (i, (text, v)) in texts.iter().zip(&vectors).enumerate() {
        let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:+.4}")).collect();
        writeln!(
            out,
            "[{i}] dim {} norm {:.4} [{} …] {text}",
            v.len(),
            norm(v),
            head.join(", ")
        )?;
    }
    for i in 0..vectors.len() {
        for j in i + 1..vectors.len() {
            let dot: f32 = vectors[i].iter().zip(&vectors[j]).map(|(a, b)| a * b).sum();
            writeln!(
                out,
                "cos([{i}], [{j}]) = {:.4}",
                dot / (norm(&vectors[i]) * norm(&vectors[j]))
            )?;
        }
    }
    Ok(())
}
