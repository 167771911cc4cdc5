//! `qkv embed`: sentence embeddings as the folder's sentence-transformers files define.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use qkv::models::sentence::SentenceEncoder;

#[derive(clap::Args)]
pub struct EmbedArgs {
    /// sentence-transformers model folder (modules.json, 1_Pooling/, …)
    #[arg(long)]
    model: PathBuf,
    /// Print a JSON array of vectors
    #[arg(long, conflicts_with = "output")]
    json: bool,
    /// Sentences to embed
    #[arg(required_unless_present = "input", conflicts_with = "input")]
    texts: Vec<String>,
    /// Read the sentences from FILE instead, one a line (`-`: standard input); with
    /// --output, a corpus job's .txt, .jsonl or .parquet file
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
    #[command(flatten)]
    corpus: super::corpus::CorpusFlags,
}

/// The most bytes `--input` reads: a corpus past this is a job for a program of its own.
const MAX_INPUT_BYTES: u64 = 256 << 20;

/// Pairs' cosines are printed for this many texts at most.
const MOST_PAIRED: usize = 16;

/// `--input`'s lines, read within [`MAX_INPUT_BYTES`].
fn read_lines(path: &Path) -> Result<Vec<String>> {
    let mut bytes = Vec::new();
    let name = path.display();
    let reader: Box<dyn Read> = match path == Path::new("-") {
        true => Box::new(std::io::stdin().lock()),
        false => Box::new(File::open(path).with_context(|| format!("--input {name}"))?),
    };
    reader
        .take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("--input {name}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        bail!("--input {name}: more than {} MiB", MAX_INPUT_BYTES >> 20);
    }
    let text =
        String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("--input {name}: not UTF-8 ({e})"))?;
    let lines: Vec<String> = text.lines().map(String::from).collect();
    if lines.is_empty() {
        bail!("--input {name}: no lines to embed");
    }
    Ok(lines)
}

pub fn run(args: &EmbedArgs, out: &mut impl Write) -> Result<()> {
    if args.input.is_none() && args.corpus.output.is_some() {
        bail!("--output is a corpus job's folder: it embeds the texts of --input FILE");
    }
    if let (Some(input), Some(_)) = (&args.input, &args.corpus.output) {
        let encoder = SentenceEncoder::load_in(&args.model, args.dtype.dtype)?;
        super::load::show_load_warnings(encoder.encoder());
        let runner = super::corpus::Runner {
            command: "embed",
            model: &args.model,
            dtype: args.dtype.dtype.to_string(),
        };
        return super::corpus::run(runner, input, &args.corpus, |_, texts| {
            Ok(super::corpus::Results::Embeddings(encoder.embed(texts)?))
        });
    }
    let read = args.input.as_deref().map(read_lines).transpose()?;
    let encoder = SentenceEncoder::load_in(&args.model, args.dtype.dtype)?;
    super::load::show_load_warnings(encoder.encoder());
    let texts: Vec<&str> = read
        .as_ref()
        .unwrap_or(&args.texts)
        .iter()
        .map(String::as_str)
        .collect();
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
    let paired = match vectors.len() <= MOST_PAIRED {
        true => vectors.len(),
        false => 0,
    };
    for i in 0..paired {
        for j in i + 1..paired {
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
