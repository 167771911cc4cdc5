//! `qkv bench`: times qkv on the workloads of issue 8 (attention forward and backward,
//! decoding against a long cache, all-MiniLM-L6-v2, a random Llama), and the machine's
//! own limits (FMA peak, memory read bandwidth), and prints, per workload, the best and
//! the median seconds per call. `bench/compare_torch.py` runs
//! the same workloads on PyTorch, alternating rounds with this command.
//!
//! Timing (one place for every workload, [`measure`]): `--warmup` untimed calls, then
//! `--rounds` timed samples. A sample repeats the call until it lasts at least
//! `--min-time` seconds (the count is sized from the last warm-up call), so short calls
//! are not lost in the clock's resolution; its figure is the sample's time divided by
//! its calls. Benchmarks are never timed tests: the tests only run them on tiny sizes.

use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use super::machine::{fma_probe, MemoryProbe};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use qkv::attention::{attention, attention_backward, HeadsView, KvCache, KvDType, LayerKv};
use qkv::layers::linear::product_into;
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::sentence::SentenceEncoder;
use qkv::models::{Arch, TokenBatch, Transformer};
use qkv::ops::bf16::{self, Bf16Weight};
use qkv::ops::int8::{self, Int8Weight, ScaleLayout};
use qkv::ops::{argmax, DType, Par};
use qkv::rng::Rng;
use qkv::{AttentionSpec, CausalAlign, Kernel, Tensor};
use serde_json::{json, Map, Value};

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
}

/// Options every workload takes.
#[derive(Args)]
struct Common {
    /// Threads of the rayon pool [default: all cores]
    #[arg(long)]
    threads: Option<usize>,
    /// Timed samples; the best and the median are over these
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Untimed calls before timing
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// A sample repeats the call until it lasts this many seconds (sized from the last
    /// warm-up call; every sample times one call when there is no warm-up)
    #[arg(long, default_value_t = 0.05)]
    min_time: f64,
    /// Seed of the random inputs and weights
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AttentionArgs {
    /// Sequence lengths N (queries = keys)
    #[arg(long, value_delimiter = ',', default_values_t = [128, 512, 1024, 2048, 4096])]
    n: Vec<usize>,
    /// Query heads H
    #[arg(long, default_value_t = 12)]
    heads: usize,
    /// Key/value heads G (G < H: grouped-query)
    #[arg(long, default_value_t = 12)]
    kv_heads: usize,
    /// Head width D
    #[arg(long, default_value_t = 64)]
    dim: usize,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Causal mask (top-left: query i sees keys ≤ i)
    #[arg(long)]
    causal: bool,
    /// Time forward + backward (with a fixed random upstream gradient)
    #[arg(long)]
    backward: bool,
    #[arg(long, value_enum, default_value_t = KernelArg::Tiled)]
    kernel: KernelArg,
    /// Q·Kᵀ and P·V from operands rounded to bf16 (the tiled kernel's forward)
    #[arg(long, conflicts_with = "backward")]
    bf16: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Clone, Copy, ValueEnum)]
enum KernelArg {
    Tiled,
    Reference,
}

