//! **scaling**: why the scores are divided by √d_k.
//!
//! First a probe: for queries and keys with independent unit-variance components, q·k
//! has variance d_k, so without the 1/√d_k the scores spread as the head widens and
//! softmax saturates. For d_k = 16 … 1024, 500 queries each against 16 random keys:
//! the weights' mean entropy, their mean largest weight, and the mean Frobenius norm of
//! softmax's Jacobian diag(p) − p·pᵀ (how much gradient passes back to the scores),
//! with and without the scale. Then the same small Transformer, one head of width 128,
//! trains on `copy` with the scale and without it (scale 1), and their losses are
//! compared.

use serde_json::json;

use super::report::{Claim, Lines, Options, Report, Series, Verdict};
use super::training;
use crate::error::Result;
use crate::models::{Arch, Transformer};
use crate::rng::Rng;
use crate::train::tasks::{Task, TaskOptions};
use crate::train::trainer::{evaluate, BatchSource, TaskBatches};

const CLAIM: Claim = Claim {
    zh: "除以 √d_k 是为了控制点积尺度，避免 Softmax 进入梯度极小的饱和区域。",
    en: "Dividing by √d_k keeps the dot products' scale under control, so softmax stays out of the saturated region where its gradient is tiny.",
};

const DIMS: [usize; 4] = [16, 64, 256, 1024];
const QUERIES: usize = 500;
const KEYS: usize = 16;

