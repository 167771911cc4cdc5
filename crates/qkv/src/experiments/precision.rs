//! **precision**: with bf16 or int8 weights, does a model still attend where it does
//! in f32?
//!
//! [`Transformer::set_dtype`] computes the linear layers from rounded weights, so Q
//! and K, and with them the scores and the softmax, move, even though the softmax
//! itself stays f32. The logit or cosine error that benchmarks report says nothing
//! about where the heads look. This measures it per head: the Jensen–Shannon
//! divergence (in bits, 0 to 1) between each query row's f32 weights and the same
//! row's weights in each reduced type, averaged over the rows, and how often the row's
//! most-weighted key stays the same where f32 picks it clearly (by at least
//! 0.1 over the runner-up); beside them, the outputs' error.
//!
//! The models: a two-layer Llama-style decoder trained here to copy (each answer
//! position must find the source symbol it repeats: a lookup by position), and every
//! checkpoint in [`Options::checkpoints`] over [`SENTENCES`] (all-MiniLM-L6-v2, say).

use std::path::Path;

use serde_json::{json, Value};

use super::report::{Claim, Heatmaps, Lines, Options, Panel, Report, Series, Verdict};
use super::training;
use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::models::{load, Arch, Head, Input, ModelKind, Transformer};
use crate::ops::argmax;
use crate::tensor::Tensor;
use crate::text::Tokenizer;
use crate::train::tasks::{Task, TaskOptions};
use crate::train::trainable::Batch;
use crate::train::trainer::{evaluate, BatchSource, TaskBatches};
use crate::weights::DType;

const CLAIM: Claim = Claim {
    zh: "先用 Query 和 Key 算出“应该关注哪里”，再用这些权重对 Value 做加权求和，得到真正融合上下文后的表示。",
    en: "Query and Key first work out where to look; those weights then sum the Values into a representation that has truly taken in its context. Does that still hold when the projections are computed in bf16 or int8?",
};

/// The reduced types compared with f32.
const REDUCED: [DType; 3] = [DType::Bf16, DType::Int8, DType::Int8Row];

/// Verdict thresholds on a head's mean divergence, in bits: below the first the head
/// attends as in f32 (two keys weighted 0.5/0.5 against 0.6/0.4 differ by 0.007 bits),
/// from the second on it has visibly moved.
const SAME_BITS: f64 = 0.01;
const MOVED_BITS: f64 = 0.05;

/// A row's top key counts for the agreement only when f32 weights it at least this
/// much above the runner-up: in a near-uniform row the top key is a coin toss.
const CLEAR_LEAD: f32 = 0.1;

/// What each checkpoint reads, one sentence at a time.
pub const SENTENCES: [&str; 6] = [
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "Attention lets every position look at every other position in one step.",
    "The dog bit the man, and then the man bit the dog.",
    "Scores are divided by the square root of the key dimension before the softmax.",
    "A quantized model should still attend where the full-precision model attends.",
];

/// Copy: 8 symbols of 10, the separator, the 8 again.
const LENGTH: usize = 8;
const SYMBOLS: usize = 10;
const WIDTH: usize = 64;
const LAYERS: usize = 2;
const HEADS: usize = 4;

/// A model's attention maps (one `[B, H, T, S]` per layer) and output (`[B, T, V]`
/// logits or `[B, T, C]` states), on one input.
struct Probe {
    maps: Vec<Tensor>,
    output: Tensor,
}

/// Per head (layer-major, `layer·H + head`), summed over the query rows seen.
#[derive(Clone)]
struct HeadSums {
    js: Vec<f64>,
    rows: Vec<usize>,
    clear_rows: Vec<usize>,
    clear_same: Vec<usize>,
    worst_row: f64,
}

impl HeadSums {
    fn new(heads: usize) -> Self {
        HeadSums {
            js: vec![0.0; heads],
            rows: vec![0; heads],
            clear_rows: vec![0; heads],
            clear_same: vec![0; heads],
            worst_row: 0.0,
        }
    }

