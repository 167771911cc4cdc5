//! `qkv train`: the library's run (`qkv::train::run`) behind flags, a progress bar and a
//! summary. Three ways to start and one to continue:
//! ```text
//! qkv train --init HF_DIR --data BATCHES.safetensors --steps N --lr LR [--constant-lr] --out DIR
//! qkv train --task copy|reverse|sort|recall|long_range|first [--arch ARCH] [model options] --out DIR
//! qkv train --text FILE [--arch ARCH] [model options] --out DIR   (byte-level language model)
//! qkv train --resume DIR                                (continues exactly)
//! ```

mod progress;

use std::path::PathBuf;

use anyhow::Result;
use qkv::train::run::{
    DecayChoice, FfnChoice, Network, NormChoice, PositionChoice, RunRequest, Style,
};
use qkv::weights::DType;

use progress::Progress;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Start from this model folder: any supported family, or one qkv saved (needs --data)
    #[arg(long, value_name = "DIR", help_heading = "Data")]
    init: Option<PathBuf>,
    /// Batches for --init: int64 `input_ids`, `targets` [steps, B, T], optional
    /// `attention_mask`; encoder-decoders: `input_ids` [steps, B, S] and
    /// `decoder_input_ids` [steps, B, T]. Step s uses batch s
    #[arg(long, value_name = "BATCHES.safetensors", help_heading = "Data")]
    data: Option<PathBuf>,
    /// A built-in task: copy, reverse, sort, recall, long_range, first
    #[arg(long, value_name = "NAME", help_heading = "Data")]
    task: Option<String>,
    /// Byte-level language modelling on this file (last --val-fraction held out)
    #[arg(long, value_name = "FILE", help_heading = "Data")]
    text: Option<PathBuf>,
    /// Continue the run checkpointed in DIR exactly where it stopped
    #[arg(long, value_name = "DIR", help_heading = "Data")]
    resume: Option<PathBuf>,
    /// Task: source length (pairs for recall, T for long_range)
    #[arg(long, help_heading = "Data")]
    task_length: Option<usize>,
    /// Task: number of symbols
    #[arg(long, help_heading = "Data")]
    symbols: Option<usize>,
    /// Task recall: queries per example
    #[arg(long, help_heading = "Data")]
    queries: Option<usize>,
    /// Task long_range: distance between a token and its repeat
    #[arg(long, help_heading = "Data")]
    distance: Option<usize>,
    /// Text: model input length T [default: 64]
    #[arg(long, help_heading = "Data")]
    seq_len: Option<usize>,
    /// Text: fraction of the file held out for evaluation [default: 0.1]
    #[arg(long, help_heading = "Data")]
    val_fraction: Option<f64>,
    /// Sequences per batch [default: 32]
    #[arg(long, help_heading = "Data")]
    batch_size: Option<usize>,

    /// transformer (a decoder), or a recurrent model it replaced: rnn (Elman LM),
    /// rnn-seq2seq (the 2014 encoder-decoder: context = the encoder's final state),
    /// rnn-attention (with Bahdanau's attention), reading a task's source up to its
    /// separator [default: transformer]
    #[arg(long, value_name = "NETWORK", help_heading = "Model")]
    arch: Option<Network>,
    /// Architecture preset of a Transformer, the options below overriding parts of it:
    /// gpt2 (learned positions, pre-norm LayerNorm, GELU MLP, tied head; saved as
    /// GPT-2) or llama (RoPE, pre-norm RMSNorm, SwiGLU, untied head; saved as Llama)
    #[arg(long, help_heading = "Model")]
    style: Option<Style>,
    /// Model width C [default: 64]
    #[arg(long, help_heading = "Model")]
    d_model: Option<usize>,
    /// Number of layers [default: 2]
    #[arg(long, help_heading = "Model")]
    layers: Option<usize>,
    /// Attention heads H [default: 4]
    #[arg(long, help_heading = "Model")]
    heads: Option<usize>,
    /// Key/value heads G (dividing H) [default: H]
    #[arg(long, help_heading = "Model")]
    kv_heads: Option<usize>,
    /// FFN width F [default: the style's]
    #[arg(long, help_heading = "Model")]
    ffn: Option<usize>,
    /// Position encoding: none, sinusoidal, learned, rope or alibi [default: the style's]
    #[arg(long, help_heading = "Model")]
    position: Option<PositionChoice>,
    /// Normalisation layer: layernorm or rmsnorm [default: the style's]
    #[arg(long, help_heading = "Model")]
    norm: Option<NormChoice>,
    /// Normalise after each residual addition (the original Transformer) instead of before
    #[arg(long, help_heading = "Model")]
    post_norm: bool,
    /// FFN activation: relu, gelu (exact), gelu-tanh (GPT-2's), swiglu [default: style's]
    #[arg(long, help_heading = "Model")]
    ffn_kind: Option<FfnChoice>,

    /// Number of steps (updates) [default: 1000]
    #[arg(long, help_heading = "Optimisation")]
    steps: Option<u64>,
    /// Peak learning rate [default: 1e-3]
    #[arg(long, help_heading = "Optimisation")]
    lr: Option<f64>,
    /// Keep the learning rate constant (no warm-up, no cosine decay)
    #[arg(long, help_heading = "Optimisation")]
    constant_lr: bool,
    /// Linear warm-up steps before the cosine decay [default: 0]
    #[arg(long, help_heading = "Optimisation")]
    warmup: Option<u64>,
    /// Learning rate at the end of the cosine decay [default: 0]
    #[arg(long, help_heading = "Optimisation")]
    min_lr: Option<f64>,
    /// AdamW weight decay [default: 0.01]
    #[arg(long, help_heading = "Optimisation")]
    weight_decay: Option<f64>,
    /// AdamW β₁ [default: 0.9]
    #[arg(long, help_heading = "Optimisation")]
    beta1: Option<f64>,
    /// AdamW β₂ [default: 0.999]
    #[arg(long, help_heading = "Optimisation")]
    beta2: Option<f64>,
    /// AdamW epsilon [default: 1e-8]
    #[arg(long, help_heading = "Optimisation")]
    eps: Option<f64>,
    /// Which parameters decay: standard (matrices only), all, or none [default: all with
    /// --init (as torch.optim.AdamW), else standard]
    #[arg(long, help_heading = "Optimisation")]
    decay: Option<DecayChoice>,
    /// Clip the global gradient norm to this value (no clipping without it)
    #[arg(long, help_heading = "Optimisation")]
    clip: Option<f64>,
    /// What the products compute in: f32, or bf16 (mixed precision: every linear
    /// layer's products forward and backward in bf16, summed in f32, with f32 master
    /// weights, gradients and AdamW) [default: f32]
    #[arg(long, help_heading = "Optimisation", value_parser = super::shared_flags::parse_dtype)]
    dtype: Option<DType>,
    /// Seed of the initial weights and of the data [default: 0]
    #[arg(long, help_heading = "Optimisation")]
    seed: Option<u64>,
    /// Threads (results are reproducible for a given seed and thread count) [default: all cores]
    #[arg(long, help_heading = "Optimisation")]
    threads: Option<usize>,

    /// Evaluate on held-out batches every this many steps (and after the last) [default: 100]
    #[arg(long, help_heading = "Output")]
    eval_every: Option<u64>,
    /// Held-out batches per evaluation [default: 8]
    #[arg(long, help_heading = "Output")]
    eval_batches: Option<u64>,
    /// Checkpoint every this many steps (and at the end) [default: only at the end]
    #[arg(long, help_heading = "Output")]
    save_every: Option<u64>,
    /// Stop after this many steps, with a checkpoint, as if interrupted (--resume continues)
    #[arg(long, help_heading = "Output")]
    stop_after: Option<u64>,
    /// Checkpoint folder: a model folder + optimiser and trainer state [default with
    /// --resume: the resumed folder]
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    out: Option<PathBuf>,
    /// Write into a non-empty --out that is not a training checkpoint, replacing its
    /// model and tokenizer files
    #[arg(long, help_heading = "Output")]
    overwrite: bool,
    /// One JSON object per step: step, loss (before the update), lr, grad_norm, eval_loss /
    /// eval_accuracy when evaluated [default with --resume: the resumed run's, continued]
    #[arg(long, value_name = "LOG.jsonl", help_heading = "Output")]
    log_json: Option<PathBuf>,
    /// No progress bar, no evaluation lines, no summary
    #[arg(long, help_heading = "Output")]
    quiet: bool,
    /// Benchmark: print training tokens/s as JSON, timing the steps after the first N
    #[arg(long, hide = true)]
    bench_warmup: Option<u64>,
}

impl TrainArgs {
    /// The flags as the library's request: the same names, in snake case.
    fn request(&self) -> RunRequest {
        macro_rules! same {
            ($($field:ident),+ $(,)?) => {
                RunRequest { $($field: self.$field.clone()),+ }
            };
        }
        same! {
            init, data, task, text, resume, task_length, symbols, queries, distance,
            seq_len, val_fraction, batch_size, arch, style, d_model, layers, heads,
            kv_heads, ffn, position, norm, post_norm, ffn_kind, steps, lr, constant_lr,
            warmup, min_lr, weight_decay, beta1, beta2, eps, decay, clip, dtype, seed, threads,
            eval_every, eval_batches, save_every, stop_after, out, overwrite, log_json,
        }
    }
}

pub fn run(args: &TrainArgs) -> Result<()> {
    if let Some(p) = &args.log_json {
        super::writable::check_writable("--log-json", p)?;
    }
    let mut p = Progress::new(args.quiet, args.bench_warmup);
    let summary = qkv::train::run::run(&args.request(), &mut p)
        .map_err(super::flags::in_flags::<TrainArgs>)?;
    p.finish(&summary);
    Ok(())
}
