//! **long_range**: does a recurrent memory forget with distance, where attention does
//! not?
//!
//! Every model learns the `first` task: read a symbol, then `d` random distractors,
//! then the separator, and answer the first symbol. A recurrent model must carry the
//! symbol through d state updates; attention can look it up in one step. Four models
//! of similar size learn it at each distance: the Elman language model (`rnn`), the
//! 2014 encoder-decoder without attention (`rnn-seq2seq`), the same with additive
//! attention (`rnn-attention`), and a one-layer Transformer decoder. Then the gradient
//! of a last-position loss is followed back through a freshly initialised RNN and a
//! freshly initialised Transformer: its norm at the input k steps back,
//! ‖∂L/∂x_{T−1−k}‖, against k.

use serde_json::json;

use super::report::{Claim, Lines, Options, Report, Series, Verdict};
use super::training;
use crate::error::Result;
use crate::models::{Arch, Transformer};
use crate::module::Module;
use crate::rng::Rng;
use crate::rnn::RnnLm;
use crate::train::recurrent::{RecurrentKind, RecurrentModel, RecurrentSpec};
use crate::train::tasks::{Task, TaskOptions, IGNORE_INDEX};
use crate::train::trainable::{Batch, TrainableModel};
use crate::train::trainer::{evaluate, BatchSource, TaskBatches};

const CLAIM: Claim = Claim {
    zh: "在 RNN 中，第 1 个词要影响第 100 个词，必须经过 99 次状态传递。路径很长，信息容易衰减，梯度也容易消失。",
    en: "In an RNN, for word 1 to affect word 100 it must pass through 99 state updates: the path is long, the information fades, and the gradient vanishes.",
};

/// Symbols of the task (chance is 1/SYMBOLS).
const SYMBOLS: usize = 10;
/// Width of each model (the RNNs' embedding, state and attention, the Transformer's
/// d_model), chosen so that each has about 21K parameters: the Elman language model is
/// one RNN, the encoder-decoders two, and attention adds its own weights.
const RNN_WIDTH: usize = 96;
const SEQ2SEQ_WIDTH: usize = 60;
const ATTENTION_WIDTH: usize = 52;
const TRANSFORMER_WIDTH: usize = 40;

/// The models compared, by their `qkv train --arch` names.
const ARCHS: [&str; 4] = ["rnn", "rnn-seq2seq", "rnn-attention", "transformer"];

fn model(arch: &str, task: &Task, seed: u64) -> Result<Box<dyn TrainableModel>> {
    let (kind, width) = match arch {
        "rnn" => (RecurrentKind::Lm, RNN_WIDTH),
        "rnn-seq2seq" => (RecurrentKind::Seq2Seq, SEQ2SEQ_WIDTH),
        "rnn-attention" => (RecurrentKind::Seq2SeqAttention, ATTENTION_WIDTH),
        _ => {
            let arch = Arch::gpt2(task.vocab_size(), TRANSFORMER_WIDTH, 1, 4, task.seq_len());
            return Ok(Box::new(Transformer::new(&arch, seed)?));
        }
    };
    let spec = RecurrentSpec {
        kind,
        vocab: task.vocab_size(),
        embedding: width,
        hidden: width,
        layers: 1,
        attention_width: width,
        separator: task.separator(),
    };
    Ok(Box::new(RecurrentModel::new(&spec, seed)?))
}

fn count_params(model: &mut dyn TrainableModel) -> usize {
    let mut n = 0;
    model.visit_params(&mut |_, p, _| n += p.numel());
    n
}

/// Trains `arch` on `first` at `distance` and returns (held-out accuracy, parameters).
fn accuracy(arch: &str, distance: usize, steps: u64, seed: u64) -> Result<(f64, usize)> {
    let task = Task::from_name(
        "first",
        &TaskOptions {
            symbols: Some(SYMBOLS),
            distance: Some(distance),
            ..Default::default()
        },
    )?;
    let mut model = model(arch, &task, seed)?;
    let params = count_params(model.as_mut());
    let mut data = TaskBatches {
        task,
        batch_size: 32,
    };
    let eval = data.eval_batches(seed, 8)?;
    training::train(model.as_mut(), &mut data, steps, seed)?;
    Ok((evaluate(model.as_ref(), &eval)?.accuracy, params))
}