#[derive(Args)]
struct DecodeArgs {
    /// Cache lengths S (keys and values per head)
    #[arg(long, value_delimiter = ',', default_values_t = [512, 4096, 32768])]
    cache: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    heads: usize,
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    #[arg(long, default_value_t = 128)]
    dim: usize,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, value_enum, default_value_t = KernelArg::Tiled)]
    kernel: KernelArg,
    #[command(flatten)]
    kv_dtype: super::shared_flags::KvDTypeFlag,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct MinilmArgs {
    /// sentence-transformers folder of all-MiniLM-L6-v2 (tools/fetch_minilm.sh DIR)
    #[arg(long, required_unless_present = "print_sentences")]
    model: Option<PathBuf>,
    /// Sentences in the batch workload (generated from --seed)
    #[arg(long, default_value_t = 256)]
    sentences: usize,
    /// Sentences per forward pass: one `embed_batched` call over all of them, as
    /// sentence-transformers' `encode(batch_size=...)`
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Print the generated sentences as a JSON list and exit (the PyTorch side encodes these)
    #[arg(long)]
    print_sentences: bool,
    /// Below f32, the embeddings are first checked against f32's (least cosine)
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct LlamaArgs {
    #[arg(long, default_value_t = 512)]
    d_model: usize,
    #[arg(long, default_value_t = 8)]
    layers: usize,
    #[arg(long, default_value_t = 8)]
    heads: usize,
    #[arg(long, default_value_t = 4)]
    kv_heads: usize,
    #[arg(long, default_value_t = 32000)]
    vocab: usize,
    /// Positions the model allows (its config's max_position_embeddings)
    #[arg(long, default_value_t = 2048)]
    max_len: usize,
    /// Prompt tokens of the prefill workload: one forward through an empty cache
    #[arg(long, default_value_t = 512)]
    prefill: usize,
    /// The prefill computes the logits of the last position only, as generation's does
    /// (`Transformer::prefill`), instead of every position's (as PyTorch's forward)
    #[arg(long)]
    last_logits: bool,
    /// New tokens of the greedy decode workload (no end-of-sequence stop)
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Prompt tokens the decode workload starts from
    #[arg(long, default_value_t = 16)]
    decode_prompt: usize,
    /// Also decode N sequences together, one token each per step, as `qkv serve`
    /// batches its streams (`Transformer::step_rows`: the products once over N rows,
    /// attention per sequence); the weights packed first as the server packs them
    #[arg(long, value_name = "N", value_delimiter = ',')]
    rows: Vec<usize>,
    /// Also write the model to DIR as a LlamaForCausalLM folder (transformers loads it)
    #[arg(long, value_name = "DIR")]
    save: Option<PathBuf>,
    /// Time this model instead of a random one of the sizes above: a folder, or a GGUF
    /// file (its Q8_0, Q4_0 and K-quant blocks as stored, its other matrices in --dtype). The accuracy
    /// reference is the same weights in f32 (a GGUF file's dequantized)
    #[arg(long, value_name = "DIR|FILE", conflicts_with = "save")]
    model: Option<PathBuf>,
    /// Below f32, each workload is first checked against the f32 model: the prefill's
    /// logits, and the greedy tokens
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
    /// The KV cache's type, for both workloads (the accuracy reference stays f32)
    #[command(flatten)]
    kv_dtype: super::shared_flags::KvDTypeFlag,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct MatmulArgs {
    /// Shapes MxKxN: training (2048 tokens of a d=384 model), a batch of sentences,
    /// one sentence of 13 tokens, one decode step of a d=512 Llama
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = [
            "2048x384x384".to_string(), "2048x384x1536".into(), "2048x1536x384".into(),
            "13x384x384".into(), "13x384x1536".into(), "13x1536x384".into(),
            "1x512x1536".into(), "1x512x32000".into(),
        ]
    )]
    shapes: Vec<String>,
    /// The weight's number type: f32 (the product read in place), or another (its copy,
    /// made before timing; its error against f32 printed to stderr)
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct MachineArgs {
    /// Size of the buffer the memory probe reads: far above the last-level cache
    #[arg(long, default_value_t = 1 << 30)]
    bytes: usize,
    #[command(flatten)]
    common: Common,
}

pub fn run(args: &BenchArgs, out: &mut impl Write) -> Result<()> {
    let common = match &args.workload {
        Workload::Attention(a) => &a.common,
        Workload::Decode(a) => &a.common,
        Workload::Minilm(a) => &a.common,
        Workload::Llama(a) => &a.common,
        Workload::Matmul(a) => &a.common,
        Workload::Machine(a) => &a.common,
    };
    if common.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if !(common.min_time >= 0.0 && common.min_time.is_finite()) {
        bail!("--min-time must be a finite number ≥ 0");
    }
    super::shared_flags::set_threads(common.threads)?;
    let mut printer = Printer::new(common, out);
    match &args.workload {
        Workload::Attention(a) => bench_attention(a, &mut printer),
        Workload::Decode(a) => bench_decode(a, &mut printer),
        Workload::Minilm(a) => bench_minilm(a, &mut printer),
        Workload::Llama(a) => bench_llama(a, &mut printer),
        Workload::Matmul(a) => bench_matmul(a, &mut printer),
        Workload::Machine(a) => bench_machine(a, &mut printer),
    }
}

// ---- the workloads ---------------------------------------------------------------

const FLOP_CONVENTION: &str =
    "forward 4·B·H·N·N·D (halved when causal); forward+backward 2.5× the forward; decode 4·B·H·S·D";

fn bench_attention(a: &AttentionArgs, p: &mut Printer<impl Write>) -> Result<()> {
    let (b, h, g, d) = (a.batch, a.heads, a.kv_heads, a.dim);
    let spec = AttentionSpec {
        causal: a.causal.then_some(CausalAlign::TopLeft),
        kernel: a.kernel.into(),
        bf16: a.bf16,
        ..Default::default()
    };
    for &n in &a.n {
        let mut rng = Rng::new(a.common.seed);
        let q = rng.tensor(&[b, n, h, d], 1.0);
        let k = rng.tensor(&[b, n, g, d], 1.0);
        let v = rng.tensor(&[b, n, g, d], 1.0);
        let d_out = a.backward.then(|| rng.tensor(&[b, n, h, d], 1.0));
        let timing = measure(&a.common, || {
            let fwd = attention(&q, &k, &v, &spec)?;
            if let Some(d_out) = &d_out {
                black_box(attention_backward(&q, &k, &v, &fwd, d_out, &spec, false)?);
            }
            black_box(fwd);
            Ok(())
        })?;
        let mut flop = 4.0 * (b * h * n * n * d) as f64;
        if a.causal {
            flop /= 2.0;
        }
        if a.backward {
            flop *= 2.5;
        }
        let pass = match (a.backward, a.bf16) {
            (true, _) => "fwd+bwd",
            (false, true) => "fwd bf16",
            (false, false) => "fwd",
        };
        let mask = if a.causal { "causal" } else { "full" };
        p.row(Row {
            label: format!("attention {pass} {mask} N={n}"),
            timing,
            rate: Some(Rate::new("gflops", "GFLOP/s", flop / 1e9)),
            fields: json!({
                "bench": "attention", "n": n, "batch": b, "heads": h, "kv_heads": g,
                "dim": d, "causal": a.causal, "backward": a.backward,
                "kernel": a.kernel.name(), "bf16": a.bf16, "gflop": flop / 1e9,
                "flop_convention": FLOP_CONVENTION,
            }),
        })?;
    }
    Ok(())
}

fn bench_matmul(a: &MatmulArgs, p: &mut Printer<impl Write>) -> Result<()> {
    for shape in &a.shapes {
        let dims: Vec<usize> = shape
            .split('x')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()
            .filter(|d: &Vec<usize>| d.len() == 3 && !d.contains(&0))
            .with_context(|| format!("--shapes: `{shape}` is not MxKxN with sizes ≥ 1"))?;
        let (m, k, n) = (dims[0], dims[1], dims[2]);
        let mut rng = Rng::new(a.common.seed);
        let x = rng.tensor(&[m, k], 1.0);
        let w = rng.tensor(&[n, k], 1.0);
        let mut y = Tensor::zeros(&[m, n]);
        let dtype = a.dtype.dtype;
        let weight = MatmulWeight::new(dtype, &w)?;
        let run = |y: &mut Tensor| -> Result<()> {
            match &weight {
                MatmulWeight::F32 => product_into(y, &x, &w, 1.0, false)?,
                MatmulWeight::Bf16(w) => {
                    bf16::product(y.data_mut(), x.data(), m, w, false, Par::Auto)?
                }
                MatmulWeight::Int8(w) => {
                    int8::product(y.data_mut(), x.data(), m, w, int8::Start::Zero, Par::Auto)?
                }
            }
            Ok(())
        };
        // how far the type moves the product: the largest error over the largest |y|
        let accuracy = if dtype == DType::F32 {
            json!({})
        } else {
            let mut want = Tensor::zeros(&[m, n]);
            product_into(&mut want, &x, &w, 1.0, false)?;
            run(&mut y)?;
            let top = want.data().iter().fold(0.0f32, |t, v| t.max(v.abs()));
            let err = y
                .data()
                .iter()
                .zip(want.data())
                .fold(0.0f32, |e, (g, t)| e.max((g - t).abs()));
            eprintln!(
                "{dtype} {m}x{k}x{n}: largest error {:.3e} of the largest |y|",
                err / top
            );
            json!({"relative_error": err / top})
        };
        let timing = measure(&a.common, || {
            run(&mut y)?;
            black_box(&y);
            Ok(())
        })?;
        let flop = 2.0 * (m * k * n) as f64;
        p.row(Row {
            label: format!("matmul {m}x{k}x{n} {dtype}"),
            timing,
            rate: Some(Rate::new("gflops", "GFLOP/s", flop / 1e9)),
            fields: merge(
                &json!({"bench": "matmul", "m": m, "k": k, "n": n, "gflop": flop / 1e9,
                        "dtype": dtype.name()}),
                accuracy,
            ),
        })?;
    }
    Ok(())
}

/// The weight of `bench matmul`, in its type.
enum MatmulWeight {
    /// the f32 weight, read in place as `product_into` reads it
    F32,
    Bf16(Bf16Weight),
    Int8(Int8Weight),
}

impl MatmulWeight {
    fn new(dtype: DType, w: &Tensor) -> Result<Self> {
        let &[n, k] = w.shape() else {
            bail!("a matmul weight is [n, k]");
        };
        Ok(match dtype {
            DType::F32 => MatmulWeight::F32,
            DType::Bf16 => MatmulWeight::Bf16(Bf16Weight::new(w.data(), n, k)?),
            DType::Int8 => {
                MatmulWeight::Int8(Int8Weight::new(w.data(), n, k, ScaleLayout::Blocks)?)
            }
            DType::Int8Row => {
                MatmulWeight::Int8(Int8Weight::new(w.data(), n, k, ScaleLayout::Rows)?)
            }
            DType::Blocks(_) | DType::F16 => {
                bail!("{dtype} weights are read from GGUF files, not made here")
            }
        })
    }
}

fn bench_machine(a: &MachineArgs, p: &mut Printer<impl Write>) -> Result<()> {
    if a.bytes < 8 {
        bail!("--bytes must be at least 8 (one word)");
    }
    // a million steps: about 2 ms a call at 100 GFLOP/s a thread
    const STEPS: u64 = 1 << 20;
    let mut flop = 0.0;
    let timing = measure(&a.common, || {
        flop = fma_probe(STEPS);
        Ok(())
    })?;
    p.row(Row {
        label: "machine f32 FMA peak".into(),
        timing,
        rate: Some(Rate::new("gflops", "GFLOP/s", flop / 1e9)),
        fields: json!({"bench": "machine", "probe": "fma", "gflop": flop / 1e9}),
    })?;
    let probe = MemoryProbe::new(a.bytes);
    let timing = measure(&a.common, || {
        black_box(probe.read());
        Ok(())
    })?;
    let gb = probe.bytes() as f64 / 1e9;
    p.row(Row {
        label: format!("machine memory read {:.2} GB", gb),
        timing,
        rate: Some(Rate::new("gbs", "GB/s", gb)),
        fields: json!({"bench": "machine", "probe": "memory", "bytes": probe.bytes()}),
    })
}

fn bench_decode(a: &DecodeArgs, p: &mut Printer<impl Write>) -> Result<()> {
    let (b, h, g, d) = (a.batch, a.heads, a.kv_heads, a.dim);
    let spec = AttentionSpec {
        causal: Some(CausalAlign::BottomRight),
        kernel: a.kernel.into(),
        ..Default::default()
    };
    for &s in &a.cache {
        let mut rng = Rng::new(a.common.seed);
        let q = rng.tensor(&[b, 1, h, d], 1.0);
        let k = rng.tensor(&[b, s, g, d], 1.0);
        let v = rng.tensor(&[b, s, g, d], 1.0);
        // through a KV cache, as a decoder reads it: the cache checked its rows when
        // they were appended, so a step does not scan all S of them again
        let kv_dtype = a.kv_dtype.kv_dtype;
        let mut cache = LayerKv::new_as(kv_dtype, b, g, d, d);
        cache.append(&k, &v)?;
        let q_view = HeadsView::of(&q, "q")?;
        let timing = measure(&a.common, || {
            black_box(cache.attend(&q_view, &spec)?);
            Ok(())
        })?;
        let element = match kv_dtype {
            KvDType::F32 => 4,
            KvDType::Bf16 => 2,
        };
        let kv_bytes = (2 * b * s * g * d * element) as f64;
        p.row(Row {
            label: format!("decode T=1 S={s}"),
            timing,
            rate: Some(Rate::new("gbs", "GB/s K+V", kv_bytes / 1e9)),
            fields: json!({
                "bench": "decode", "cache": s, "batch": b, "heads": h, "kv_heads": g,
                "dim": d, "kernel": a.kernel.name(), "kv_bytes": kv_bytes,
                "kv_dtype": kv_dtype.name(),
                "gflop": 4.0 * (b * h * s * d) as f64 / 1e9,
                "flop_convention": FLOP_CONVENTION,
            }),
        })?;
    }
    Ok(())
}

/// The single-sentence workload's sentence.
const SINGLE_SENTENCE: &str = "Attention lets every word look at all the other words.";

fn bench_minilm(a: &MinilmArgs, p: &mut Printer<impl Write>) -> Result<()> {
    if a.sentences == 0 || a.batch == 0 {
        bail!("--sentences and --batch must be at least 1");
    }
    let sentences = bench_sentences(a.sentences, a.common.seed);
    if a.print_sentences {
        writeln!(p.out, "{}", serde_json::to_string(&sentences)?)?;
        return Ok(());
    }
    let dir = a.model.as_ref().expect("clap requires --model");
    let mut encoder = SentenceEncoder::load(dir)
        .with_context(|| format!("loading sentence encoder {}", dir.display()))?;
    let dtype = a.dtype.dtype;
    let all: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let accuracy = if dtype == DType::F32 {
        json!({})
    } else {
        let want = encoder.embed_batched(&all, a.batch)?;
        encoder.set_dtype(dtype)?;
        let got = encoder.embed_batched(&all, a.batch)?;
        let least = want
            .iter()
            .zip(&got)
            .map(|(w, g)| cosine(w, g))
            .fold(f64::INFINITY, f64::min);
        eprintln!(
            "{dtype}: least cosine to f32 over {} sentences {least:.6}",
            all.len()
        );
        json!({"min_cosine_to_f32": least})
    };

    // One call over every sentence, which `embed_batched` groups into batches, as
    // sentence-transformers' encode groups them on the PyTorch side.
    let timing = measure(&a.common, || {
        black_box(encoder.embed_batched(&all, a.batch)?);
        Ok(())
    })?;
    let n = sentences.len();
    p.row(Row {
        label: format!("minilm {n} sentences, batch {}", a.batch),
        timing,
        rate: Some(Rate::new("sentences_per_s", "sentences/s", n as f64)),
        fields: merge(
            &json!({"bench": "minilm", "mode": "batch", "sentences": n, "batch": a.batch,
                    "dtype": dtype.name()}),
            accuracy,
        ),
    })?;

    let tokens = encoder.tokenize(&[SINGLE_SENTENCE])?.len;
    let timing = measure(&a.common, || {
        black_box(encoder.embed(&[SINGLE_SENTENCE])?);
        Ok(())
    })?;
    p.row(Row {
        label: format!("minilm one sentence ({tokens} tokens)"),
        timing,
        rate: None,
        fields: json!({
            "bench": "minilm", "mode": "single", "sentence": SINGLE_SENTENCE, "tokens": tokens,
            "dtype": dtype.name(),
        }),
    })
}

/// `n` sentences of 5 to 30 words, every fourth one Chinese, the same for a given seed.
fn bench_sentences(n: usize, seed: u64) -> Vec<String> {
    const ENGLISH: &str = "the a model reads every word attention weights query key value \
        softmax layer quick brown fox jumps over lazy dog river city morning train arrives \
        late people wait quietly under bright lights and then they walk home through rain \
        music plays softly in old kitchen where bread is baked scientists measure signals \
        from distant stars with new telescopes children learn numbers by counting apples";
    const CHINESE: &str =
        "我们 今天 学习 注意力 机制 模型 阅读 每个 词语 城市 早上 火车 到达 很晚 \
        人们 安静 等待 音乐 厨房 面包 科学家 测量 遥远 星星 孩子 数字 苹果 天气 下雨 回家 \
        朋友 一起 吃饭 喜欢 美丽 花园 老师 问题 答案 世界";
    let english: Vec<&str> = ENGLISH.split_whitespace().collect();
    let chinese: Vec<&str> = CHINESE.split_whitespace().collect();
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let words = 5 + rng.below(26);
            if i % 4 == 3 {
                let mut s: String = (0..words)
                    .map(|_| chinese[rng.below(chinese.len())])
                    .collect();
                s.push('。');
                s
            } else {
                let mut s = (0..words)
                    .map(|_| english[rng.below(english.len())])
                    .collect::<Vec<_>>()
                    .join(" ");
                s[..1].make_ascii_uppercase();
                s.push('.');
                s
            }
        })
        .collect()
}