    /// Adds the rows of `reduced` against `exact`, both a layer's `[B, H, T, S]` maps.
    fn add_layer(&mut self, layer: usize, exact: &Tensor, reduced: &Tensor) {
        let [_, heads, _, s] = exact.shape()[..] else {
            unreachable!("attention weights are [B, H, T, S]")
        };
        let pairs = exact
            .data()
            .chunks_exact(s)
            .zip(reduced.data().chunks_exact(s));
        for (row, (p, q)) in pairs.enumerate() {
            let at = layer * heads + row / exact.shape()[2] % heads;
            if p.iter().all(|&x| x == 0.0) {
                continue; // a padding query: every key masked, nothing to compare
            }
            let js = js_bits(p, q);
            self.js[at] += js;
            self.rows[at] += 1;
            self.worst_row = self.worst_row.max(js);
            let top = argmax(p);
            let runner_up = p
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != top)
                .map(|(_, &x)| x)
                .fold(0.0, f32::max);
            if p[top] - runner_up >= CLEAR_LEAD {
                self.clear_rows[at] += 1;
                self.clear_same[at] += usize::from(argmax(q) == top);
            }
        }
    }

    fn mean_js(&self) -> Vec<f64> {
        self.js
            .iter()
            .zip(&self.rows)
            .map(|(&s, &n)| s / n.max(1) as f64)
            .collect()
    }

    /// The fraction of clear rows whose top key stayed, over every head; 1 when no
    /// row was clear.
    fn agreement(&self) -> f64 {
        let rows: usize = self.clear_rows.iter().sum();
        let same: usize = self.clear_same.iter().sum();
        if rows == 0 {
            1.0
        } else {
            same as f64 / rows as f64
        }
    }
}

/// Jensen–Shannon divergence of two distributions over the same keys, in bits.
pub fn js_bits(p: &[f32], q: &[f32]) -> f64 {
    let half_kl = |a: f64, m: f64| {
        if a > 0.0 {
            0.5 * a * (a / m).log2()
        } else {
            0.0
        }
    };
    p.iter()
        .zip(q)
        .map(|(&a, &b)| {
            let (a, b) = (a as f64, b as f64);
            let m = 0.5 * (a + b);
            half_kl(a, m) + half_kl(b, m)
        })
        .sum::<f64>()
        .max(0.0)
}

/// The outputs' error against f32: worst absolute difference, worst cosine of a
/// position's vector, and for a model with a head how many positions keep their
/// top-1 token.
#[derive(Default)]
struct OutputError {
    max_abs: f64,
    min_cosine: f64,
    top1_same: usize,
    positions: usize,
}

impl OutputError {
    fn new() -> Self {
        OutputError {
            min_cosine: 1.0,
            ..Default::default()
        }
    }

    fn add(&mut self, exact: &Tensor, reduced: &Tensor) {
        let c = exact.shape()[exact.shape().len() - 1];
        for (a, b) in exact
            .data()
            .chunks_exact(c)
            .zip(reduced.data().chunks_exact(c))
        {
            let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            let cosine = dot / (norm(a) * norm(b)).max(f64::MIN_POSITIVE);
            self.min_cosine = self.min_cosine.min(cosine);
            for (&x, &y) in a.iter().zip(b) {
                self.max_abs = self.max_abs.max((x - y).abs() as f64);
            }
            self.top1_same += usize::from(argmax(a) == argmax(b));
            self.positions += 1;
        }
    }
}

/// What one model's inputs are: a forward each, batch rows without padding.
enum Inputs {
    Decoder(Vec<TokenBatch>),
    Encoder(Vec<TokenBatch>),
}

impl Inputs {
    fn probe(&self, model: &Transformer) -> Result<Vec<Probe>> {
        let (batches, encoder) = match self {
            Inputs::Decoder(b) => (b, false),
            Inputs::Encoder(b) => (b, true),
        };
        batches
            .iter()
            .map(|tokens| {
                let input = match encoder {
                    true => Input {
                        source: Some(tokens),
                        ..Default::default()
                    },
                    false => Input {
                        target: Some(tokens),
                        ..Default::default()
                    },
                };
                let out = model.forward(&input, true)?;
                let maps = match encoder {
                    true => out.attentions.encoder,
                    false => out.attentions.decoder,
                };
                Ok(Probe {
                    maps,
                    output: out.logits,
                })
            })
            .collect()
    }