/// ‖∂L/∂x_{T−1−k}‖ for k = 0..T, averaged over a batch of random sequences, where L is
/// the cross-entropy at the last position of `lm`'s logits, row b's target being the
/// token (7b + 3) mod V, a fixed target per row.
fn gradient_norms(lm: &RnnLm, steps: usize, seed: u64) -> Result<Vec<f64>> {
    let mut rng = Rng::new(seed);
    let batch = 16;
    let vocab = lm.embed.vocab_size();
    let ids: Vec<usize> = (0..batch * steps).map(|_| rng.below(vocab)).collect();
    let x = lm
        .embed
        .forward(&ids)?
        .reshape(&[batch, steps, lm.embed.dim()])?;
    let (y, cache) = lm.rnn.forward(&x, None, None)?;
    let mut logits = lm.head.forward(&y.out)?;
    // d loss / d logits: softmax − one-hot at the last position of each row, 0 elsewhere
    for (b, row) in logits
        .data_mut()
        .chunks_exact_mut(steps * vocab)
        .enumerate()
    {
        let (before, last) = row.split_at_mut((steps - 1) * vocab);
        before.fill(0.0);
        let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = last.iter().map(|v| (v - max).exp()).sum();
        last.iter_mut().for_each(|v| *v = (*v - max).exp() / sum);
        last[(b * 7 + 3) % vocab] -= 1.0; // the target's one-hot
    }
    let mut head_grads = lm.head.zeros_like();
    let d_states = lm.head.backward(&y.out, &logits, &mut head_grads)?;
    let mut rnn_grads = lm.rnn.zeros_like();
    let (dx, _) = lm.rnn.backward(&cache, &d_states, None, &mut rnn_grads)?;
    let e = lm.embed.dim();
    Ok((0..steps)
        .map(|k| {
            let t = steps - 1 - k;
            (0..batch)
                .map(|b| {
                    let v = &dx.data()[(b * steps + t) * e..][..e];
                    v.iter().map(|&g| (g as f64).powi(2)).sum::<f64>().sqrt()
                })
                .sum::<f64>()
                / batch as f64
        })
        .collect())
}

