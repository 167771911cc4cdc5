//! `qkv train`: train a model, with a progress bar, periodic evaluation,
//! a JSON log and resumable checkpoints.
//!
//! Three ways to start and one to continue:
//!
//! ```text
//! qkv train --init HF_DIR --data BATCHES.safetensors --steps N --lr LR [--constant-lr] --out DIR
//! qkv train --task copy|reverse|sort|recall|long_range|first [--arch ARCH] [model options] --out DIR
//! qkv train --text FILE [--arch ARCH] [model options] --out DIR   (byte-level language model)
//! qkv train --resume DIR                                (continues exactly)
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use qkv::block::Residual;
use qkv::layers::NormKind;
use qkv::models::arch::NormSpec;
use qkv::models::{Arch, Position as ArchPosition, Transformer};
use qkv::ops::Activation;
use qkv::position::SinusoidalLayout;
use qkv::train::recurrent::{RecurrentKind, RecurrentModel, RecurrentSpec};
use qkv::train::tasks::{Task, TaskOptions};
use qkv::train::text_data::TextData;
use qkv::train::trainable::TrainableModel;
use qkv::train::trainer::{
    BatchSource, DecayParams, FixedBatches, RunOptions, StepLog, TaskBatches, TextBatches,
    TrainConfig, Trainer,
};
use qkv::train::{checkpoint, memory, output};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Style {
    /// Learned positions, pre-norm LayerNorm, GELU MLP, tied head (saved as GPT-2)
    Gpt2,
    /// RoPE, pre-norm RMSNorm, SwiGLU, untied head (saved as Llama)
    Llama,
}

/// `--arch`: the model family of a new model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ArchKind {
    /// A Transformer decoder (--style and the options after it)
    Transformer,
    /// An Elman RNN language model
    Rnn,
    /// The 2014 RNN encoder-decoder without attention
    RnnSeq2seq,
    /// The RNN encoder-decoder with additive (Bahdanau) attention
    RnnAttention,
}

/// The model being trained: a Transformer (any family) or a recurrent model.
enum Model {
    Transformer(Box<Transformer>),
    Recurrent(Box<RecurrentModel>),
}

impl Model {
    fn trainable(&mut self) -> &mut dyn TrainableModel {
        match self {
            Model::Transformer(m) => m.as_mut(),
            Model::Recurrent(m) => m.as_mut(),
        }
    }

