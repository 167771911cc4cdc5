//! The attention kernels alone on random inputs: a whole sequence forward (and
//! backward), and one decoding step against a KV cache.

use std::hint::black_box;
use std::io::Write;

use anyhow::Result;
use clap::{Args, ValueEnum};
use qkv::attention::{attention, attention_backward, HeadsView, KvDType, LayerKv};
use qkv::rng::Rng;
use qkv::{AttentionSpec, CausalAlign, Kernel};
use serde_json::json;

use super::printer::{Printer, Rate, Row};
use super::timing::{measure, Common};
use crate::cmd::shared_flags::KvDTypeFlag;

#[derive(Args)]
pub struct AttentionArgs {
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
    pub common: Common,
}

#[derive(Clone, Copy, ValueEnum)]
enum KernelArg {
    Tiled,
    Reference,
}

#[derive(Args)]
pub struct DecodeArgs {
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
    kv_dtype: KvDTypeFlag,
    #[command(flatten)]
    pub common: Common,
}

const FLOP_CONVENTION: &str =
    "forward 4·B·H·N·N·D (halved when causal); forward+backward 2.5× the forward; decode 4·B·H·S·D";

pub fn bench_attention(a: &AttentionArgs, p: &mut Printer<impl Write>) -> Result<()> {
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

pub fn bench_decode(a: &DecodeArgs, p: &mut Printer<impl Write>) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Attention {
        #[command(flatten)]
        a: AttentionArgs,
    }

    #[derive(Parser)]
    struct Decode {
        #[command(flatten)]
        a: DecodeArgs,
    }

    #[test]
    fn attention_flags_default_and_given() {
        let a = Attention::try_parse_from(["attention"]).unwrap().a;
        assert_eq!(a.n, [128, 512, 1024, 2048, 4096]);
        assert_eq!((a.heads, a.kv_heads, a.dim, a.batch), (12, 12, 64, 1));
        assert_eq!(a.kernel.name(), "tiled");
        let a = Attention::try_parse_from(
            "attention --n 16,24 --kv-heads 2 --causal --kernel reference --bf16"
                .split_whitespace(),
        )
        .unwrap()
        .a;
        assert_eq!(
            (a.n, a.kv_heads, a.causal, a.bf16),
            (vec![16, 24], 2, true, true)
        );
        assert_eq!(a.kernel.name(), "reference");
        // the bf16 forward has no backward
        assert!(Attention::try_parse_from(["attention", "--bf16", "--backward"]).is_err());
    }

    #[test]
    fn decode_flags_default_and_given() {
        let a = Decode::try_parse_from(["decode"]).unwrap().a;
        assert_eq!(a.cache, [512, 4096, 32768]);
        assert_eq!((a.heads, a.kv_heads, a.dim), (32, 8, 128));
        assert_eq!(a.kv_dtype.kv_dtype, KvDType::F32);
        let a = Decode::try_parse_from(["decode", "--cache", "32", "--kv-dtype", "bf16"])
            .unwrap()
            .a;
        assert_eq!((a.cache, a.kv_dtype.kv_dtype), (vec![32], KvDType::Bf16));
    }
}
