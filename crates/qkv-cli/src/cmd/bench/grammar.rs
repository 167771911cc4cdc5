//! Structured output's cost per token: the grammar's mask over the whole vocabulary and
//! the step past the chosen token, beside a greedy decoding step of a random Llama with
//! the same vocabulary, in the same run. The walk follows a JSON document valid under
//! the schema (each of its tokens checked to be allowed first), so it times the masks a
//! real answer meets.

use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use qkv::models::generate::grammar::{Grammar, Vocabulary};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::{TokenBatch, Transformer};
use qkv::text::Tokenizer;
use serde_json::{json, Value};

use super::llama::Shape;
use super::printer::{merge, Printer, Rate, Row};
use super::timing::{measure, Common};

#[derive(Args)]
pub struct GrammarArgs {
    /// The vocabulary: a folder with tokenizer.json, or a GGUF file (llama.cpp's
    /// vocab-only `models/ggml-vocab-qwen2.gguf` serves)
    #[arg(long, value_name = "DIR|FILE")]
    tokenizer: PathBuf,
    /// A JSON schema (with --document) [default: an object of a bounded string, an
    /// integer range, an array of an enum and a nested object]
    #[arg(long, value_name = "SCHEMA.json", requires = "document")]
    schema: Option<PathBuf>,
    /// A JSON document valid under --schema: the walk's tokens
    #[arg(long, value_name = "FILE")]
    document: Option<PathBuf>,
    /// The random Llama the decoding step is timed on (its vocabulary the tokenizer's)
    #[command(flatten)]
    shape: Shape,
    #[command(flatten)]
    pub common: Common,
}

fn default_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["admin", "editor", "viewer"]}},
        "address": {"type": "object", "properties": {
            "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": false}},
        "required": ["name", "age", "tags", "address"], "additionalProperties": false})
}

const DEFAULT_DOCUMENT: &str = r#"{"name": "Ada Lovelace, Countess", "age": 36, "tags": ["admin", "viewer"], "address": {"city": "London", "zip": "12345"}}"#;

pub fn bench_grammar(a: &GrammarArgs, p: &mut Printer<impl Write>) -> Result<()> {
    let tok = match qkv::io::gguf::is_gguf(&a.tokenizer) {
        true => Tokenizer::from_gguf(&a.tokenizer)?
            .with_context(|| format!("{}: no tokenizer in it", a.tokenizer.display()))?,
        false => Tokenizer::from_dir(&a.tokenizer)?,
    };
    let vocab = tok.vocab_size();
    let (schema, document) = match (&a.schema, &a.document) {
        (Some(s), Some(d)) => (
            serde_json::from_str(
                &std::fs::read_to_string(s).with_context(|| s.display().to_string())?,
            )
            .with_context(|| format!("{}: not JSON", s.display()))?,
            std::fs::read_to_string(d).with_context(|| d.display().to_string())?,
        ),
        _ => (default_schema(), DEFAULT_DOCUMENT.to_string()),
    };
    let bytes = tok.token_bytes(vocab);
    let special = tok.special_ids();
    let fields =
        json!({"bench": "grammar", "vocab": vocab, "tokenizer": a.tokenizer.display().to_string()});

    let timing = measure(&a.common, || {
        black_box(Vocabulary::new(&bytes, |id| special.contains(&id), &[])?);
        Ok(())
    })?;
    p.row(Row {
        label: format!("grammar vocabulary of {vocab} tokens"),
        timing,
        rate: None,
        fields: merge(&fields, json!({"mode": "vocabulary"})),
    })?;
    let vocabulary = Vocabulary::new(&bytes, |id| special.contains(&id), &[])?;
    let grammar = Grammar::JsonSchema(schema);
    let timing = measure(&a.common, || {
        black_box(vocabulary.constraint(&grammar)?);
        Ok(())
    })?;
    p.row(Row {
        label: "grammar compile (JSON schema)".into(),
        timing,
        rate: None,
        fields: merge(&fields, json!({"mode": "compile"})),
    })?;

    // the document's tokens, each checked to be allowed where it comes
    let tokens = tok.encode(&document, false)?;
    let compiled = vocabulary.constraint(&grammar)?;
    let mut check = compiled.clone();
    for (i, &t) in tokens.iter().enumerate() {
        let mut scores = vec![0.0f32; vocab];
        check.mask(&mut scores)?;
        if !scores[t].is_finite() {
            bail!("the document's token {i} ({t}) is not allowed by the schema there: give a document valid under it");
        }
        check.commit(t)?;
    }
    let mut scores = vec![0.0f32; vocab];
    let timing = measure(&a.common, || {
        let mut c = compiled.clone();
        for &t in &tokens {
            scores.fill(0.0);
            c.mask(&mut scores)?;
            c.commit(t)?;
        }
        black_box(&scores);
        Ok(())
    })?;
    let mask_per_token = timing.median_s / tokens.len() as f64;
    p.row(Row {
        label: format!("grammar mask + step, {} tokens", tokens.len()),
        timing,
        rate: Some(Rate::new("tokens_per_s", "tokens/s", tokens.len() as f64)),
        fields: merge(&fields, json!({"mode": "mask", "tokens": tokens.len()})),
    })?;

    let arch = a.shape.arch(vocab, 2048);
    let model = Transformer::new(&arch, a.common.seed)?;
    let new = tokens.len();
    let prompt = TokenBatch::single((0..16).map(|i| (i * 7919) % vocab).collect())?;
    let opts = GenerateOptions::new(new, Sampling::Greedy, Vec::new());
    let timing = measure(&a.common, || {
        black_box(generate_causal(&model, &prompt, &opts)?);
        Ok(())
    })?;
    let step = timing.median_s / new as f64;
    p.row(Row {
        label: format!(
            "llama d{} x{} greedy decode {new} tokens",
            a.shape.d_model, a.shape.layers
        ),
        timing,
        rate: Some(Rate::new("tokens_per_s", "tokens/s", new as f64)),
        fields: merge(
            &fields,
            json!({"mode": "decode", "d_model": a.shape.d_model, "layers": a.shape.layers,
                   "new_tokens": new, "params": model.num_params()}),
        ),
    })?;
    let share = mask_per_token / step;
    match p.is_json() {
        true => p.line(
            &json!({"bench": "grammar", "mode": "share", "mask_per_token_s": mask_per_token,
                               "decode_step_s": step, "mask_share_of_step": share})
            .to_string(),
        )?,
        false => p.line(&format!(
            "the mask costs {:.3} ms a token, {:.1}% of a {:.2} ms decoding step",
            mask_per_token * 1e3,
            share * 100.0,
            step * 1e3
        ))?,
    }
    Ok(())
}
