//! `qkv bench`: times qkv on the workloads of issue 8 (attention forward and backward,
//! decoding against a long cache, all-MiniLM-L6-v2, a random Llama), and the machine's
//! own limits (FMA peak, memory read bandwidth), and prints, per workload, the best and
//! the median seconds per call. `bench/compare_torch.py` runs
//! the same workloads on PyTorch, alternating rounds with this command.
//!
//! One file per workload, each with its flags (attention.rs: attention and decoding;
//! llama.rs, with its check against f32 in accuracy.rs; grammar.rs, structured output's
//! mask; machine.rs, over the probes of
//! probes.rs; load.rs, a load generator for a server); timing.rs times them all the same way, printer.rs prints their rows.

mod accuracy;
mod attention;
mod grammar;
mod llama;
mod load;
mod machine;
mod matmul;
mod minilm;
mod printer;
mod probes;
mod timing;

use std::io::Write;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::cmd::shared_flags::set_threads;
use attention::{AttentionArgs, DecodeArgs};
use grammar::GrammarArgs;
use llama::LlamaArgs;
use load::LoadArgs;
use machine::MachineArgs;
use matmul::MatmulArgs;
use minilm::MinilmArgs;
use printer::Printer;

#[derive(Args)]
#[command(
    after_help = "Training throughput against PyTorch: bench/train_tokens_per_sec.sh.\n\
                        qkv against PyTorch on every workload: python3 bench/compare_torch.py all"
)]
pub struct BenchArgs {
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Subcommand)]
enum Workload {
    /// Attention forward (and backward) on random Q, K, V: [B,N,H,D] against [B,N,G,D]
    Attention(AttentionArgs),
    /// Decoding: one query against a KV cache of S keys and values (bottom-right causal)
    Decode(DecodeArgs),
    /// all-MiniLM-L6-v2 sentence embeddings: a batch of sentences, and one sentence
    Minilm(MinilmArgs),
    /// A randomly initialised Llama: prefill of a prompt and greedy decoding
    Llama(LlamaArgs),
    /// Matrix products as a linear layer runs them: y [M,N] = x [M,K] · Wᵀ, W stored [N,K]
    Matmul(MatmulArgs),
    /// The machine's limits: f32 FMA peak (GFLOP/s) and memory read bandwidth (GB/s)
    Machine(MachineArgs),
    /// Structured output: a JSON schema's token mask per token against a decoding step
    Grammar(GrammarArgs),
    /// A load generator for an OpenAI-style server: requests from a file, so many in
    /// flight, streamed events timed (bench/serve_load.py drives it)
    Load(LoadArgs),
}

pub fn run(args: &BenchArgs, out: &mut impl Write) -> Result<()> {
    let common = match &args.workload {
        Workload::Load(a) => return load::run(a, out),
        Workload::Attention(a) => &a.common,
        Workload::Decode(a) => &a.common,
        Workload::Minilm(a) => &a.common,
        Workload::Llama(a) => &a.common,
        Workload::Matmul(a) => &a.common,
        Workload::Machine(a) => &a.common,
        Workload::Grammar(a) => &a.common,
    };
    common.check()?;
    set_threads(common.threads)?;
    let mut printer = Printer::new(common, out);
    match &args.workload {
        Workload::Attention(a) => attention::bench_attention(a, &mut printer),
        Workload::Decode(a) => attention::bench_decode(a, &mut printer),
        Workload::Minilm(a) => minilm::bench_minilm(a, &mut printer),
        Workload::Llama(a) => llama::bench_llama(a, &mut printer),
        Workload::Matmul(a) => matmul::bench_matmul(a, &mut printer),
        Workload::Machine(a) => machine::bench_machine(a, &mut printer),
        Workload::Grammar(a) => grammar::bench_grammar(a, &mut printer),
        Workload::Load(_) => unreachable!("run above"),
    }
}
