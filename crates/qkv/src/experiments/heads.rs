//! **heads**: one attention head is not enough when a position needs several relations
//! at once.
//!
//! A one-layer decoder reads rows of random symbols (3 kinds); position t must name the
//! five symbols before it, in order — one answer out of 3⁵ = 243. Each is a relation
//! to a fixed offset. One head's output is a single weighted mean of value vectors: it
//! can serve all five only by giving each offset its own weight and leaving the layer
//! above to untangle which symbol came from which position. With several heads each
//! softmax can take one or two offsets cleanly. The models differ only in how the same
//! width (d_model 64) is split into heads, so the parameter count is identical, and
//! all train for the same steps.

use serde_json::json;

use super::report::{Claim, Heatmaps, Lines, Options, Panel, Report, Series, Verdict};
use super::training::{self, Drawn};
use crate::batch::TokenBatch;
use crate::error::Result;
use crate::models::{Arch, Input, Transformer};
use crate::rng::Rng;
use crate::tensor::Tensor;
use crate::train::tasks::IGNORE_INDEX;
use crate::train::trainable::Batch;
use crate::train::trainer::{evaluate, BatchSource};

const CLAIM: Claim = Claim {
    zh: "为什么单头 attention 不够；Multi-Head Attention 到底“多”在哪里。",
    en: "Why a single attention head is not enough, and what the \"multi\" of multi-head attention buys.",
};

const SYMBOLS: usize = 3;
/// Position t answers the symbols at t − 1, …, t − OFFSETS.
const OFFSETS: usize = 5;
const CLASSES: usize = SYMBOLS.pow(OFFSETS as u32);
const LENGTH: usize = 16;
const WIDTH: usize = 64;
const HEAD_COUNTS: [usize; 3] = [1, 2, 4];

/// The task's batch source: batches of 32 rows.
fn task() -> Drawn {
    Drawn {
        batch_size: 32,
        len: LENGTH,
        salt: 0x6865_6164,
        draw: preceding,
    }
}

/// Rows of LENGTH symbols; position t ≥ OFFSETS answers the number whose base-SYMBOLS
/// digits are the symbols at t − 1 (lowest digit), …, t − OFFSETS.
fn preceding(batch_size: usize, rng: &mut Rng) -> Batch {
    let n = batch_size * LENGTH;
    let (mut inputs, mut targets) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..batch_size {
        let row: Vec<usize> = (0..LENGTH).map(|_| rng.below(SYMBOLS)).collect();
        targets.extend([IGNORE_INDEX; OFFSETS]);
        targets.extend((OFFSETS..LENGTH).map(|t| {
            (1..=OFFSETS)
                .rev()
                .fold(0, |answer, k| answer * SYMBOLS + row[t - k]) as i64
        }));
        inputs.extend(row);
    }
    Batch::rows(inputs, targets, batch_size, LENGTH)
}

/// Each head's weights `[B, H, T, T]` for `batch`.
fn weights(model: &Transformer, batch: &Batch) -> Result<Tensor> {
    let tokens = TokenBatch::new(batch.inputs.clone(), None, batch.batch, batch.len)?;
    let input = Input {
        target: Some(&tokens),
        ..Default::default()
    };
    Ok(model.forward(&input, true)?.attentions.decoder.remove(0))
}

/// Head `h`'s `[T, T]` map of row 0.
fn head_map(weights: &Tensor, h: usize) -> Vec<Vec<f64>> {
    let t = LENGTH;
    let at = |i: usize, j: usize| weights.data()[(h * t + i) * t + j] as f64;
    (0..t).map(|i| (0..t).map(|j| at(i, j)).collect()).collect()
}

