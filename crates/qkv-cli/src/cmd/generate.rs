//! `qkv generate`: continue a prompt (decoder-only) or transform a source sentence
//! (encoder-decoder), greedily, by seeded sampling or by beam search. What the flags
//! leave open comes from the folder's `generation_config.json` as transformers reads
//! it: the length, beams and their scoring, banned and forced tokens, sampling.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use qkv::models::generate::grammar::{Grammar, Vocabulary};
use qkv::models::generate::{gbnf, generate_constrained, generate_each};
use qkv::models::generation_config::{EarlyStopping, GenerationConfig};
use qkv::models::request::Request;
use qkv::models::TokenBatch;
use qkv::text::{ChatTemplate, TextStream, Tokenizer};
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Hugging Face model folder
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (needs the folder's tokenizer: tokenizer.json, or SentencePiece files)
    #[arg(
        long,
        conflicts_with_all = ["input_ids", "chat", "user"],
        required_unless_present_any = ["input_ids", "chat", "user"]
    )]
    prompt: Option<String>,
    /// A conversation, a JSON file of messages ([{"role": "user", "content": "..."}]),
    /// turned into the prompt by the folder's chat template (as transformers'
    /// apply_chat_template with add_generation_prompt)
    #[arg(long, value_name = "MESSAGES.json", conflicts_with_all = ["input_ids", "user", "system"])]
    chat: Option<PathBuf>,
    /// A one-turn conversation through the chat template: the user's message
    #[arg(long, conflicts_with = "input_ids")]
    user: Option<String>,
    /// With --user: a system message before it
    #[arg(long, requires = "user")]
    system: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3
    #[arg(long, value_delimiter = ',')]
    input_ids: Option<Vec<usize>>,
    /// Prompt tokens at most [default: the model's positions, or 32768 where they have
    /// no limit]: a longer prompt is refused before it is prefilled, and a text (or a
    /// --chat file) of more than 32 bytes a token before it is read or tokenized
    #[arg(long, value_name = "N")]
    max_prompt: Option<usize>,
    /// New tokens at most [default: the folder's max_new_tokens, or its max_length (20
    /// when unset) less the prompt, as transformers counts them]
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Always take the most likely token (the default unless the folder's generation
    /// config samples)
    #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p", "min_p", "seed"])]
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
    /// Sample among the tokens at least p times as likely as the likeliest one
    #[arg(long)]
    min_p: Option<f32>,
    /// Divide the logit of every token already read or written by this (multiply when
    /// negative), as transformers does [default: the folder's, else 1]
    #[arg(long, value_name = "R")]
    repetition_penalty: Option<f32>,
    /// Seed of the sampler
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Hold the output to a JSON schema (a file): the text is JSON valid under it,
    /// written compactly (", " and ": " between items)
    #[arg(long, value_name = "SCHEMA.json", conflicts_with = "grammar")]
    json_schema: Option<PathBuf>,
    /// Hold the output to a grammar (a file): llama.cpp's GBNF (rules `name ::= …`,
    /// starting at `root`) or llguidance's Lark dialect (starting at `start`)
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
    /// Print the generated token ids as a JSON list
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
    #[command(flatten)]
    kv_dtype: super::shared_flags::KvDTypeFlag,
}

impl GenerateArgs {
    /// The flags as a library request; what they leave open comes from the folder.
    fn request(&self) -> Request {
        Request {
            max_new_tokens: self.max_new_tokens,
            greedy: self.greedy,
            num_beams: self.num_beams,
            length_penalty: self.length_penalty,
            early_stopping: self.early_stopping.as_deref().map(|e| match e {
                "true" => EarlyStopping::Done,
                "never" => EarlyStopping::Never,
                _ => EarlyStopping::Heuristic,
            }),
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            repetition_penalty: self.repetition_penalty,
            ..Request::default()
        }
    }
}

/// Bytes of prompt text a token of `--max-prompt` allows before tokenizing.
const BYTES_PER_TOKEN: usize = 32;

/// Messages a `--chat` conversation may hold.
const MAX_MESSAGES: usize = 4096;