fn bench_llama(a: &LlamaArgs, p: &mut Printer<impl Write>) -> Result<()> {
    if a.prefill == 0 || a.decode == 0 || a.decode_prompt == 0 {
        bail!("--prefill, --decode and --decode-prompt must be at least 1");
    }
    if a.rows.contains(&0) {
        bail!("--rows must be at least 1");
    }
    if a.prefill.max(a.decode_prompt + a.decode) > a.max_len {
        bail!(
            "--max-len {} is shorter than the workloads: --prefill {} and --decode-prompt + --decode {}",
            a.max_len,
            a.prefill,
            a.decode_prompt + a.decode
        );
    }
    let (dtype, kv_dtype) = (a.dtype.dtype, a.kv_dtype.kv_dtype);
    // the model, and its f32 twin (made only when an accuracy check needs it)
    let (mut model, reference): (Transformer, Box<dyn Fn() -> Result<Transformer>>) = match &a.model
    {
        Some(path) => {
            let model = super::load::load_model(path, dtype)?.model;
            let path = path.clone();
            let reference = move || -> Result<Transformer> {
                let mut m = qkv::models::load_in(&path, DType::F32)?.model;
                m.unpack_weights();
                Ok(m)
            };
            (model, Box::new(reference))
        }
        None => {
            let arch = Arch::llama(a.vocab, a.d_model, a.layers, a.heads, a.kv_heads, a.max_len);
            let mut model = Transformer::new(&arch, a.common.seed)?;
            if dtype != DType::F32 {
                // the f32 model of the same seed is the reference
                model.set_dtype(dtype)?;
            }
            let seed = a.common.seed;
            let reference = move || Ok(Transformer::new(&arch, seed)?);
            (model, Box::new(reference))
        }
    };
    model.kv_dtype = kv_dtype;
    let arch = model.arch.clone();
    let stack = arch.stack();
    let vocab = arch.vocab;
    if let Some(dir) = &a.save {
        model
            .save(dir)
            .with_context(|| format!("saving the model to {}", dir.display()))?;
    }
    let arch_fields = json!({
        "bench": "llama", "d_model": arch.d_model, "layers": stack.layers, "heads": stack.heads,
        "kv_heads": stack.kv_heads, "vocab": vocab, "params": model.num_params(),
        "dtype": model.dtype().name(), "kv_dtype": kv_dtype.name(),
        "model": a.model.as_ref().map(|m| m.display().to_string()),
    });
    let mut rng = Rng::new(a.common.seed.wrapping_add(1));
    let mut ids = |n: usize| -> Vec<usize> { (0..n).map(|_| rng.below(vocab)).collect() };

    let prompt = TokenBatch::single(ids(a.prefill))?;
    let decode_prompt = TokenBatch::single(ids(a.decode_prompt))?;
    let opts = GenerateOptions::new(a.decode, Sampling::Greedy, Vec::new());
    let accuracy = match (model.dtype(), kv_dtype) {
        (DType::F32, KvDType::F32) => json!({}),
        _ => {
            let reference = reference()?;
            let acc = low_precision_accuracy(&reference, &model, &prompt, &decode_prompt, &opts)?;
            // on stderr, so that `--json` prints JSON lines alone
            eprintln!(
                "{dtype}, KV cache {kv_dtype}: prefill logits max abs {} from f32, top-1 as f32 at {} of {} positions; \
                 greedy decode {} of {} tokens as f32 (first difference at {})",
                acc["logits_max_abs"],
                acc["prefill_top1_equal"],
                a.prefill,
                acc["greedy_equal"],
                a.decode,
                acc["greedy_first_difference"]
            );
            acc
        }
    };
    let timing = measure(&a.common, || {
        let mut cache = model.new_cache(1);
        match a.last_logits {
            true => black_box(model.prefill(&prompt, &mut cache)?),
            false => black_box(model.forward_cached(&prompt, &mut cache)?),
        };
        Ok(())
    })?;
    let logits = if a.last_logits { ", last logits" } else { "" };
    p.row(Row {
        label: format!("llama prefill {} tokens{logits}", a.prefill),
        timing,
        rate: Some(Rate::new("tokens_per_s", "tokens/s", a.prefill as f64)),
        fields: merge(
            &arch_fields,
            merge(
                &json!({"mode": "prefill", "tokens": a.prefill, "last_logits": a.last_logits}),
                accuracy.clone(),
            ),
        ),
    })?;

    let timing = measure(&a.common, || {
        let new = generate_causal(&model, &decode_prompt, &opts)?;
        if new[0].len() != a.decode {
            bail!("generated {} tokens, not {}", new[0].len(), a.decode);
        }
        Ok(())
    })?;
    // Every decoding step reads every weight but the embedding table (one row of it),
    // which stays f32 (a tied head reads it whole in f32).
    let (linear, rest) = model.weight_bytes();
    let table = match arch.head.tied() {
        true => 0,
        false => 4 * vocab * arch.d_model,
    };
    let weight_bytes = (linear + rest - table) as f64;
    let fields = merge(
        &arch_fields,
        json!({
            "mode": "decode", "prompt": a.decode_prompt, "new_tokens": a.decode,
            "weight_bytes_per_token": weight_bytes,
            "weight_gbs_best": weight_bytes * a.decode as f64 / timing.best_s / 1e9,
            "weight_gbs_median": weight_bytes * a.decode as f64 / timing.median_s / 1e9,
        }),
    );
    let fields = merge(&fields, accuracy);
    p.row(Row {
        label: format!(
            "llama greedy decode {} tokens (prompt {})",
            a.decode, a.decode_prompt
        ),
        timing,
        rate: Some(Rate::new("tokens_per_s", "tokens/s", a.decode as f64)),
        fields,
    })?;
    if !a.rows.is_empty() {
        if model.dtype() == DType::F32 {
            model.pack_weights();
        }
        for &n in &a.rows {
            bench_rows(a, &model, n, &arch_fields, &mut ids, p)?;
        }
    }
    Ok(())
}