    /// The vocabulary and the position limit (None: unlimited) batches must fit.
    fn limits(&self) -> (usize, Option<usize>) {
        match self {
            Model::Transformer(m) => (m.arch.vocab, m.arch.max_positions()),
            Model::Recurrent(m) => (m.spec().vocab, None),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Position {
    None,
    Sinusoidal,
    Learned,
    Rope,
    Alibi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Norm {
    Layernorm,
    Rmsnorm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Ffn {
    Relu,
    /// exact (erf) GELU
    Gelu,
    /// GPT-2's tanh approximation
    GeluTanh,
    Swiglu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Decay {
    /// matrices only: not norms, biases or embeddings
    Standard,
    /// every parameter, as torch.optim.AdamW(model.parameters())
    All,
    /// no parameter
    None,
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    // ---- what to train on -------------------------------------------------------
    /// Start from this model folder: any supported family, or one qkv saved (needs --data)
    #[arg(long, value_name = "DIR", help_heading = "Data")]
    init: Option<PathBuf>,
    /// Batches for --init: int64 `input_ids` and `targets` [steps, B, T], optional
    /// `attention_mask`; encoder-decoders: `input_ids` is the source [steps, B, S] and
    /// `decoder_input_ids` [steps, B, T] the decoder's inputs. Step s uses batch s
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

    // ---- model (--task / --text) ------------------------------------------------
    /// Model family: a Transformer decoder, or one of the recurrent models it replaced
    /// (rnn: an Elman language model; rnn-seq2seq: the 2014 encoder-decoder, whose
    /// context is the encoder's final state; rnn-attention: the same with Bahdanau's
    /// additive attention). The encoder-decoders read a task's source, up to its
    /// separator. [default: transformer]
    #[arg(long, value_enum, help_heading = "Model")]
    arch: Option<ArchKind>,
    /// Architecture preset of a Transformer; the options below override parts of it
    #[arg(long, value_enum, help_heading = "Model")]
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
    /// Position encoding [default: the style's]
    #[arg(long, value_enum, help_heading = "Model")]
    position: Option<Position>,
    /// Normalisation layer [default: the style's]
    #[arg(long, value_enum, help_heading = "Model")]
    norm: Option<Norm>,
    /// Normalise after each residual addition (the original Transformer) instead of before
    #[arg(long, help_heading = "Model")]
    post_norm: bool,
    /// FFN activation [default: the style's]
    #[arg(long, value_enum, help_heading = "Model")]
    ffn_kind: Option<Ffn>,

    // ---- optimisation -----------------------------------------------------------
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
    /// Which parameters decay [default: all with --init (as torch.optim.AdamW), else standard]
    #[arg(long, value_enum, help_heading = "Optimisation")]
    decay: Option<Decay>,
    /// Clip the global gradient norm to this value (no clipping without it)
    #[arg(long, help_heading = "Optimisation")]
    clip: Option<f64>,
    /// Seed of the initial weights and of the data [default: 0]
    #[arg(long, help_heading = "Optimisation")]
    seed: Option<u64>,
    /// Threads (results are reproducible for a given seed and thread count) [default: all cores]
    #[arg(long, help_heading = "Optimisation")]
    threads: Option<usize>,

    // ---- evaluation, output -----------------------------------------------------
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
    /// Checkpoint folder: a model folder (config.json, model.safetensors) + optimiser and
    /// trainer state [default with --resume: the resumed folder]
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    out: Option<PathBuf>,
    /// Write into a non-empty --out that is not a training checkpoint, replacing its
    /// model and tokenizer files (without it such a folder is refused)
    #[arg(long, help_heading = "Output")]
    overwrite: bool,
    /// Write one JSON object per step: step, loss (before the update), lr, grad_norm,
    /// and eval_loss / eval_accuracy on evaluation steps [default with --resume: the
    /// resumed run's log, continued]
    #[arg(long, value_name = "LOG.jsonl", help_heading = "Output")]
    log_json: Option<PathBuf>,
    /// No progress bar, no evaluation lines, no summary
    #[arg(long, help_heading = "Output")]
    quiet: bool,
    /// Benchmark: print training tokens/s as JSON, timing the steps after the first N
    #[arg(long, hide = true)]
    bench_warmup: Option<u64>,
}

const TASK_DEFAULT_BATCH: usize = 32;
const TEXT_DEFAULT_SEQ_LEN: usize = 64;
const TEXT_DEFAULT_VAL_FRACTION: f64 = 0.1;
const DEFAULT_EVAL_EVERY: u64 = 100;

/// Where the batches come from: stored in the checkpoint so `--resume` rebuilds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Source {
    Init {
        init: PathBuf,
        data: PathBuf,
    },
    Task {
        name: String,
        length: Option<usize>,
        symbols: Option<usize>,
        queries: Option<usize>,
        distance: Option<usize>,
        batch_size: usize,
    },
    Text {
        path: PathBuf,
        seq_len: usize,
        val_fraction: f64,
        batch_size: usize,
    },
}

/// The caller's part of a checkpoint's configuration (`config.run`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RunSpec {
    source: Source,
    /// Threads of the run (None: rayon's default, all cores).
    threads: Option<usize>,
    /// The JSON log, which a resumed run continues unless given another.
    log_json: Option<PathBuf>,
}

/// A source's batches and, for tasks and text, the (vocabulary, length) a new model needs.
type OpenedSource = (Box<dyn BatchSource>, Option<(usize, usize)>);

impl Source {
    /// The batch source and, for tasks and text, the vocabulary and length a new model
    /// needs.
    fn open(&self) -> Result<OpenedSource> {
        Ok(match self {
            Source::Init { data, .. } => (
                Box::new(
                    FixedBatches::open(data)
                        .with_context(|| format!("reading --data {}", data.display()))?,
                ),
                None,
            ),
            Source::Task {
                name,
                length,
                symbols,
                queries,
                distance,
                batch_size,
            } => {
                let task = Task::from_name(
                    name,
                    &TaskOptions {
                        length: *length,
                        symbols: *symbols,
                        queries: *queries,
                        distance: *distance,
                    },
                )?;
                let shape = (task.vocab_size(), task.seq_len());
                (
                    Box::new(TaskBatches {
                        task,
                        batch_size: *batch_size,
                    }),
                    Some(shape),
                )
            }
            Source::Text {
                path,
                seq_len,
                val_fraction,
                batch_size,
            } => {
                let data = TextData::open(path, *seq_len, *val_fraction)?;
                let shape = (data.vocab_size(), data.seq_len());
                (
                    Box::new(TextBatches {
                        data,
                        batch_size: *batch_size,
                    }),
                    Some(shape),
                )
            }
        })
    }
}

/// Names of the options given, from a list of (name, given).
fn given(options: &[(&'static str, bool)]) -> Vec<&'static str> {
    options
        .iter()
        .filter(|(_, g)| *g)
        .map(|(n, _)| *n)
        .collect()
}

impl TrainArgs {
    fn model_options(&self) -> Vec<&'static str> {
        given(&[
            ("--arch", self.arch.is_some()),
            ("--style", self.style.is_some()),
            ("--d-model", self.d_model.is_some()),
            ("--layers", self.layers.is_some()),
            ("--heads", self.heads.is_some()),
            ("--kv-heads", self.kv_heads.is_some()),
            ("--ffn", self.ffn.is_some()),
            ("--position", self.position.is_some()),
            ("--norm", self.norm.is_some()),
            ("--post-norm", self.post_norm),
            ("--ffn-kind", self.ffn_kind.is_some()),
            ("--seed", self.seed.is_some()),
        ])
    }

    fn data_options(&self) -> Vec<&'static str> {
        given(&[
            ("--task-length", self.task_length.is_some()),
            ("--symbols", self.symbols.is_some()),
            ("--queries", self.queries.is_some()),
            ("--distance", self.distance.is_some()),
            ("--seq-len", self.seq_len.is_some()),
            ("--val-fraction", self.val_fraction.is_some()),
            ("--batch-size", self.batch_size.is_some()),
        ])
    }

    fn optimiser_options(&self) -> Vec<&'static str> {
        given(&[
            ("--lr", self.lr.is_some()),
            ("--constant-lr", self.constant_lr),
            ("--warmup", self.warmup.is_some()),
            ("--min-lr", self.min_lr.is_some()),
            ("--weight-decay", self.weight_decay.is_some()),
            ("--beta1", self.beta1.is_some()),
            ("--beta2", self.beta2.is_some()),
            ("--eps", self.eps.is_some()),
            ("--decay", self.decay.is_some()),
            ("--clip", self.clip.is_some()),
            ("--eval-every", self.eval_every.is_some()),
            ("--eval-batches", self.eval_batches.is_some()),
            ("--save-every", self.save_every.is_some()),
        ])
    }

    /// Rejects combinations that cannot mean anything, with one line naming them.
    fn check_combinations(&self) -> Result<()> {
        let starts = given(&[
            ("--init", self.init.is_some()),
            ("--task", self.task.is_some()),
            ("--text", self.text.is_some()),
            ("--resume", self.resume.is_some()),
        ]);
        match starts.as_slice() {
            [] => bail!("say what to train on: --init DIR --data BATCHES, --task NAME, --text FILE, or --resume DIR"),
            [_] => {}
            [a, b, ..] => bail!("{a} and {b} cannot be used together: give one of --init, --task, --text, --resume"),
        }
        if self.stop_after == Some(0) {
            bail!("--stop-after 0 would train no step: give at least 1");
        }
        if self.data.is_some() && self.init.is_none() && self.resume.is_none() {
            bail!("--data holds batches for --init (a Hugging Face model folder to start from); give --init DIR too");
        }
        if self.init.is_some() {
            if self.data.is_none() {
                bail!("--init needs --data BATCHES.safetensors (int64 input_ids and targets [steps, B, T])");
            }
            if let [opt, ..] = self.model_options().as_slice() {
                bail!(
                    "{opt} cannot be used with --init: the model is the one in the --init folder"
                );
            }
            if let [opt, ..] = self.data_options().as_slice() {
                bail!("{opt} cannot be used with --init: the batches come from --data");
            }
        }
        if self.resume.is_some() {
            let mut fixed = self.model_options();
            fixed.extend(self.data_options());
            fixed.extend(self.optimiser_options());
            if let [opt, ..] = fixed.as_slice() {
                bail!(
                    "{opt} cannot be used with --resume: a resumed run keeps the model, data and \
                     optimiser options of its checkpoint (only --steps, --data, --out, --log-json, \
                     --threads, --stop-after and --quiet may be given)"
                );
            }
        } else if self.out.is_none() {
            bail!("give --out DIR: the folder the checkpoints are written to");
        }
        if self.task.is_none() && self.resume.is_none() {
            for (opt, g) in [
                ("--task-length", self.task_length.is_some()),
                ("--symbols", self.symbols.is_some()),
                ("--queries", self.queries.is_some()),
                ("--distance", self.distance.is_some()),
            ] {
                if g {
                    bail!("{opt} is an option of --task");
                }
            }
        }
        if self.text.is_none() && self.resume.is_none() {
            for (opt, g) in [
                ("--seq-len", self.seq_len.is_some()),
                ("--val-fraction", self.val_fraction.is_some()),
            ] {
                if g {
                    bail!(
                        "{opt} is an option of --text{}",
                        if self.task.is_some() {
                            " (a task fixes its own length: see --task-length)"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        if self.arch.is_some_and(|a| a != ArchKind::Transformer) {
            let transformer_only = given(&[
                ("--style", self.style.is_some()),
                ("--heads", self.heads.is_some()),
                ("--kv-heads", self.kv_heads.is_some()),
                ("--ffn", self.ffn.is_some()),
                ("--position", self.position.is_some()),
                ("--norm", self.norm.is_some()),
                ("--post-norm", self.post_norm),
                ("--ffn-kind", self.ffn_kind.is_some()),
            ]);
            if let [opt, ..] = transformer_only.as_slice() {
                bail!("{opt} is an option of --arch transformer; a recurrent model takes --d-model (its embedding and state width) and --layers");
            }
        }
        Ok(())
    }

    /// A new recurrent model for `vocab` tokens: width --d-model (embedding, state and
    /// attention), --layers Elman layers; the encoder-decoders split rows at the task's
    /// separator.
    fn recurrent(&self, kind: RecurrentKind, vocab: usize, seed: u64) -> Result<Model> {
        let width = self.d_model.unwrap_or(64);
        let separator = match &self.task {
            Some(name) => Task::from_name(
                name,
                &TaskOptions {
                    length: self.task_length,
                    symbols: self.symbols,
                    queries: self.queries,
                    distance: self.distance,
                },
            )?
            .separator(),
            None => None,
        };
        let spec = RecurrentSpec {
            kind,
            vocab,
            embedding: width,
            hidden: width,
            layers: self.layers.unwrap_or(1),
            attention_width: width,
            separator,
        };
        let model = RecurrentModel::new(&spec, seed).context("model options")?;
        Ok(Model::Recurrent(Box::new(model)))
    }

    fn train_config(&self) -> TrainConfig {
        let d = TrainConfig::default();
        let init = self.init.is_some();
        TrainConfig {
            steps: self.steps.unwrap_or(d.steps),
            lr: self.lr.unwrap_or(d.lr),
            constant_lr: self.constant_lr,
            warmup: self.warmup.unwrap_or(d.warmup),
            min_lr: self.min_lr.unwrap_or(d.min_lr),
            weight_decay: self.weight_decay.unwrap_or(d.weight_decay),
            beta1: self.beta1.unwrap_or(d.beta1),
            beta2: self.beta2.unwrap_or(d.beta2),
            eps: self.eps.unwrap_or(d.eps),
            decay: match self.decay {
                Some(Decay::Standard) => DecayParams::Standard,
                Some(Decay::All) => DecayParams::All,
                Some(Decay::None) => DecayParams::None,
                // The --data contract reproduces torch.optim.AdamW(model.parameters()).
                None if init => DecayParams::All,
                None => DecayParams::Standard,
            },
            clip: self.clip,
            eval_every: self.eval_every.unwrap_or(DEFAULT_EVAL_EVERY),
            eval_batches: self.eval_batches.unwrap_or(d.eval_batches),
            save_every: self.save_every.unwrap_or(0),
            seed: self.seed.unwrap_or(d.seed),
        }
    }

    fn source(&self) -> Source {
        let batch_size = self.batch_size.unwrap_or(TASK_DEFAULT_BATCH);
        if let (Some(init), Some(data)) = (&self.init, &self.data) {
            Source::Init {
                init: init.clone(),
                data: data.clone(),
            }
        } else if let Some(name) = &self.task {
            Source::Task {
                name: name.clone(),
                length: self.task_length,
                symbols: self.symbols,
                queries: self.queries,
                distance: self.distance,
                batch_size,
            }
        } else {
            Source::Text {
                path: self.text.clone().expect("checked: one source is given"),
                seq_len: self.seq_len.unwrap_or(TEXT_DEFAULT_SEQ_LEN),
                val_fraction: self.val_fraction.unwrap_or(TEXT_DEFAULT_VAL_FRACTION),
                batch_size,
            }
        }
    }

    /// The architecture of a new model for `vocab` tokens and sequences of `len`.
    fn arch(&self, vocab: usize, len: usize) -> Result<Arch> {
        let style = self.style.unwrap_or(Style::Gpt2);
        let d_model = self.d_model.unwrap_or(64);
        let layers = self.layers.unwrap_or(2);
        let heads = self.heads.unwrap_or(4);
        if heads == 0 || !d_model.is_multiple_of(heads) {
            bail!(
                "model options: invalid `n_heads`: {heads} heads do not divide d_model = {d_model}"
            );
        }
        let mut a = match style {
            Style::Gpt2 => Arch::gpt2(vocab, d_model, layers, heads, len),
            Style::Llama => Arch::llama(vocab, d_model, layers, heads, heads, len),
        };
        let mut stack = a.stack();
        stack.kv_heads = self.kv_heads.unwrap_or(heads);
        if let Some(kind) = self.ffn_kind {
            (a.ffn.activation, a.ffn.gated) = match kind {
                Ffn::Relu => (Activation::Relu, false),
                Ffn::Gelu => (Activation::Gelu, false),
                Ffn::GeluTanh => (Activation::GeluTanh, false),
                Ffn::Swiglu => (Activation::Silu, true),
            };
            if self.ffn.is_none() && a.ffn.gated != (style == Style::Llama) {
                // keep the parameter count of the style's FFN: 3 matrices of 8C/3 ≈ 2 of 4C
                stack.ffn_dim = if a.ffn.gated {
                    (8 * d_model).div_ceil(3).div_ceil(8) * 8
                } else {
                    4 * d_model
                };
            }
        }
        if let Some(f) = self.ffn {
            stack.ffn_dim = f;
        }
        a.decoder = Some(stack);
        if let Some(p) = self.position {
            a.position = match p {
                Position::None => ArchPosition::None,
                Position::Sinusoidal => ArchPosition::Sinusoidal {
                    max_len: len,
                    layout: SinusoidalLayout::Interleaved,
                },
                Position::Learned => ArchPosition::Learned { max_len: len },
                Position::Rope => ArchPosition::Rope {
                    theta: 10_000.0,
                    scaling: qkv::position::RopeScaling::None,
                    max_len: Some(len),
                },
                Position::Alibi => ArchPosition::Alibi,
            };
        }
        if let Some(n) = self.norm {
            // a LayerNorm has a bias exactly when the projections do
            a.norm = match n {
                Norm::Layernorm => NormSpec {
                    kind: NormKind::LayerNorm,
                    eps: 1e-5,
                    bias: a.attention.qkv_bias,
                },
                Norm::Rmsnorm => NormSpec {
                    kind: NormKind::RmsNorm,
                    eps: 1e-6,
                    bias: false,
                },
            };
        }
        if self.post_norm {
            a.residual = Residual::PostNorm;
        }
        a.validate().context("model options")?;
        Ok(a)
    }
}

/// Files of a Hugging Face folder that describe tokens rather than weights: copied from
/// --init into the output so that `qkv generate --prompt` works on it.
const TOKENIZER_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
];

fn copy_tokenizer_files(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for name in TOKENIZER_FILES {
        let src = from.join(name);
        let dst = to.join(name);
        if src.is_file() && !dst.exists() {
            let bytes =
                std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
            qkv::io::write_atomic(&dst, &bytes)?;
        }
    }
    Ok(())
}

fn write_byte_tokenizer(out: &Path, max_positions: Option<usize>) -> Result<()> {
    use qkv::text::bytes::{byte_tokenizer_config, byte_tokenizer_json};
    qkv::io::write_atomic(
        &out.join("tokenizer.json"),
        byte_tokenizer_json().as_bytes(),
    )?;
    qkv::io::write_atomic(
        &out.join("tokenizer_config.json"),
        byte_tokenizer_config(max_positions).as_bytes(),
    )?;
    Ok(())
}

/// The JSON log: on a fresh run it starts empty; on a resumed one it keeps the lines
/// of the steps before the checkpoint (dropping any a crash logged after it), so the
/// finished log equals an uninterrupted run's.
fn open_log(path: &Path, start_step: u64) -> Result<File> {
    let mut kept = Vec::new();
    if start_step > 0 && path.is_file() {
        let file = File::open(path).with_context(|| format!("reading {}", path.display()))?;
        for line in BufReader::new(file).lines() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            let step = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
            if step.is_some_and(|s| s < start_step) {
                kept.extend_from_slice(line.as_bytes());
                kept.push(b'\n');
            }
        }
    }
    qkv::io::write_atomic(path, &kept)?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

fn progress_bar(steps: u64, done: u64, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:20.cyan/blue} step {pos}/{len} {msg} ETA {eta}")
            .expect("valid template")
            .progress_chars("█▉▊▋▌▍▎▏ "),
    );
    bar.set_position(done);
    bar.reset_eta();
    bar
}

fn eval_line(log: &StepLog) -> Option<String> {
    let (loss, acc) = (log.eval_loss?, log.eval_accuracy?);
    Some(format!(
        "after {} steps: eval loss {loss:.4}, token accuracy {:.2}%",
        log.step + 1,
        acc * 100.0
    ))
}

pub fn run(args: &TrainArgs) -> Result<()> {
    args.check_combinations()?;

    // ---- the run: fresh or resumed ----------------------------------------------
    // the folder resumed from is locked before it is read (opening it may complete a
    // save a crash interrupted) and stays locked for the run
    let mut locks = Vec::new();
    let (spec, state, out) = match &args.resume {
        Some(dir) => {
            if checkpoint::exists(dir) {
                locks.push(
                    output::Lock::acquire(dir)
                        .with_context(|| format!("--resume {}", dir.display()))?,
                );
            }
            let state = checkpoint::open(dir)
                .with_context(|| format!("resuming from {}", dir.display()))?;
            let mut spec: RunSpec = serde_json::from_value(state.config["run"].clone())
                .map_err(|e| anyhow!("{}: not a checkpoint of `qkv train` ({e})", dir.display()))?;
            if let Some(data) = &args.data {
                match &mut spec.source {
                    Source::Init { data: d, .. } => *d = data.clone(),
                    _ => bail!("--data with --resume replaces the batches file of an --init run; {} is not one", dir.display()),
                }
            }
            if let Some(t) = args.threads {
                if spec.threads != Some(t) && !args.quiet {
                    eprintln!(
                        "note: {} ran with {} threads; with {t} the rest of the run is deterministic but not bit-identical to an uninterrupted one",
                        dir.display(),
                        spec.threads.map_or("all".to_string(), |n| n.to_string())
                    );
                }
                spec.threads = Some(t);
            }
            if args.log_json.is_some() {
                spec.log_json = args.log_json.clone();
            }
            let out = args.out.clone().unwrap_or_else(|| dir.clone());
            if out != *dir && checkpoint::exists(&out) {
                bail!(
                    "{} already holds a training checkpoint; --out of a resumed run must be its own folder or a new one",
                    out.display()
                );
            }
            (spec, Some(state), out)
        }
        None => {
            let spec = RunSpec {
                source: args.source(),
                threads: args.threads,
                log_json: args.log_json.clone(),
            };
            let out = args.out.clone().expect("checked: --out is given");
            (spec, None, out)
        }
    };
    super::set_threads(spec.threads)?;

    let (mut data, shape) = spec.source.open()?;
    let (mut model, config) = match (&state, &spec.source) {
        (Some(_), _) => {
            let dir = args.resume.as_ref().expect("resuming");
            let model = if RecurrentModel::is_saved_in(dir) {
                Model::Recurrent(Box::new(
                    RecurrentModel::load(dir)
                        .with_context(|| format!("loading the model of {}", dir.display()))?,
                ))
            } else {
                Model::Transformer(Box::new(
                    Transformer::load(dir)
                        .with_context(|| format!("loading the model of {}", dir.display()))?,
                ))
            };
            (model, None)
        }
        (None, Source::Init { init, .. }) => {
            let model = Transformer::load(init)
                .with_context(|| format!("loading --init {}", init.display()))?;
            if model.arch.head == qkv::models::Head::None {
                bail!(
                    "--init {}: {} has no head to train (BERT trains as BertForMaskedLM, with its `cls.predictions` weights)",
                    init.display(),
                    model.info().architecture
                );
            }
            (
                Model::Transformer(Box::new(model)),
                Some(args.train_config()),
            )
        }
        (None, _) => {
            let (vocab, len) = shape.expect("tasks and text give a shape");
            let cfg = args.train_config();
            let batch = args.batch_size.unwrap_or(TASK_DEFAULT_BATCH);
            let need = match args.arch.unwrap_or(ArchKind::Transformer) {
                ArchKind::Transformer => {
                    memory::transformer_bytes(&args.arch(vocab, len)?, batch, len)
                }
                _ => memory::recurrent_bytes(
                    vocab,
                    args.d_model.unwrap_or(64),
                    args.layers.unwrap_or(1),
                    batch,
                    len,
                ),
            };
            qkv::io::memory::check(
                need,
                &format!("training a model over {vocab} symbols on batches of {batch} × {len} tokens"),
            )
            .map_err(|e| {
                anyhow!("{e}: make --d-model, --layers, --batch-size, --seq-len, --task-length or --symbols smaller")
            })?;
            let model = match args.arch.unwrap_or(ArchKind::Transformer) {
                ArchKind::Transformer => Model::Transformer(Box::new(Transformer::new(
                    &args.arch(vocab, len)?,
                    cfg.seed,
                )?)),
                ArchKind::Rnn => args.recurrent(RecurrentKind::Lm, vocab, cfg.seed)?,
                ArchKind::RnnSeq2seq => args.recurrent(RecurrentKind::Seq2Seq, vocab, cfg.seed)?,
                ArchKind::RnnAttention => {
                    args.recurrent(RecurrentKind::Seq2SeqAttention, vocab, cfg.seed)?
                }
            };
            (model, Some(cfg))
        }
    };
    // a fresh task or text run was sized before its model was made; a loaded model
    // (--init, --resume) is sized here, against the batches it will see
    if let (Model::Transformer(t), true) = (
        &model,
        state.is_some() || matches!(spec.source, Source::Init { .. }),
    ) {
        let tokens = data.tokens_per_batch();
        qkv::io::memory::check(
            memory::transformer_bytes(&t.arch, 1, tokens),
            &format!("training this model on batches of {tokens} tokens"),
        )?;
    }
    let (vocab, max_len) = model.limits();
    let run_json = serde_json::to_value(&spec).expect("RunSpec serialises");
    let mut trainer = match (state, config) {
        (Some(state), _) => {
            let dir = args.resume.as_ref().expect("resuming");
            let mut t = Trainer::resume(model.trainable(), dir, state)
                .with_context(|| format!("resuming from {}", dir.display()))?;
            t.set_run_config(run_json);
            if let Some(steps) = args.steps {
                t.set_steps(steps)?;
            }
            t
        }
        (None, Some(cfg)) => Trainer::new(model.trainable(), cfg, run_json)?,
        (None, None) => unreachable!("a fresh run has a configuration"),
    };
    let steps = trainer.config().steps;
    data.check(vocab, max_len, steps)
        .with_context(|| match &spec.source {
            Source::Init { init, data } => format!(
                "--data {} does not fit the model of --init {} (vocabulary {vocab}, {} positions)",
                data.display(),
                init.display(),
                max_len.map_or("unlimited".into(), |n| n.to_string())
            ),
            _ => "the data does not fit the model".to_string(),
        })?;
    let start = trainer.step();
    if start >= steps {
        bail!(
            "{} has already run all {steps} steps; give --steps to extend a constant-lr run",
            args.resume.as_ref().map_or(out.display(), |d| d.display())
        );
    }
    let cfg = trainer.config().clone();
    let eval = data.eval_batches(cfg.seed, cfg.eval_batches)?;
    if let Some(p) = &spec.log_json {
        super::check_writable("--log-json", p)?;
    }
    // Everything is checked: now the output folder is claimed (locked first, then
    // checked under the lock, so two runs started together cannot both pass), and
    // only then written.
    if args.resume.as_ref() != Some(&out) {
        locks.push(
            output::Lock::claim(&out, args.overwrite)
                .with_context(|| format!("--out {}", out.display()))?,
        );
    }
    let mut log = match &spec.log_json {
        Some(p) => Some(open_log(p, start)?),
        None => None,
    };
    match &spec.source {
        Source::Init { init, .. } => copy_tokenizer_files(init, &out)?,
        // token ids are bytes: saved as a tokenizer so that `generate --prompt` reads text
        Source::Text { .. } => write_byte_tokenizer(&out, max_len)?,
        Source::Task { .. } => {}
    }

    // ---- the loop -----------------------------------------------------------------
    let tokens_per_step = data.tokens_per_batch() as f64;
    let end = args.stop_after.map_or(steps, |s| s.min(steps));
    let bar = progress_bar(end, start, args.quiet);
    let t0 = Instant::now();
    let warmup = args.bench_warmup.unwrap_or(0);
    let mut bench_t0 = (warmup == 0).then(Instant::now);
    // when the last step ended: the final checkpoint's write is not training time
    let mut t_end = t0;
    let mut last: Option<StepLog> = None;
    let mut log_err: Option<std::io::Error> = None;
    let result = trainer.run(
        data.as_mut(),
        &eval,
        RunOptions {
            out: Some(&out),
            stop_after: args.stop_after,
        },
        &mut |s: &StepLog| {
            if let Some(f) = log.as_mut() {
                let line = serde_json::to_string(s).expect("StepLog serialises");
                if let Err(e) = writeln!(f, "{line}").and_then(|_| f.flush()) {
                    log_err.get_or_insert(e);
                }
            }
            t_end = Instant::now();
            let done = s.step + 1;
            if warmup > 0 && done - start == warmup {
                bench_t0 = Some(Instant::now());
            }
            let rate = (done - start) as f64 * tokens_per_step / t0.elapsed().as_secs_f64();
            bar.set_message(format!("loss {:.4} · {rate:.0} tok/s", s.loss));
            bar.set_position(done);
            if let Some(line) = eval_line(s) {
                if !args.quiet {
                    bar.suspend(|| eprintln!("{line}"));
                }
            }
            last = Some(s.clone());
        },
    );
    bar.finish_and_clear();
    if let (Some(e), Some(p)) = (log_err, &spec.log_json) {
        return Err(anyhow!("writing {}: {e}", p.display()));
    }
    if let Err(e) = result {
        let kept = match checkpoint::open(&out) {
            Ok(s) => format!(
                "the last good checkpoint (after step {}) is in {}",
                s.step,
                out.display()
            ),
            Err(_) => "no checkpoint was written".to_string(),
        };
        return Err(anyhow!("{e:#}; {kept}"));
    }
    let elapsed = (t_end - t0).as_secs_f64();
    let done = trainer.step() - start;
    if let (Some(t), true) = (bench_t0, args.bench_warmup.is_some()) {
        let timed = done.saturating_sub(warmup);
        let secs = (t_end - t).as_secs_f64();
        println!(
            "{}",
            serde_json::json!({
                "impl": "qkv",
                "threads": rayon::current_num_threads(),
                "timed_steps": timed,
                "seconds": secs,
                "tokens_per_sec": timed as f64 * tokens_per_step / secs,
                "last_loss": last.as_ref().map(|l| l.loss),
            })
        );
    }
    if !args.quiet {
        let mut summary = format!(
            "trained steps {}..{} in {elapsed:.1}s ({:.0} tokens/s)",
            start + 1,
            trainer.step(),
            done as f64 * tokens_per_step / elapsed
        );
        if let Some(l) = &last {
            summary += &format!(", last loss {:.4}", l.loss);
            if let (Some(el), Some(acc)) = (l.eval_loss, l.eval_accuracy) {
                summary += &format!(", eval loss {el:.4}, token accuracy {:.2}%", acc * 100.0);
            }
        }
        eprintln!("{summary}; checkpoint in {}", out.display());
    }
    Ok(())
}
