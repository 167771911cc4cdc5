//! The `qkv` command: thin subcommands over the qkv library.

mod alloc;
mod cmd;
mod counting;
mod demo;
mod maps;
mod report;
#[cfg(feature = "serve")]
mod serve;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

#[derive(Parser)]
#[command(
    name = "qkv",
    version,
    about = "The Transformer's attention mechanism, shown and run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Deterministic experiments behind the articles' claims: a soft lookup, word order, √d_k scaling
    Demo(demo::DemoArgs),
    /// Run a batch through a checkpoint: input ids in, logits (or hidden states) out
    Forward(cmd::forward::ForwardArgs),
    /// Continue a prompt, or transform a source sentence, greedily or by sampling
    Generate(cmd::generate::GenerateArgs),
    /// Attention maps of a checkpoint on a text: a heatmap (.svg, .png), an offline viewer (.html) or JSON
    Attention(Box<cmd::attention::AttentionArgs>),
    /// Sentence embeddings following the folder's sentence-transformers files
    Embed(cmd::embed::EmbedArgs),
    /// Labels and scores of a sequence classifier (or cross-encoder) for texts or text pairs
    Classify(cmd::classify::ClassifyArgs),
    /// Describe a checkpoint: family, sizes, position encoding, norm, FFN, parameters
    Inspect(cmd::inspect::InspectArgs),
    /// Write a model folder as a GGUF file (f32, f16, bf16, q8_0, q4_0) that llama.cpp loads
    Convert(cmd::convert::ConvertArgs),
    /// Train a decoder: from a Hugging Face folder on given batches, or a new model on a task or a text file
    Train(Box<cmd::train::TrainArgs>),
    /// Measure one of the articles' claims: numbers, SVG figures and a verdict
    Experiment(cmd::experiment::ExperimentArgs),
    /// An OpenAI-compatible HTTP server: completions, chat, embeddings, with continuous batching
    #[cfg(feature = "serve")]
    Serve(Box<serve::ServeArgs>),
    /// Time qkv on attention, decoding, MiniLM, Llama and matrix-product workloads (bench/compare_torch.py: against PyTorch)
    Bench(cmd::bench::BenchArgs),
    /// Chat-template renders for `serve` and `generate`, one JSON line a request, in a
    /// process of their own (qkv::text::chat_process)
    #[command(hide = true)]
    RenderTemplates,
}

fn main() -> ExitCode {
    alloc::keep_freed_memory();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` puts the whole context chain on one line: "what: why".
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match &cli.command {
        Command::Demo(args) => demo::run(args, &mut out)?,
        Command::Forward(args) => cmd::forward::run(args)?,
        Command::Generate(args) => cmd::generate::run(args, &mut out)?,
        Command::Attention(args) => cmd::attention::run(args)?,
        Command::Embed(args) => cmd::embed::run(args, &mut out)?,
        Command::Classify(args) => cmd::classify::run(args, &mut out)?,
        Command::Inspect(args) => cmd::inspect::run(args, &mut out)?,
        Command::Convert(args) => cmd::convert::run(args, &mut out)?,
        Command::Train(args) => cmd::train::run(args)?,
        Command::Bench(args) => cmd::bench::run(args, &mut out)?,
        #[cfg(feature = "serve")]
        Command::Serve(args) => serve::run(args)?,
        Command::Experiment(args) => cmd::experiment::run(args, &mut out)?,
        Command::RenderTemplates => {
            qkv::text::chat_process::serve_renders(io::stdin().lock(), &mut out)?
        }
    }
    out.flush()?;
    Ok(())
}