/// `a.decode` greedy steps of `n` sequences at once, each from its own random prompt;
/// a sample clones the prefilled caches, so it times the steps and the choices alone.
fn bench_rows(
    a: &LlamaArgs,
    model: &Transformer,
    n: usize,
    arch_fields: &Value,
    ids: &mut impl FnMut(usize) -> Vec<usize>,
    p: &mut Printer<impl Write>,
) -> Result<()> {
    let mut caches = Vec::with_capacity(n);
    let mut first = Vec::with_capacity(n);
    for _ in 0..n {
        let mut cache = model.new_cache(1);
        let logits = model.prefill(&TokenBatch::single(ids(a.decode_prompt))?, &mut cache)?;
        first.push(argmax(logits.data()));
        caches.push(cache);
    }
    let timing = measure(&a.common, || {
        let mut caches = caches.clone();
        let mut tokens = first.clone();
        for _ in 0..a.decode {
            let mut rows: Vec<&mut KvCache> = caches.iter_mut().collect();
            let logits = model.step_rows(&tokens, &mut rows)?;
            let v = logits.shape()[2];
            for (t, row) in tokens.iter_mut().zip(logits.data().chunks_exact(v)) {
                *t = argmax(row);
            }
        }
        black_box(&tokens);
        Ok(())
    })?;
    let fields = merge(
        arch_fields,
        json!({
            "mode": "decode_rows", "rows": n, "prompt": a.decode_prompt, "new_tokens": a.decode,
            "step_s_best": timing.best_s / a.decode as f64,
            "step_s_median": timing.median_s / a.decode as f64,
        }),
    );
    p.row(Row {
        label: format!(
            "llama greedy decode {} tokens x {n} rows (prompt {})",
            a.decode, a.decode_prompt
        ),
        timing,
        rate: Some(Rate::new("tokens_per_s", "tokens/s", (a.decode * n) as f64)),
        fields,
    })
}