/// The same gradient norms through a fresh one-layer Transformer (Llama style: RoPE,
/// untied head), read from its token table's gradient: each sequence is `steps`
/// distinct tokens, so the table row of the token at position t receives exactly
/// ∂L/∂x_t (the untied head adds nothing to the table). Averaged over `runs` sequences.
fn transformer_gradient_norms(steps: usize, runs: usize, seed: u64) -> Result<Vec<f64>> {
    let vocab = steps + 1;
    let arch = Arch::llama(vocab, TRANSFORMER_WIDTH, 1, 4, 4, steps);
    let mut model = Transformer::new(&arch, seed)?;
    let mut rng = Rng::new(seed ^ 0x9e37_79b9);
    let mut sums = vec![0.0f64; steps];
    for _ in 0..runs {
        // a random arrangement of distinct tokens (Fisher–Yates over the vocabulary)
        let mut ids: Vec<usize> = (0..vocab).collect();
        for i in (1..vocab).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        ids.truncate(steps);
        let mut targets = vec![IGNORE_INDEX; steps];
        targets[steps - 1] = rng.below(vocab) as i64;
        let batch = Batch::rows(ids.clone(), targets, 1, steps);
        model.zero_grads();
        model.loss_and_backward(&batch)?;
        let mut table = Vec::new();
        model.visit_params(&mut |name, _, g| {
            if name == "embed_tokens.weight" {
                table = g.data().to_vec();
            }
        });
        for (k, sum) in sums.iter_mut().enumerate() {
            let row = &table[ids[steps - 1 - k] * TRANSFORMER_WIDTH..][..TRANSFORMER_WIDTH];
            *sum += row.iter().map(|&g| (g as f64).powi(2)).sum::<f64>().sqrt();
        }
    }
    Ok(sums.into_iter().map(|s| s / runs as f64).collect())
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let (distances, steps): (&[usize], u64) = if options.quick {
        (&[2, 8, 32], 400)
    } else {
        (&[2, 4, 8, 16, 32, 64, 128], 1500)
    };
    let mut curves = Vec::new();
    let mut table = serde_json::Map::new();
    for arch in ARCHS {
        let mut points = Vec::new();
        let mut params = 0;
        for &d in distances {
            let (acc, p) = accuracy(arch, d, steps, options.seed)?;
            params = p;
            progress(&format!("{arch}, distance {d}: accuracy {acc:.3}"));
            points.push((d as f64, acc));
        }
        table.insert(
            arch.to_string(),
            json!({
                "parameters": params,
                "accuracy": points.iter().map(|&(d, a)| json!({"distance": d as usize, "accuracy": a})).collect::<Vec<_>>(),
            }),
        );
        curves.push(Series {
            label: arch.to_string(),
            points,
        });
    }
    let chance = 1.0 / SYMBOLS as f64;
    curves.push(Series {
        label: "chance".into(),
        points: distances.iter().map(|&d| (d as f64, chance)).collect(),
    });

    // the gradient through a fresh RNN, over the longest distance and then some
    let probe_steps = 2 * distances[distances.len() - 1] + 1;
    let task = Task::from_name(
        "first",
        &TaskOptions {
            symbols: Some(SYMBOLS),
            distance: Some(1),
            ..Default::default()
        },
    )?;
    let spec = RecurrentSpec {
        kind: RecurrentKind::Lm,
        vocab: task.vocab_size(),
        embedding: RNN_WIDTH,
        hidden: RNN_WIDTH,
        layers: 1,
        attention_width: RNN_WIDTH,
        separator: None,
    };
    let fresh = RecurrentModel::new(&spec, options.seed)?;
    let lm = fresh.lm().expect("a language model");
    let norms = gradient_norms(lm, probe_steps, options.seed)?;
    progress(&format!(
        "gradient through the RNN: {:.2e} at the last input, {:.2e} {} steps back",
        norms[0],
        norms[probe_steps - 1],
        probe_steps - 1
    ));
    let attention_norms = transformer_gradient_norms(probe_steps, 8, options.seed)?;
    progress(&format!(
        "gradient through the Transformer: {:.2e} at the last input, {:.2e} {} steps back",
        attention_norms[0],
        attention_norms[probe_steps - 1],
        probe_steps - 1
    ));

    let longest = *distances.last().expect("distances");
    let at_longest = |arch: &str| -> f64 {
        curves[ARCHS.iter().position(|a| *a == arch).expect("an arch")]
            .points
            .last()
            .expect("points")
            .1
    };
    let recurrent_fails =
        at_longest("rnn") <= chance + 0.25 && at_longest("rnn-seq2seq") <= chance + 0.25;
    let attention_holds = at_longest("rnn-attention") >= 0.9 && at_longest("transformer") >= 0.9;
    let verdict = if recurrent_fails && attention_holds {
        Verdict::Supported
    } else if at_longest("rnn") >= 0.9 && at_longest("rnn-seq2seq") >= 0.9 {
        Verdict::NotSupported
    } else {
        Verdict::Inconclusive
    };
    let rule = format!(
        "supported when, at the longest distance ({longest}), both recurrent memories (rnn, rnn-seq2seq) stay within 0.25 of chance ({chance}) while both attention models (rnn-attention, transformer) reach 0.9; not supported when both recurrent models reach 0.9 there; inconclusive otherwise"
    );
    let metrics = json!({
        "task": "first",
        "symbols": SYMBOLS,
        "chance": chance,
        "steps": steps,
        "models": table,
        "rnn_input_gradient": {
            "steps": probe_steps,
            "norm_by_distance": norms,
        },
        "transformer_input_gradient": {
            "steps": probe_steps,
            "norm_by_distance": attention_norms,
        },
    });
    let gradient = Lines {
        title: "Gradient of a last-position loss, fresh models".into(),
        x_label: "k, steps back from the loss".into(),
        y_label: "mean ‖∂L/∂x_(T−1−k)‖".into(),
        log_x: false,
        log_y: true,
        series: vec![
            by_steps_back(format!("Elman RNN, width {RNN_WIDTH}"), &norms),
            by_steps_back(
                format!("Transformer (Llama style), 1 layer, width {TRANSFORMER_WIDTH}"),
                &attention_norms,
            ),
        ],
    }
    .into();
    Ok(Report {
        name: "long_range",
        claim: CLAIM,
        verdict,
        rule,
        metrics,
        figures: vec![
            Lines {
                title: "Recall the first token after d distractors".into(),
                x_label: "distance d".into(),
                y_label: "held-out accuracy".into(),
                log_x: true,
                log_y: false,
                series: curves,
            }
            .into(),
            gradient,
        ],
    })
}

/// Gradient norms against k, the steps back from the loss, floored above 0 for the
/// logarithmic axis.
fn by_steps_back(label: String, norms: &[f64]) -> Series {
    let points = norms.iter().enumerate();
    Series {
        label,
        points: points.map(|(k, &n)| (k as f64, n.max(1e-30))).collect(),
    }
}
