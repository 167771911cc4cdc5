//! `qkv generate`: continue a prompt (decoder-only) or transform a source sentence
//! (encoder-decoder), greedily, by seeded sampling or by beam search. What the flags
//! leave open comes from the folder's `generation_config.json` as transformers reads
//! it: the length, beams and their scoring, banned and forced tokens, sampling.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use qkv::models::generate::{
    generate_causal_each, generate_seq2seq_each, GenerateOptions, Sampling,
};
use qkv::models::generation_config::{EarlyStopping, GenerationConfig};
use qkv::models::{ModelKind, TokenBatch};
use qkv::text::{TextStream, Tokenizer};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Hugging Face model folder
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (needs the folder's tokenizer: tokenizer.json, or SentencePiece files)
    #[arg(
        long,
        conflicts_with = "input_ids",
        required_unless_present = "input_ids"
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3
    #[arg(long, value_delimiter = ',')]
    input_ids: Option<Vec<usize>>,
    /// New tokens at most [default: the folder's max_new_tokens, or its max_length (20
    /// when unset) less the prompt, as transformers counts them]
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Always take the most likely token (the default unless the folder's generation
    /// config samples)
    #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p", "seed"])]
    greedy: bool,
    /// Beam search with N beams [default: the folder's num_beams, else 1]
    #[arg(long, value_name = "N")]
    num_beams: Option<usize>,
    /// Beam scores are divided by the generated length to this power [default: the
    /// folder's, else 1]
    #[arg(long)]
    length_penalty: Option<f32>,
    /// When beam search stops: true (N finished hypotheses), false (no running beam
    /// can win, judged at the current length), never [default: the folder's, else false]
    #[arg(long, value_parser = ["true", "false", "never"])]
    early_stopping: Option<String>,
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
    /// Sampling flags win, then `--greedy`, then the folder's `do_sample`.
    fn sampling(&self, config: &GenerationConfig) -> Sampling {
        let flags = self.temperature.is_some() || self.top_k.is_some() || self.top_p.is_some();
        match (flags, self.greedy, config.sample) {
            (true, _, _) => Sampling::Sample {
                temperature: self.temperature.unwrap_or(1.0),
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
            },
            (false, false, Some(s)) => Sampling::Sample {
                temperature: s.temperature,
                top_k: s.top_k,
                top_p: s.top_p,
                seed: self.seed,
            },
            _ => Sampling::Greedy,
        }
    }

    /// The folder's generation config with the flags' overrides.
    fn config(&self) -> Result<GenerationConfig> {
        let mut c = GenerationConfig::read(&self.model)?;
        if let Some(n) = self.num_beams {
            if n == 0 {
                bail!("--num-beams must be at least 1");
            }
            c.search.num_beams = n;
        }
        if let Some(p) = self.length_penalty {
            if !p.is_finite() {
                bail!("--length-penalty must be finite, got {p}");
            }
            c.search.length_penalty = p;
        }
        if let Some(e) = &self.early_stopping {
            c.search.early_stopping = match e.as_str() {
                "true" => EarlyStopping::Done,
                "never" => EarlyStopping::Never,
                _ => EarlyStopping::Heuristic,
            };
        }
        Ok(c)
    }
}

/// `asked` new tokens, fewer where the model's position table ends first: a model with
/// learned or sinusoidal positions cannot go past its last row, and `used` positions
/// are taken (the prompt's for a decoder-only model, the start token's for a decoder).
fn clamp_to_positions(asked: usize, used: usize, max: Option<usize>) -> Result<usize> {
    let Some(max) = max else { return Ok(asked) };
    let room = max.saturating_sub(used);
    if room == 0 {
        bail!("the prompt takes all {max} positions of the model: nothing can be generated");
    }
    if asked > room {
        eprintln!(
            "warning: --max-new-tokens {asked} goes past the model's {max} positions; generating at most {room}"
        );
    }
    Ok(asked.min(room))
}

/// Bytes of the key/value cache after `tokens` positions (self-attention of every
/// decoder layer; an encoder-decoder also caches the source's `src` positions per layer).
fn cache_bytes(m: &qkv::models::Transformer, tokens: usize, src: usize) -> Option<usize> {
    let s = m.arch.decoder?;
    let per_position = s
        .layers
        .checked_mul(2)?
        .checked_mul(s.kv_heads)?
        .checked_mul(s.head_dim)?
        .checked_mul(4)?;
    per_position.checked_mul(tokens.checked_add(src)?)
}

pub fn run(args: &GenerateArgs, out: &mut impl Write) -> Result<()> {
    let loaded = super::load_model(&args.model)?;
    let tokenizer = match &args.prompt {
        Some(_) => Some(Tokenizer::from_dir(&args.model)?),
        None => Tokenizer::optional(&args.model)?,
    };
    let ids = match (&args.prompt, &args.input_ids, &tokenizer) {
        (Some(text), _, Some(tok)) => tok.encode(text, true)?,
        (_, Some(ids), _) => ids.clone(),
        _ => bail!("give --prompt or --input-ids"),
    };
    let m = &loaded.model;
    let config = args.config()?;
    let sampling = args.sampling(&config);
    if config.search.num_beams > 1 && sampling != Sampling::Greedy {
        bail!(
            "beam search ({} beams) with sampling is not supported: pass --greedy, or --num-beams 1 to sample",
            config.search.num_beams
        );
    }
    let max = m.arch.max_positions();
    // what the decoder has read before its first new token
    let read = match m.kind() {
        ModelKind::Decoder => ids.len(),
        _ => 1,
    };
    let asked = match (args.max_new_tokens, config.max_new_tokens) {
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => config
            .max_length
            .checked_sub(read)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the prompt fills the folder's max_length ({}) already: pass --max-new-tokens",
                    config.max_length
                )
            })?,
    };
    let (max_new, src) = match m.kind() {
        ModelKind::Decoder => (clamp_to_positions(asked, read, max)?, 0),
        _ => (clamp_to_positions(asked, read, max)?, ids.len()),
    };
    super::check_memory(
        cache_bytes(m, ids.len().saturating_add(max_new), src)
            .and_then(|bytes| bytes.checked_mul(config.search.num_beams)),
        &format!("the key/value cache of {max_new} new tokens"),
    )
    .map_err(|e| anyhow::anyhow!("{e}: ask for fewer --max-new-tokens"))?;
    let prompt = TokenBatch::single(ids)?;
    let opts = GenerateOptions::new(max_new, sampling, m.special_tokens().eos.clone())
        .with_config(&config);
    // Text goes out as it is made, as llama.cpp prints it; `--json` and bare ids (no
    // tokenizer) come whole at the end.
    let mut stream = tokenizer
        .as_ref()
        .filter(|_| !args.json)
        .map(Tokenizer::stream);
    let mut failed: Option<anyhow::Error> = None;
    let mut emit = |_row: usize, id: usize| {
        let Some(stream) = stream.as_mut() else {
            return;
        };
        if failed.is_some() {
            return;
        }
        let piece = stream
            .push(id)
            .map_err(anyhow::Error::from)
            .and_then(|text| {
                if let Some(text) = text {
                    out.write_all(text.as_bytes())?;
                    out.flush()?;
                }
                Ok(())
            });
        if let Err(e) = piece {
            failed = Some(e);
        }
    };
    let new = match m.kind() {
        ModelKind::Decoder => generate_causal_each(m, &prompt, &opts, &mut emit)?,
        ModelKind::EncoderDecoder => generate_seq2seq_each(m, &prompt, &opts, &mut emit)?,
        ModelKind::Encoder => bail!(
            "{} is an encoder ({}); it has no language-model head to generate with",
            args.model.display(),
            m.info().architecture
        ),
    };
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(rest) = stream.map(TextStream::finish).transpose()?.flatten() {
        out.write_all(rest.as_bytes())?;
    }
    let new = new.into_iter().next().unwrap_or_default();
    match (&tokenizer, args.json) {
        (_, true) => writeln!(out, "{}", serde_json::to_string(&new)?)?,
        (Some(_), false) => writeln!(out)?,
        (None, false) => writeln!(out, "{new:?}")?,
    }
    Ok(())
}