/// A reduced-precision model against the f32 one: the largest logit difference over the
/// prefill prompt's positions and at how many of them the top token is f32's; how many
/// greedy tokens equal f32's, and where the first difference is.
fn low_precision_accuracy(
    reference: &Transformer,
    model: &Transformer,
    prompt: &TokenBatch,
    decode_prompt: &TokenBatch,
    opts: &GenerateOptions,
) -> Result<Value> {
    let want = reference.forward_cached(prompt, &mut reference.new_cache(1))?;
    let got = model.forward_cached(prompt, &mut model.new_cache(1))?;
    let want_tokens = &generate_causal(reference, decode_prompt, opts)?[0];
    let got_tokens = &generate_causal(model, decode_prompt, opts)?[0];
    let pairs = || want_tokens.iter().zip(got_tokens);
    // counted position by position, as the anchors count them: a random model's
    // greedy run falls into loops, so the two runs can meet again after a difference
    let equal = pairs().filter(|(w, g)| w == g).count();
    let first_difference = pairs().position(|(w, g)| w != g);
    let v = want.last_dim();
    let top1 = want
        .data()
        .chunks_exact(v)
        .zip(got.data().chunks_exact(v))
        .filter(|(w, g)| argmax(w) == argmax(g))
        .count();
    Ok(json!({
        "logits_max_abs": want.max_abs_diff(&got),
        "greedy_equal": equal,
        "greedy_first_difference": first_difference,
        "prefill_top1_equal": top1,
    }))
}

