//! `qkv convert`: a model folder written as a GGUF file llama.cpp loads.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use qkv::io::gguf::GgmlType;
use qkv::weights::DType;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Model folder: a Hugging Face Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3
    /// or Phi-3 folder, or one `qkv train` wrote in Llama's layout (or a GGUF file of such
    /// a model, its blocks widened, its vocabulary and chat template kept)
    model: PathBuf,
    /// The GGUF file to write
    #[arg(long)]
    to: PathBuf,
    /// Type of the weights (matrices): f32, f16, bf16, q8_0 or q4_0 (norms and biases
    /// stay f32; with q4_0 the token table and the head are q8_0, as llama.cpp's
    /// quantizer keeps them)
    #[arg(long, default_value = "f16", value_parser = parse_type)]
    dtype: GgmlType,
}

fn parse_type(s: &str) -> std::result::Result<GgmlType, String> {
    match s {
        "f32" | "f16" | "bf16" | "q8_0" | "q4_0" => {
            Ok(GgmlType::from_name(&s.to_uppercase()).expect("a ggml type"))
        }
        _ => Err(format!("`{s}`: one of f32, f16, bf16, q8_0, q4_0")),
    }
}

pub fn run(args: &ConvertArgs, out: &mut impl Write) -> Result<()> {
    if args.to.extension().is_none_or(|e| e != "gguf") {
        bail!(
            "--to {}: give a file name ending in .gguf",
            args.to.display()
        );
    }
    let mut loaded = super::load::load_model(&args.model, DType::F32)?;
    // a GGUF file's blocks widened: any model qkv reads converts
    loaded.model.unpack_weights();
    let vocab = qkv::text::folder_gguf_metadata(&args.model, loaded.model.arch.vocab)
        .with_context(|| format!("reading the tokenizer of {}", args.model.display()))?;
    let warn = vocab.is_none();
    let name = args
        .model
        .file_name()
        .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let notes = qkv::models::save_gguf(
        &loaded.model,
        &args.to,
        args.dtype,
        &name,
        vocab.unwrap_or_default(),
    )
    .with_context(|| format!("writing {}", args.to.display()))?;
    for note in notes {
        eprintln!("note: {note}");
    }
    if warn {
        eprintln!(
            "warning: {} has no tokenizer.json (or, a GGUF file, no vocabulary): {} has no vocabulary, which llama.cpp needs to load it",
            args.model.display(),
            args.to.display()
        );
    }
    let bytes = std::fs::metadata(&args.to)?.len();
    writeln!(
        out,
        "{}: {} weights in {}, {bytes} bytes",
        args.to.display(),
        loaded.model.num_params(),
        args.dtype,
    )?;
    Ok(())
}