    /// The first input's first row of tokens, as the heatmaps' labels.
    fn labels(&self) -> &[usize] {
        let (Inputs::Decoder(b) | Inputs::Encoder(b)) = self;
        &b[0].ids[..b[0].len]
    }
}

/// One model against itself in every reduced type.
struct Compared {
    name: String,
    layers: usize,
    heads: usize,
    /// Per reduced type: its head sums and output error.
    by_type: Vec<(DType, HeadSums, OutputError)>,
    /// The first input's maps in f32 and then each reduced type.
    first_maps: Vec<Vec<Tensor>>,
}

fn compare(name: String, model: &mut Transformer, inputs: &Inputs) -> Result<Compared> {
    model.set_dtype(DType::F32)?;
    let exact = inputs.probe(model)?;
    let (layers, heads) = (exact[0].maps.len(), exact[0].maps[0].shape()[1]);
    let mut first_maps = vec![exact[0].maps.clone()];
    let mut by_type = Vec::new();
    for dtype in REDUCED {
        model.set_dtype(dtype)?;
        let reduced = inputs.probe(model)?;
        let (mut sums, mut error) = (HeadSums::new(layers * heads), OutputError::new());
        for (e, r) in exact.iter().zip(&reduced) {
            for (layer, (me, mr)) in e.maps.iter().zip(&r.maps).enumerate() {
                sums.add_layer(layer, me, mr);
            }
            error.add(&e.output, &r.output);
        }
        first_maps.push(reduced[0].maps.clone());
        by_type.push((dtype, sums, error));
    }
    model.set_dtype(DType::F32)?;
    Ok(Compared {
        name,
        layers,
        heads,
        by_type,
        first_maps,
    })
}

impl Compared {
    fn metrics(&self, has_head: bool) -> Value {
        let types: Vec<Value> = self
            .by_type
            .iter()
            .map(|(dtype, sums, error)| {
                let mean = sums.mean_js();
                let (worst, worst_js) = worst_head(&mean);
                let mut m = json!({
                    "dtype": dtype.name(),
                    "head_js_bits": mean.chunks(self.heads).collect::<Vec<_>>(),
                    "mean_js_bits": mean.iter().sum::<f64>() / mean.len() as f64,
                    "worst_head_js_bits": worst_js,
                    "worst_head": {"layer": worst / self.heads, "head": worst % self.heads},
                    "worst_row_js_bits": sums.worst_row,
                    "clear_rows": sums.clear_rows.iter().sum::<usize>(),
                    "clear_top_key_agreement": sums.agreement(),
                    "output_max_abs": error.max_abs,
                    "output_min_cosine": error.min_cosine,
                });
                if has_head {
                    m["top1_agreement"] = json!(error.top1_same as f64 / error.positions as f64);
                }
                m
            })
            .collect();
        json!({"model": self.name, "layers": self.layers, "heads": self.heads, "types": types})
    }

    /// The worst head's mean divergence over every reduced type.
    fn worst_js(&self) -> f64 {
        self.by_type
            .iter()
            .map(|(_, sums, _)| worst_head(&sums.mean_js()).1)
            .fold(0.0, f64::max)
    }

    fn figure(&self) -> Lines {
        let heads = (self.layers * self.heads) as f64;
        let threshold = Series {
            label: format!("{SAME_BITS} bits (the verdict's bound)"),
            points: vec![(1.0, SAME_BITS), (heads, SAME_BITS)],
        };
        Lines {
            title: format!(
                "{}: each head's mean Jensen–Shannon divergence from its f32 weights",
                self.name
            ),
            x_label: format!("head (layer × {} + head, from 1)", self.heads),
            y_label: "bits".into(),
            log_x: false,
            log_y: true,
            series: self
                .by_type
                .iter()
                .map(|(dtype, sums, _)| Series {
                    label: dtype.name().into(),
                    points: sums
                        .mean_js()
                        .iter()
                        .enumerate()
                        .map(|(i, &js)| ((i + 1) as f64, js.max(1e-9)))
                        .collect(),
                })
                .chain([threshold])
                .collect(),
        }
    }

