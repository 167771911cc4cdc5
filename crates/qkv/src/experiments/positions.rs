//! **positions**: what the position encodings promise, measured.
//!
//! - Sinusoidal: PE(pos + k) is a linear map of PE(pos), the same map M_k for every
//!   pos (the residual of M_k·PE(pos) against PE(pos + k) over a table), and
//!   ⟨PE(p), PE(p + k)⟩ depends on k alone and falls with it.
//! - RoPE: the score ⟨R(m)q, R(n)k⟩ depends only on m − n (the largest change when both
//!   positions shift together).
//! - Length extrapolation, reported and not judged: one small decoder per encoding
//!   learns `long_range` (distance 4) on rows of 16 tokens and is evaluated on rows of
//!   16, 32 and 64.

use serde_json::json;

use super::report::{Claim, Lines, Options, Report, Series, Verdict};
use super::training;
use crate::error::Result;
use crate::models::{Arch, Transformer};
use crate::position::sinusoidal::shift_matrix;
use crate::position::{sinusoidal_table, Rope, RopeLayout, SinusoidalLayout};
use crate::rng::Rng;
use crate::train::tasks::{Task, TaskOptions};
use crate::train::trainer::{evaluate, BatchSource, TaskBatches};

const CLAIM: Claim = Claim {
    zh: "对于固定偏移 k，PE_{pos+k} 可以近似由 PE_{pos} 的线性变换得到。……当两个旋转后的向量做点积时，绝对位置 m 和 n 的影响会被部分消去，保留下来的是它们之间的相对距离 m−n。",
    en: "For a fixed offset k, PE(pos + k) is a linear transform of PE(pos). … When two rotated vectors are multiplied, the absolute positions m and n cancel and what remains is their relative distance m − n.",
};

const DIM: usize = 64;
const POSITIONS: usize = 512;
const TRAIN_LEN: usize = 16;
const EVAL_LENS: [usize; 3] = [16, 32, 64];
const ENCODINGS: [&str; 5] = ["none", "sinusoidal", "learned", "rope", "alibi"];

/// max |M_k·PE(p) − PE(p + k)| over every p with p + k in the table.
fn linear_map_residual(k: usize) -> f64 {
    let table = sinusoidal_table(POSITIONS, DIM, SinusoidalLayout::Interleaved);
    let m = shift_matrix(k, DIM);
    let mut worst = 0.0f64;
    for p in 0..POSITIONS - k {
        let pe = &table.data()[p * DIM..(p + 1) * DIM];
        let want = &table.data()[(p + k) * DIM..(p + k + 1) * DIM];
        for (r, &w) in want.iter().enumerate() {
            let row = &m.data()[r * DIM..(r + 1) * DIM];
            let got: f64 = row.iter().zip(pe).map(|(&a, &b)| a as f64 * b as f64).sum();
            worst = worst.max((got - w as f64).abs());
        }
    }
    worst
}

/// ⟨PE(p), PE(p + k)⟩ averaged over p, for k = 0..=max_k.
fn dot_by_offset(max_k: usize) -> Vec<(f64, f64)> {
    let table = sinusoidal_table(POSITIONS, DIM, SinusoidalLayout::Interleaved);
    let row = |p: usize| &table.data()[p * DIM..(p + 1) * DIM];
    (0..=max_k)
        .map(|k| {
            let n = POSITIONS - max_k;
            let mean = (0..n)
                .map(|p| {
                    row(p)
                        .iter()
                        .zip(row(p + k))
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                })
                .sum::<f64>()
                / n as f64;
            (k as f64, mean)
        })
        .collect()
}

/// The largest |⟨R(m+s)q, R(n+s)k⟩ − ⟨R(m)q, R(n)k⟩| over random q, k, positions and
/// shifts s, relative to the largest |⟨R(m)q, R(n)k⟩| seen.
fn rope_shift_deviation(rng: &mut Rng) -> Result<f64> {
    let rope = Rope::new(DIM, 10_000.0, RopeLayout::HalfSplit)?;
    let rotated = |x: &[f32], pos: usize| {
        let mut v = x.to_vec();
        let (c, s) = rope.cos_sin(pos);
        rope.rotate(&mut v, &c, &s);
        v
    };
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| x as f64 * y as f64)
            .sum::<f64>()
    };
    let (mut worst, mut scale) = (0.0f64, 0.0f64);
    for _ in 0..200 {
        let (q, k) = (rng.normals(DIM, 1.0), rng.normals(DIM, 1.0));
        let (m, n) = (rng.below(256), rng.below(256));
        let base = dot(&rotated(&q, m), &rotated(&k, n));
        scale = scale.max(base.abs());
        for s in [1, 7, 100, 1000] {
            let shifted = dot(&rotated(&q, m + s), &rotated(&k, n + s));
            worst = worst.max((shifted - base).abs());
        }
    }
    Ok(worst / scale)
}

