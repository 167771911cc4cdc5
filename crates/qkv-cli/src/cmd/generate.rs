//! `qkv generate`: continue a prompt (decoder-only) or transform a source sentence
//! (encoder-decoder), greedily or by seeded sampling.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use qkv::models::generate::{generate_causal, generate_seq2seq, GenerateOptions, Sampling};
use qkv::models::{ModelKind, TokenBatch};
use qkv::text::Tokenizer;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Hugging Face model folder
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (needs the folder's tokenizer.json)
    #[arg(
        long,
        conflicts_with = "input_ids",
        required_unless_present = "input_ids"
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3
    #[arg(long, value_delimiter = ',')]
    input_ids: Option<Vec<usize>>,
    #[arg(long)]
    max_new_tokens: usize,
    /// Always take the most likely token (the default)
    #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p", "seed"])]
    greedy: bool,
    /// Sample with this temperature
    #[arg(long)]
    temperature: Option<f32>,
    /// Sample among the k most likely tokens
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches p
    #[arg(long)]
    top_p: Option<f32>,
    /// Seed of the sampler
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the generated token ids as a JSON list
    #[arg(long)]
    json: bool,
}

impl GenerateArgs {
    fn sampling(&self) -> Sampling {
        if self.temperature.is_none() && self.top_k.is_none() && self.top_p.is_none() {
            return Sampling::Greedy;
        }
        Sampling::Sample {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

pub fn run(args: &GenerateArgs, out: &mut impl Write) -> Result<()> {
    let loaded = super::load_model(&args.model)?;
    let tokenizer = match &args.prompt {
        Some(_) => Some(Tokenizer::from_dir(&args.model)?),
        None => Tokenizer::from_dir(&args.model).ok(),
    };
    let ids = match (&args.prompt, &args.input_ids, &tokenizer) {
        (Some(text), _, Some(tok)) => tok.encode(text, true)?,
        (_, Some(ids), _) => ids.clone(),
        _ => bail!("give --prompt or --input-ids"),
    };
    let prompt = TokenBatch::single(ids)?;
    let opts = |eos: &[usize]| GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling: args.sampling(),
        eos: eos.to_vec(),
    };
    let m = &loaded.model;
    let eos = &m.special_tokens().eos;
    let new = match m.kind() {
        ModelKind::Decoder => generate_causal(m, &prompt, &opts(eos))?,
        ModelKind::EncoderDecoder => generate_seq2seq(m, &prompt, &opts(eos))?,
        ModelKind::Encoder => bail!(
            "{} is an encoder ({}); it has no language-model head to generate with",
            args.model.display(),
            m.info().architecture
        ),
    };
    let new = new.into_iter().next().unwrap_or_default();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&new)?)?;
    } else {
        match &tokenizer {
            Some(tok) => writeln!(out, "{}", tok.decode(&new)?)?,
            None => writeln!(out, "{new:?}")?,
        }
    }
    Ok(())
}