    /// The head that moved most in int8, on the first row of the first input, in f32
    /// and in every reduced type.
    fn heatmaps(&self, labels: &[String]) -> Heatmaps {
        let int8 = self.by_type.iter().position(|(d, ..)| *d == DType::Int8);
        let (at, _) = worst_head(&self.by_type[int8.unwrap_or(0)].1.mean_js());
        let (layer, head) = (at / self.heads, at % self.heads);
        let names = std::iter::once(DType::F32).chain(REDUCED);
        let panels = names
            .zip(&self.first_maps)
            .map(|(dtype, maps)| {
                let m = &maps[layer];
                let [_, h_n, t, s] = m.shape()[..] else {
                    unreachable!("attention weights are [B, H, T, S]")
                };
                let row = |i: usize| -> Vec<f64> {
                    let start = ((head % h_n) * t + i) * s;
                    m.data()[start..start + s]
                        .iter()
                        .map(|&x| x as f64)
                        .collect()
                };
                Panel {
                    label: dtype.name().into(),
                    values: (0..t).map(row).collect(),
                }
            })
            .collect();
        Heatmaps {
            title: format!(
                "{}: layer {layer}, head {head} (the head int8 moved most), in each type",
                self.name
            ),
            x_label: "key token".into(),
            y_label: "query token".into(),
            columns: labels.to_vec(),
            rows: labels.to_vec(),
            panels,
        }
    }
}

/// (index, value) of the largest divergence.
fn worst_head(mean: &[f64]) -> (usize, f64) {
    mean.iter().copied().enumerate().fold(
        (0, 0.0),
        |best, (i, js)| if js > best.1 { (i, js) } else { best },
    )
}

