//! A Llama (random, or a given folder or GGUF file): the prefill of a prompt, greedy
//! decoding, and decoding many sequences together as `qkv serve` batches them.

use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use qkv::attention::{KvCache, KvDType};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::{Arch, TokenBatch, Transformer};
use qkv::ops::argmax;
use qkv::rng::Rng;
use qkv::weights::DType;
use serde_json::{json, Value};

use super::accuracy::low_precision_accuracy;
use super::printer::{merge, Printer, Rate, Row};
use super::timing::{measure, Common};
use crate::cmd::load::load_model;
use crate::cmd::shared_flags::{DTypeFlag, KvDTypeFlag};

/// The sizes of a random Llama's stack.
#[derive(Args)]
pub struct Shape {
    #[arg(long, default_value_t = 512)]
    pub d_model: usize,
    #[arg(long, default_value_t = 8)]
    pub layers: usize,
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    #[arg(long, default_value_t = 4)]
    pub kv_heads: usize,
}

impl Shape {
    /// A Llama of these sizes with `vocab` tokens and `max_len` positions.
    pub fn arch(&self, vocab: usize, max_len: usize) -> Arch {
        Arch::llama(
            vocab,
            self.d_model,
            self.layers,
            self.heads,
            self.kv_heads,
            max_len,
        )
    }
}

#[derive(Args)]
pub struct LlamaArgs {
    #[command(flatten)]
    shape: Shape,
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
    dtype: DTypeFlag,
    /// The KV cache's type, for both workloads (the accuracy reference stays f32)
    #[command(flatten)]
    kv_dtype: KvDTypeFlag,
    #[command(flatten)]
    pub common: Common,
}

pub fn bench_llama(a: &LlamaArgs, p: &mut Printer<impl Write>) -> Result<()> {
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
            let model = load_model(path, dtype)?.model;
            let path = path.clone();
            let reference = move || -> Result<Transformer> {
                let mut m = qkv::models::load_in(&path, DType::F32)?.model;
                m.unpack_weights();
                Ok(m)
            };
            (model, Box::new(reference))
        }
        None => {
            let arch = a.shape.arch(a.vocab, a.max_len);
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
    // unless a tied head reads it whole; the table counts at its size as stored (a GGUF
    // file's in blocks).
    let (linear, rest) = model.weight_bytes();
    let table = match arch.head.tied() {
        true => 0,
        false => model.weights.embed_tokens.bytes(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Llama {
        #[command(flatten)]
        a: LlamaArgs,
    }

    fn flags(args: &str) -> clap::error::Result<LlamaArgs> {
        Llama::try_parse_from(args.split_whitespace()).map(|l| l.a)
    }

    #[test]
    fn flags_default_and_given() {
        let a = flags("llama").unwrap();
        let s = &a.shape;
        let sizes = (s.d_model, s.layers, s.heads, s.kv_heads, a.vocab, a.max_len);
        assert_eq!(sizes, (512, 8, 8, 4, 32000, 2048));
        assert_eq!((a.prefill, a.decode, a.decode_prompt), (512, 128, 16));
        assert!(a.rows.is_empty() && !a.last_logits && a.model.is_none());
        let a = flags("llama --rows 1,5 --dtype int8 --kv-dtype bf16").unwrap();
        let types = (a.dtype.dtype, a.kv_dtype.kv_dtype);
        assert_eq!((a.rows, types), (vec![1, 5], (DType::Int8, KvDType::Bf16)));
        // a given model is timed as it is, never saved
        assert!(flags("llama --model m --save d").is_err());
    }
}