/// cos(u, v), in f64.
fn cosine(u: &[f32], v: &[f32]) -> f64 {
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum::<f64>()
    };
    dot(u, v) / (dot(u, u) * dot(v, v)).sqrt()
}

impl From<KernelArg> for Kernel {
    fn from(k: KernelArg) -> Kernel {
        match k {
            KernelArg::Tiled => Kernel::Tiled,
            KernelArg::Reference => Kernel::Reference,
        }
    }
}

impl KernelArg {
    fn name(self) -> &'static str {
        match self {
            KernelArg::Tiled => "tiled",
            KernelArg::Reference => "reference",
        }
    }
}

fn merge(base: &Value, extra: Value) -> Value {
    let mut m = base.as_object().cloned().unwrap_or_default();
    if let Value::Object(e) = extra {
        m.extend(e);
    }
    Value::Object(m)
}

// ---- timing and reporting --------------------------------------------------------

/// Seconds per call over the timed samples.
struct Timing {
    best_s: f64,
    median_s: f64,
    /// Calls per sample.
    iters: usize,
}

/// Times `call` as the module docs describe.
fn measure(c: &Common, mut call: impl FnMut() -> Result<()>) -> Result<Timing> {
    let mut last = None;
    for _ in 0..c.warmup {
        let start = Instant::now();
        call()?;
        last = Some(start.elapsed().as_secs_f64());
    }
    let iters = match last {
        Some(s) if c.min_time > 0.0 => (c.min_time / s.max(1e-9)).ceil().clamp(1.0, 1e6) as usize,
        _ => 1,
    };
    let mut samples = Vec::with_capacity(c.rounds);
    for _ in 0..c.rounds {
        let start = Instant::now();
        for _ in 0..iters {
            call()?;
        }
        samples.push(start.elapsed().as_secs_f64() / iters as f64);
    }
    samples.sort_by(f64::total_cmp);
    let m = samples.len() / 2;
    let median_s = if samples.len() % 2 == 1 {
        samples[m]
    } else {
        (samples[m - 1] + samples[m]) / 2.0
    };
    Ok(Timing {
        best_s: samples[0],
        median_s,
        iters,
    })
}