/// The copying decoder, trained; with its held-out batch and accuracy.
fn trained_decoder(
    options: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<(Transformer, Batch, f64)> {
    let task = Task::from_name(
        "copy",
        &TaskOptions {
            length: Some(LENGTH),
            symbols: Some(SYMBOLS),
            ..Default::default()
        },
    )?;
    let steps = if options.quick { 400 } else { 1500 };
    let mut data = TaskBatches {
        task: task.clone(),
        batch_size: 32,
    };
    let eval = data.eval_batches(options.seed, 1)?.remove(0);
    let arch = Arch::llama(
        task.vocab_size(),
        WIDTH,
        LAYERS,
        HEADS,
        HEADS,
        task.seq_len(),
    );
    let mut model = Transformer::new(&arch, options.seed)?;
    training::train(&mut model, &mut data, steps, options.seed)?;
    let accuracy = evaluate(&model, std::slice::from_ref(&eval))?.accuracy;
    progress(&format!(
        "copying decoder ({LAYERS} layers × {HEADS} heads, d_model {WIDTH}) trained {steps} steps: held-out accuracy {accuracy:.3}"
    ));
    Ok((model, eval, accuracy))
}

/// A checkpoint folder and its inputs: [`SENTENCES`] through its tokenizer.
fn checkpoint(dir: &Path) -> Result<(Transformer, Inputs, Vec<String>)> {
    let model = load(dir)?.model;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let mut batches = Vec::new();
    for text in SENTENCES {
        batches.push(TokenBatch::single(tokenizer.encode(text, true)?)?);
    }
    let labels = tokenizer
        .labels(&batches[0].ids, &[])?
        .into_iter()
        .map(|l| l.piece)
        .collect();
    let inputs = match model.kind() {
        ModelKind::Encoder => Inputs::Encoder(batches),
        ModelKind::Decoder => Inputs::Decoder(batches),
        ModelKind::EncoderDecoder => {
            return Err(Error::Unsupported(format!(
                "{}: the precision experiment reads encoders and decoders; an encoder-decoder's three kinds of attention are not compared yet",
                dir.display()
            )))
        }
    };
    Ok((model, inputs, labels))
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let (mut decoder, eval, accuracy) = trained_decoder(options, progress)?;
    let tokens = TokenBatch::new(eval.inputs.clone(), None, eval.batch, eval.len)?;
    let inputs = Inputs::Decoder(vec![tokens]);
    let labels: Vec<String> = inputs.labels().iter().map(usize::to_string).collect();
    let mut compared = vec![(
        compare("copying decoder".into(), &mut decoder, &inputs)?,
        true,
        labels,
    )];
    for dir in options.checkpoints {
        let (mut model, inputs, labels) = checkpoint(dir)?;
        let has_head = model.arch.head != Head::None;
        let name = dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
        let c = compare(name, &mut model, &inputs)?;
        progress(&format!(
            "{}: worst head's mean divergence {:.2e} bits",
            c.name,
            c.worst_js()
        ));
        compared.push((c, has_head, labels));
    }
    let worst = compared
        .iter()
        .map(|(c, ..)| c.worst_js())
        .fold(0.0, f64::max);
    let verdict = if worst < SAME_BITS {
        Verdict::Supported
    } else if worst >= MOVED_BITS {
        Verdict::NotSupported
    } else {
        Verdict::Inconclusive
    };
    let rule = format!(
        "supported when, in every model and every reduced type (bf16, int8, int8-row), each head's Jensen–Shannon divergence from its f32 weights, averaged over the query rows, stays below {SAME_BITS} bits; not supported when some head's reaches {MOVED_BITS} bits; inconclusive between"
    );
    let mut figures: Vec<_> = compared.iter().map(|(c, ..)| c.figure().into()).collect();
    figures.extend(
        compared
            .iter()
            .map(|(c, _, labels)| c.heatmaps(labels).into()),
    );
    Ok(Report {
        name: "precision",
        claim: CLAIM,
        verdict,
        rule,
        metrics: json!({
            "task": format!("copy {LENGTH} symbols of {SYMBOLS} after a separator; Llama-style decoder, {LAYERS} layers × {HEADS} heads, d_model {WIDTH}"),
            "held_out_accuracy": accuracy,
            "worst_head_js_bits": worst,
            "sentences": if options.checkpoints.is_empty() { json!([]) } else { json!(SENTENCES) },
            "models": compared.iter().map(|(c, head, _)| c.metrics(*head)).collect::<Vec<_>>(),
        }),
        figures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against scipy 1.17.1's `jensenshannon(p, q, base=2) ** 2` (the distance squared).
    #[test]
    fn js_divergence_matches_scipy() {
        let cases: [(&[f32], &[f32], f64); 4] = [
            (&[0.5, 0.5], &[0.6, 0.4], 0.007299156760473896),
            (&[1.0, 0.0], &[0.0, 1.0], 1.0),
            (
                &[0.7, 0.2, 0.1, 0.0],
                &[0.1, 0.1, 0.4, 0.4],
                0.46434782389014756,
            ),
            (&[0.25; 4], &[0.25; 4], 0.0),
        ];
        for (p, q, want) in cases {
            let got = js_bits(p, q);
            assert!(
                (got - want).abs() < 1e-6,
                "{p:?} {q:?}: {got} against {want}"
            );
            assert!((js_bits(q, p) - got).abs() < 1e-12, "symmetric");
        }
    }

    /// Rows of `[B, H, T, S]` go to their own head, padding rows to none, and a top key
    /// counts only where f32 leads clearly.
    #[test]
    fn head_sums_assign_rows_to_heads() {
        // B = 1, H = 2, T = 2, S = 2: head 0's rows equal, head 1's second row moved;
        // head 0's second query is padding (all zeros)
        let exact =
            Tensor::new(&[1, 2, 2, 2], vec![0.9, 0.1, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0]).unwrap();
        let moved =
            Tensor::new(&[1, 2, 2, 2], vec![0.9, 0.1, 0.0, 0.0, 0.5, 0.5, 0.0, 1.0]).unwrap();
        let mut sums = HeadSums::new(4);
        sums.add_layer(1, &exact, &moved);
        assert_eq!(sums.rows, vec![0, 0, 1, 2]);
        let mean = sums.mean_js();
        assert_eq!(mean[2], 0.0);
        assert!((mean[3] - 0.5).abs() < 1e-12, "{mean:?}");
        assert_eq!(sums.worst_row, 1.0);
        // clear rows: head 0's first (0.9 vs 0.1) and head 1's second (1 vs 0)
        assert_eq!((sums.clear_rows[2], sums.clear_rows[3]), (1, 1));
        assert_eq!(sums.agreement(), 0.5);
    }
}