pub fn run(args: &GenerateArgs, out: &mut impl Write) -> Result<()> {
    let mut loaded = super::load::load_model(&args.model, args.dtype.dtype)?;
    loaded.model.kv_dtype = args.kv_dtype.kv_dtype;
    // the model's trained positions (RoPE's too) where it names them
    let positions = loaded.model.info().max_positions;
    let max_prompt = args.max_prompt.or(positions).unwrap_or(32768);
    let text_in = args.prompt.is_some() || args.chat.is_some() || args.user.is_some();
    let tokenizer = super::load::tokenizer(&args.model, &loaded.model, text_in)?;
    let text_fits = |what: &str, bytes: usize| {
        let most = max_prompt.saturating_mul(BYTES_PER_TOKEN);
        match bytes > most {
            true => bail!(
                "{what} is {bytes} bytes, more than --max-prompt {max_prompt} tokens' worth ({BYTES_PER_TOKEN} bytes a token): shorten it or raise --max-prompt"
            ),
            false => Ok(()),
        }
    };
    let ids = match (&args.prompt, &args.input_ids, &tokenizer) {
        (Some(text), _, Some(tok)) => {
            text_fits("--prompt", text.len())?;
            tok.encode(text, true)?
        }
        (_, Some(ids), _) => ids.clone(),
        (None, None, Some(tok)) => {
            let text = chat_prompt(args, &text_fits)?;
            text_fits("the prompt the chat template wrote", text.len())?;
            // the template writes the special tokens itself, as transformers tokenizes it
            tok.encode(&text, false)?
        }
        _ => bail!("give --prompt, --chat, --user or --input-ids"),
    };
    if ids.len() > max_prompt {
        bail!(
            "the prompt is {} tokens, more than --max-prompt {max_prompt}{}",
            ids.len(),
            match (args.max_prompt, positions) {
                (Some(_), _) => "",
                (None, Some(_)) => " (the model's positions; --max-prompt raises it)",
                (None, None) => " (--max-prompt raises it)",
            }
        );
    }
    let m = &loaded.model;
    let folder_settings = GenerationConfig::read(&args.model)?;
    for w in &folder_settings.unapplied {
        eprintln!("warning: {w}");
    }
    let plan = args
        .request()
        .plan(m, folder_settings, ids.len())
        .map_err(super::flags::in_flags::<GenerateArgs>)?;
    if let Some(c) = plan.clamped {
        eprintln!(
            "warning: {} goes past the model's positions; generating at most {}",
            super::flags::as_flags::<GenerateArgs>(&c.setting),
            c.allowed
        );
    }
    let prompt = TokenBatch::single(ids)?;
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
    let new = match grammar(args)? {
        Some((flag, g)) => {
            let tok = tokenizer.as_ref().with_context(|| {
                format!("{flag}: the model folder has no tokenizer to spell the grammar with")
            })?;
            let constraint = Vocabulary::of_model(m, tok)
                .and_then(|v| v.constraint(&g))
                .with_context(|| flag.to_string())?;
            let new = generate_constrained(m, &prompt.ids, &plan.options, constraint, &mut |id| {
                emit(0, id)
            })
            .with_context(|| format!("generating with {}", args.model.display()))?;
            vec![new]
        }
        None => generate_each(m, &prompt, &plan.options, &mut emit)
            .with_context(|| format!("generating with {}", args.model.display()))?,
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

/// Grammar files are read whole; past this they are refused before reading.
const MAX_GRAMMAR_BYTES: u64 = 4 << 20;

/// The grammar `--json-schema` or `--grammar` names, with the flag and file for errors.
fn grammar(args: &GenerateArgs) -> Result<Option<(String, Grammar)>> {
    let (flag, path) = match (&args.json_schema, &args.grammar) {
        (Some(p), _) => ("--json-schema", p),
        (None, Some(p)) => ("--grammar", p),
        (None, None) => return Ok(None),
    };
    let named = format!("{flag} {}", path.display());
    let size = std::fs::metadata(path)
        .with_context(|| named.clone())?
        .len();
    if size > MAX_GRAMMAR_BYTES {
        bail!("{named}: {size} bytes, more than the {MAX_GRAMMAR_BYTES} a grammar may have");
    }
    let text = std::fs::read_to_string(path).with_context(|| named.clone())?;
    let g = match flag {
        "--json-schema" => Grammar::JsonSchema(
            serde_json::from_str(&text).with_context(|| format!("{named}: not JSON"))?,
        ),
        _ if text.contains("::=") => {
            Grammar::Lark(gbnf::to_lark(&text).with_context(|| named.clone())?)
        }
        _ => Grammar::Lark(text),
    };
    Ok(Some((named, g)))
}

/// The prompt text that `--chat` or `--system`/`--user` make through the folder's chat
/// template.
/// `fits(what, bytes)` refuses a text longer than the prompt may be, before it is read.
fn chat_prompt(args: &GenerateArgs, fits: &dyn Fn(&str, usize) -> Result<()>) -> Result<String> {
    let template = ChatTemplate::from_dir(&args.model)?.with_context(|| {
        format!(
            "{} has no chat template (chat_template.jinja, chat_template in tokenizer_config.json, or a GGUF file's tokenizer.chat_template): give --prompt",
            args.model.display()
        )
    })?;
    let messages: Vec<Value> = match (&args.chat, &args.user) {
        (Some(path), _) => {
            let size = std::fs::metadata(path)
                .with_context(|| format!("reading --chat {}", path.display()))?
                .len();
            // JSON quoting and the roles add to the text: twice its bound, measured
            // before the file is read
            fits(
                &format!("--chat {}", path.display()),
                usize::try_from(size / 2).unwrap_or(usize::MAX),
            )?;
            let bytes = std::fs::read(path)
                .with_context(|| format!("reading --chat {}", path.display()))?;
            let v: Value = serde_json::from_slice(&bytes)
                .with_context(|| format!("--chat {}: not JSON", path.display()))?;
            let Value::Array(messages) = v else {
                bail!(
                    "--chat {}: a list of messages, [{{\"role\": ..., \"content\": ...}}]",
                    path.display()
                );
            };
            if messages.len() > MAX_MESSAGES {
                bail!(
                    "--chat {}: {} messages, more than the {MAX_MESSAGES} a conversation may have",
                    path.display(),
                    messages.len()
                );
            }
            for (i, m) in messages.iter().enumerate() {
                if !(m["role"].is_string() && m["content"].is_string()) {
                    bail!(
                        "--chat {}: message {i} needs a string `role` and `content`",
                        path.display()
                    );
                }
            }
            messages
        }
        (None, Some(user)) => {
            fits(
                "--user and --system",
                user.len() + args.system.as_ref().map_or(0, String::len),
            )?;
            let system = args
                .system
                .iter()
                .map(|s| json!({"role": "system", "content": s}));
            system
                .chain([json!({"role": "user", "content": user})])
                .collect()
        }
        (None, None) => bail!("give --chat or --user"),
    };
    if messages.is_empty() {
        bail!("--chat: the conversation has no messages");
    }
    let renderer = super::load::template_renderer()?;
    Ok(renderer.render(&template, &messages, true, &serde_json::Map::new())?)
}