/// A rate derived from a timing: `amount` per call, e.g. GFLOP, GB, sentences, tokens.
struct Rate {
    /// JSON key prefix: `<key>_best`, `<key>_median`.
    key: &'static str,
    unit: &'static str,
    amount: f64,
}

impl Rate {
    fn new(key: &'static str, unit: &'static str, amount: f64) -> Self {
        Rate { key, unit, amount }
    }
}

/// One measured workload.
struct Row {
    label: String,
    timing: Timing,
    rate: Option<Rate>,
    /// What was measured (sizes, options); printed with --json.
    fields: Value,
}

/// Prints rows as they are measured: JSON lines, or a table.
struct Printer<'w, W: Write> {
    out: &'w mut W,
    json: bool,
    threads: usize,
    rounds: usize,
    warmup: usize,
    header: bool,
}

impl<'w, W: Write> Printer<'w, W> {
    fn new(c: &Common, out: &'w mut W) -> Self {
        Printer {
            out,
            json: c.json,
            threads: rayon::current_num_threads(),
            rounds: c.rounds,
            warmup: c.warmup,
            header: false,
        }
    }

    fn row(&mut self, row: Row) -> Result<()> {
        let t = &row.timing;
        if self.json {
            let mut m: Map<String, Value> = row.fields.as_object().cloned().unwrap_or_default();
            m.insert("threads".into(), json!(self.threads));
            m.insert("rounds".into(), json!(self.rounds));
            m.insert("warmup".into(), json!(self.warmup));
            m.insert("iters".into(), json!(t.iters));
            m.insert("best_s".into(), json!(t.best_s));
            m.insert("median_s".into(), json!(t.median_s));
            if let Some(r) = &row.rate {
                m.insert(format!("{}_best", r.key), json!(r.amount / t.best_s));
                m.insert(format!("{}_median", r.key), json!(r.amount / t.median_s));
            }
            writeln!(self.out, "{}", Value::Object(m))?;
        } else {
            if !self.header {
                writeln!(
                    self.out,
                    "{} threads, {} warm-up calls, {} timed samples; seconds per call",
                    self.threads, self.warmup, self.rounds
                )?;
                writeln!(
                    self.out,
                    "{:<44} {:>11} {:>11}   rate (best / median)",
                    "workload", "best", "median"
                )?;
                self.header = true;
            }
            let rate = match &row.rate {
                Some(r) => format!(
                    "{:.1} / {:.1} {}",
                    r.amount / t.best_s,
                    r.amount / t.median_s,
                    r.unit
                ),
                None => String::new(),
            };
            writeln!(
                self.out,
                "{:<44} {:>11} {:>11}   {rate}",
                row.label,
                seconds(t.best_s),
                seconds(t.median_s)
            )?;
        }
        self.out.flush()?;
        Ok(())
    }
}

/// `s` seconds in µs, ms or s.
fn seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}