/// Each head's mean weight on offsets 0..=OFFSETS back (row k: t − k), over every row
/// and every scored position: which relations the head took.
fn offset_weights(weights: &Tensor) -> Vec<Vec<f64>> {
    let [b_n, heads, t, _] = weights.shape()[..] else {
        unreachable!("attention weights are [B, H, T, S]")
    };
    let count = (b_n * (t - OFFSETS)) as f64;
    (0..heads)
        .map(|h| {
            (0..=OFFSETS)
                .map(|k| {
                    let mut sum = 0.0;
                    for b in 0..b_n {
                        for i in OFFSETS..t {
                            sum += weights.data()[((b * heads + h) * t + i) * t + i - k] as f64;
                        }
                    }
                    sum / count
                })
                .collect()
        })
        .collect()
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let steps = if options.quick { 400 } else { 1500 };
    let mut data = task();
    let eval = data.eval_batches(options.seed, 8)?;
    let mut results = Vec::new();
    let mut curves = Vec::new();
    let mut last = None;
    for heads in HEAD_COUNTS {
        let arch = Arch::gpt2(CLASSES, WIDTH, 1, heads, LENGTH);
        let mut model = Transformer::new(&arch, options.seed)?;
        let losses = training::train(&mut model, &mut data, steps, options.seed)?;
        let accuracy = evaluate(&model, &eval)?.accuracy;
        progress(&format!(
            "{heads} head(s) of width {}: held-out accuracy {accuracy:.3}",
            WIDTH / heads
        ));
        let w = weights(&model, &eval[0])?;
        results.push(json!({
            "mean_weight_by_offset_and_head": offset_weights(&w),
            "heads": heads,
            "head_dim": WIDTH / heads,
            "parameters": model.num_params(),
            "held_out_accuracy": accuracy,
            "final_loss": losses.last(),
        }));
        last = Some(w);
        curves.push(Series {
            label: format!(
                "{heads} head{} × {}",
                if heads == 1 { "" } else { "s" },
                WIDTH / heads
            ),
            points: losses
                .iter()
                .enumerate()
                .map(|(i, &l)| ((i + 1) as f64, l.max(1e-6)))
                .collect(),
        });
    }
    let accuracy = |i: usize| results[i]["held_out_accuracy"].as_f64().expect("a metric");
    let single = accuracy(0);
    let multi = accuracy(1).max(accuracy(2));
    let verdict = if multi >= 0.9 && single <= multi - 0.2 {
        Verdict::Supported
    } else if single >= 0.9 {
        Verdict::NotSupported
    } else {
        Verdict::Inconclusive
    };
    let rule = "supported when a model with 2 or 4 heads reaches 0.9 held-out accuracy and the one-head model of the same width and parameter count stays at least 0.2 below it; not supported when the one-head model reaches 0.9; inconclusive otherwise".to_string();
    let most = last.expect("the models ran");
    let most_heads = HEAD_COUNTS[HEAD_COUNTS.len() - 1];
    let symbols: Vec<String> = eval[0].inputs[..LENGTH]
        .iter()
        .enumerate()
        .map(|(t, s)| format!("{t}:{s}"))
        .collect();
    let panels = (0..most_heads)
        .map(|h| Panel {
            label: format!("head {}", h + 1),
            values: head_map(&most, h),
        })
        .collect();
    Ok(Report {
        name: "heads",
        claim: CLAIM,
        verdict,
        rule,
        metrics: json!({
            "task": format!("position t names the {OFFSETS} symbols before it ({CLASSES} answers), rows of {LENGTH} symbols of {SYMBOLS}; one-layer decoder, d_model {WIDTH}"),
            "steps": steps,
            "chance": 1.0 / CLASSES as f64,
            "models": results,
        }),
        figures: vec![
            Lines {
                title: "Training loss: one head against several of the same total width".into(),
                x_label: "step".into(),
                y_label: "cross-entropy".into(),
                log_x: false,
                log_y: true,
                series: curves,
            }
            .into(),
            Heatmaps {
                title: format!("The {most_heads}-head model's heads on a held-out row"),
                x_label: "key position:symbol".into(),
                y_label: "query position:symbol".into(),
                columns: symbols.clone(),
                rows: symbols,
                panels,
            }
            .into(),
        ],
    })
}