fn task(len: usize) -> Result<Task> {
    Task::from_name(
        "long_range",
        &TaskOptions {
            length: Some(len),
            distance: Some(4),
            symbols: Some(10),
            ..Default::default()
        },
    )
}

/// Trains a decoder with `encoding` at TRAIN_LEN and returns its accuracy at EVAL_LENS.
fn extrapolation(encoding: &str, steps: u64, seed: u64) -> Result<Vec<(f64, f64)>> {
    let longest = EVAL_LENS[EVAL_LENS.len() - 1];
    let mut arch = Arch::gpt2(10, 64, 2, 4, longest);
    arch.position = training::position(encoding, longest);
    arch.embed.scale = encoding == "sinusoidal";
    let mut model = Transformer::new(&arch, seed)?;
    let mut data = TaskBatches {
        task: task(TRAIN_LEN)?,
        batch_size: 32,
    };
    training::train(&mut model, &mut data, steps, seed)?;
    EVAL_LENS
        .iter()
        .map(|&len| {
            let eval = TaskBatches {
                task: task(len)?,
                batch_size: 32,
            }
            .eval_batches(seed, 4)?;
            Ok((len as f64, evaluate(&model, &eval)?.accuracy))
        })
        .collect()
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let residuals: Vec<(usize, f64)> = [1, 5, 20, 100]
        .map(|k| (k, linear_map_residual(k)))
        .to_vec();
    progress(&format!(
        "sinusoidal: largest |M_k·PE(p) − PE(p+k)| {residuals:?}"
    ));
    let dots = dot_by_offset(128);
    let mut rng = Rng::new(options.seed);
    let rope = rope_shift_deviation(&mut rng)?;
    progress(&format!(
        "RoPE: largest relative change of a score when both positions shift: {rope:.2e}"
    ));
    let steps = if options.quick { 300 } else { 1500 };
    let mut curves = Vec::new();
    let mut table = serde_json::Map::new();
    for encoding in ENCODINGS {
        let points = extrapolation(encoding, steps, options.seed)?;
        progress(&format!(
            "{encoding}: accuracy at lengths {EVAL_LENS:?}: {:?}",
            points
                .iter()
                .map(|p| (p.1 * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>()
        ));
        table.insert(
            encoding.into(),
            json!(points
                .iter()
                .map(|&(l, a)| json!({"length": l as usize, "accuracy": a}))
                .collect::<Vec<_>>()),
        );
        curves.push(Series {
            label: encoding.into(),
            points,
        });
    }
    // f32 tables: a few ulps of values of magnitude 1, summed over 64 terms
    let linear = residuals.iter().all(|&(_, r)| r <= 1e-4);
    let relative = rope <= 1e-4;
    let verdict = match (linear, relative) {
        (true, true) => Verdict::Supported,
        (false, false) => Verdict::NotSupported,
        _ => Verdict::Inconclusive,
    };
    let rule = "supported when M_k·PE(p) equals PE(p + k) within 1e-4 for k = 1, 5, 20, 100 over a 512-position table and RoPE scores change by at most 1e-4 (relative) when both positions shift by 1 to 1000; not supported when both fail; inconclusive otherwise. The extrapolation runs are reported, not judged.".to_string();
    Ok(Report {
        name: "positions",
        claim: CLAIM,
        verdict,
        rule,
        metrics: json!({
            "sinusoidal_linear_map_residual": residuals.iter().map(|&(k, r)| json!({"k": k, "max_abs": r})).collect::<Vec<_>>(),
            "sinusoidal_dot_by_offset": dots.iter().map(|&(k, d)| json!({"k": k as usize, "mean_dot": d})).collect::<Vec<_>>(),
            "rope_relative_shift_deviation": rope,
            "extrapolation": {
                "task": "long_range(distance=4, symbols=10)",
                "trained_length": TRAIN_LEN,
                "steps": steps,
                "accuracy": table,
            },
        }),
        figures: vec![
            Lines {
                title: "⟨PE(p), PE(p + k)⟩ of the sinusoidal table, d = 64".into(),
                x_label: "offset k".into(),
                y_label: "mean dot product".into(),
                log_x: false,
                log_y: false,
                series: vec![Series {
                    label: "sinusoidal".into(),
                    points: dots,
                }],
            }
            .into(),
            Lines {
                title: format!("Trained on rows of {TRAIN_LEN}, evaluated on longer rows"),
                x_label: "row length".into(),
                y_label: "held-out accuracy".into(),
                log_x: true,
                log_y: false,
                series: curves,
            }
            .into(),
        ],
    })
}