/// Mean (entropy, largest weight, Jacobian norm) of softmax(scale·q·Kᵀ) over QUERIES
/// random queries of width `d`, each against KEYS random keys.
fn probe(d: usize, scaled: bool, rng: &mut Rng) -> (f64, f64, f64) {
    let scale = if scaled { 1.0 / (d as f64).sqrt() } else { 1.0 };
    let (mut entropy, mut largest, mut jacobian) = (0.0, 0.0, 0.0);
    for _ in 0..QUERIES {
        let q = rng.normals(d, 1.0);
        let scores: Vec<f64> = (0..KEYS)
            .map(|_| {
                let k = rng.normals(d, 1.0);
                scale
                    * q.iter()
                        .zip(&k)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        let p: Vec<f64> = exps.iter().map(|e| e / sum).collect();
        entropy -= p
            .iter()
            .filter(|&&x| x > 0.0)
            .map(|x| x * x.ln())
            .sum::<f64>();
        largest += p.iter().copied().fold(0.0, f64::max);
        // ‖diag(p) − p·pᵀ‖_F: entry (i, j) is p_i·(δ_ij − p_j)
        let mut frob = 0.0;
        for (i, &pi) in p.iter().enumerate() {
            for (j, &pj) in p.iter().enumerate() {
                let e = pi * (if i == j { 1.0 } else { 0.0 } - pj);
                frob += e * e;
            }
        }
        jacobian += frob.sqrt();
    }
    let n = QUERIES as f64;
    (entropy / n, largest / n, jacobian / n)
}

/// Trains the one-head model on `copy`, with (`scaled`) or without the 1/√d_k; returns
/// the training loss of every step and the final held-out accuracy.
fn train(scaled: bool, steps: u64, seed: u64) -> Result<(Vec<f64>, f64)> {
    let task = Task::from_name(
        "copy",
        &TaskOptions {
            length: Some(8),
            symbols: Some(10),
            ..Default::default()
        },
    )?;
    let mut arch = Arch::gpt2(task.vocab_size(), 128, 2, 1, task.seq_len());
    if !scaled {
        arch.attention.scale = Some(1.0);
    }
    let mut model = Transformer::new(&arch, seed)?;
    let mut data = TaskBatches {
        task,
        batch_size: 32,
    };
    let eval = data.eval_batches(seed, 8)?;
    let losses = training::train(&mut model, &mut data, steps, seed)?;
    Ok((losses, evaluate(&model, &eval)?.accuracy))
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let mut rng = Rng::new(options.seed);
    let mut rows = Vec::new();
    let mut curves: Vec<Series> = Vec::new();
    for scaled in [false, true] {
        let label = if scaled { "q·k/√d_k" } else { "q·k" };
        let mut points = Vec::new();
        for d in DIMS {
            let (entropy, largest, jacobian) = probe(d, scaled, &mut rng);
            progress(&format!(
                "{label}, d_k = {d}: entropy {entropy:.3} nats, largest weight {largest:.3}, Jacobian norm {jacobian:.3}"
            ));
            rows.push(json!({
                "scaled": scaled, "d_k": d, "entropy": entropy,
                "largest_weight": largest, "jacobian_norm": jacobian,
            }));
            points.push((d as f64, jacobian.max(1e-12)));
        }
        curves.push(Series {
            label: format!("‖∂softmax/∂scores‖, {label}"),
            points,
        });
    }
    let steps = if options.quick { 300 } else { 1500 };
    let mut training = Vec::new();
    for scaled in [true, false] {
        let (losses, accuracy) = train(scaled, steps, options.seed)?;
        let label = if scaled {
            "scaled (1/√d_k)"
        } else {
            "unscaled"
        };
        progress(&format!(
            "copy, one head of 128, {label}: final loss {:.4}, held-out accuracy {accuracy:.3}",
            losses.last().copied().unwrap_or(f64::NAN)
        ));
        training.push((label, losses, accuracy));
    }

    let at = |scaled: bool, d: usize, key: &str| -> f64 {
        rows.iter()
            .find(|r| r["scaled"] == scaled && r["d_k"] == d)
            .and_then(|r| r[key].as_f64())
            .expect("a probe row")
    };
    let (narrowest, widest) = (DIMS[0], DIMS[DIMS.len() - 1]);
    // unscaled: near one-hot at the widest head, and less gradient at every widening
    let jacobians = |scaled: bool| DIMS.map(|d| at(scaled, d, "jacobian_norm"));
    let unscaled = jacobians(false);
    let saturated = at(false, widest, "largest_weight") >= 0.9
        && unscaled.windows(2).all(|w| w[1] < w[0])
        && unscaled[DIMS.len() - 1] <= 0.5 * unscaled[0];
    // scaled: the same gradient whatever d_k, and never near one-hot
    let scaled = jacobians(true);
    let kept = scaled.iter().all(|&j| (j / scaled[0] - 1.0).abs() <= 0.1)
        && DIMS.iter().all(|&d| at(true, d, "largest_weight") < 0.6);
    let verdict = match (saturated, kept) {
        (true, true) => Verdict::Supported,
        (false, _) => Verdict::NotSupported,
        _ => Verdict::Inconclusive,
    };
    let rule = format!(
        "supported when unscaled softmax saturates as d_k grows (mean largest weight ≥ 0.9 at d_k = {widest}, its Jacobian norm smaller at every wider d_k and at most half its d_k = {narrowest} value at d_k = {widest}) while scaled softmax keeps its Jacobian norm within 10% of its d_k = {narrowest} value and its largest weight below 0.6 at every d_k; not supported when unscaled softmax does not saturate so; inconclusive otherwise. The training runs are reported, not judged."
    );
    let tail_mean = |losses: &[f64]| {
        let k = (losses.len() / 10).max(1);
        losses[losses.len() - k..].iter().sum::<f64>() / k as f64
    };
    // the first step whose mean loss over the 10 steps ending there is below 0.01
    let first_below = |losses: &[f64]| {
        losses
            .windows(10)
            .position(|w| w.iter().sum::<f64>() / 10.0 < 0.01)
            .map(|i| i + 10)
    };
    let metrics = json!({
        "queries": QUERIES,
        "keys": KEYS,
        "probe": rows,
        "training": training.iter().map(|(label, losses, acc)| json!({
            "model": label,
            "task": "copy(length=8, symbols=10)",
            "steps": steps,
            "loss_last_tenth": tail_mean(losses),
            "first_step_with_10_step_mean_loss_below_0.01": first_below(losses),
            "held_out_accuracy": acc,
            "loss_by_step": losses,
        })).collect::<Vec<_>>(),
    });
    let loss_curves = training
        .iter()
        .map(|(label, losses, _)| Series {
            label: label.to_string(),
            points: losses
                .iter()
                .enumerate()
                .map(|(i, &l)| ((i + 1) as f64, l.max(1e-6)))
                .collect(),
        })
        .collect();
    Ok(Report {
        name: "scaling",
        claim: CLAIM,
        verdict,
        rule,
        metrics,
        figures: vec![
            Lines {
                title: "Gradient through softmax, 16 random keys".into(),
                x_label: "d_k".into(),
                y_label: "mean ‖diag(p) − p·pᵀ‖".into(),
                log_x: true,
                log_y: true,
                series: curves,
            }
            .into(),
            Lines {
                title: "Training loss, one head of width 128, copy".into(),
                x_label: "step".into(),
                y_label: "cross-entropy".into(),
                log_x: false,
                log_y: true,
                series: loss_curves,
            }
            .into(),
        ],
    })
}
