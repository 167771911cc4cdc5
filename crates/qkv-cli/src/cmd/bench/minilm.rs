//! all-MiniLM-L6-v2 sentence embeddings: a batch of generated sentences, and one
//! sentence.

use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use qkv::models::sentence::SentenceEncoder;
use qkv::rng::Rng;
use qkv::weights::DType;
use serde_json::json;

use super::printer::{merge, Printer, Rate, Row};
use super::timing::{measure, Common};
use crate::cmd::shared_flags::DTypeFlag;

#[derive(Args)]
pub struct MinilmArgs {
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
    dtype: DTypeFlag,
    #[command(flatten)]
    pub common: Common,
}

/// The single-sentence workload's sentence.
const SINGLE_SENTENCE: &str = "Attention lets every word look at all the other words.";

pub fn bench_minilm(a: &MinilmArgs, p: &mut Printer<impl Write>) -> Result<()> {
    if a.sentences == 0 || a.batch == 0 {
        bail!("--sentences and --batch must be at least 1");
    }
    let sentences = bench_sentences(a.sentences, a.common.seed);
    if a.print_sentences {
        p.line(&serde_json::to_string(&sentences)?)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_are_fixed_by_the_seed_and_every_fourth_is_chinese() {
        let s = bench_sentences(8, 0);
        assert_eq!(s.len(), 8);
        assert_eq!(s, bench_sentences(8, 0));
        assert_ne!(s, bench_sentences(8, 1));
        for (i, t) in s.iter().enumerate() {
            match i % 4 {
                3 => assert!(t.ends_with('。') && !t.contains(' '), "{t}"),
                _ => {
                    assert!(t.ends_with('.') && t.starts_with(|c: char| c.is_ascii_uppercase()));
                    assert!((5..=30).contains(&t.split_whitespace().count()), "{t}");
                }
            }
        }
    }

    #[test]
    fn cosine_of_known_vectors() {
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 2.0]), 0.0);
        assert_eq!(cosine(&[3.0, 4.0], &[6.0, 8.0]), 1.0);
        assert_eq!(cosine(&[1.0, 1.0], &[-1.0, -1.0]), -1.0);
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f64.sqrt()).abs() < 1e-12);
    }
}
