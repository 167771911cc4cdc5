//! **parallel**: an RNN's steps wait for each other and cost O(N); attention's work is
//! independent across positions and costs O(N²).
//!
//! One layer of each runs on sequences of N = 64 … 4096 tokens (one sequence, width
//! 256): an Elman layer (the recurrence), the reference attention kernel (which
//! materialises the N×N weights, as the formula is written) and the tiled kernel (which
//! never does), four heads of 64. Each is timed on one thread and on two, and the
//! slope of log time against log N is fitted over the longer half of the lengths. The
//! extra memory of one attention call is read from the caller's allocation counter
//! ([`super::Options::memory`]) when it has one.

use std::time::Instant;

use serde_json::json;

use super::report::{Claim, Lines, Options, Report, Series, Verdict};
use crate::attention::{attention, AttentionSpec, Kernel};
use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::rnn::{Elman, ElmanLayer};
use crate::tensor::Tensor;

const CLAIM: Claim = Claim {
    zh: "RNN 的计算具有强时序依赖。计算 h_t 之前，必须先得到 h_{t-1}。……RNN 处理长度为 N 的序列时，计算量大致为 O(N)。而标准 Self-Attention 需要计算 N×N 的注意力矩阵，因此计算量和显存占用大致为 O(N²)。",
    en: "An RNN's computation is strictly sequential: h_t needs h_{t-1} first. … For a sequence of length N an RNN costs about O(N), while standard self-attention computes an N×N attention matrix, so its computation and memory are about O(N²).",
};

/// Model width; attention splits it into HEADS heads of WIDTH / HEADS.
const WIDTH: usize = 256;
const HEADS: usize = 4;

/// The three layers timed.
const LAYERS: [&str; 3] = ["rnn", "attention (reference)", "attention (tiled)"];

/// Best seconds per call of `f`: calls repeat until `min_time` has passed, three times.
fn time(min_time: f64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let mut calls = 0u32;
        while calls == 0 || start.elapsed().as_secs_f64() < min_time {
            f()?;
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / calls as f64);
    }
    Ok(best)
}

/// Least-squares slope of log y against log x.
fn log_slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (lx, ly): (Vec<f64>, Vec<f64>) = points.iter().map(|&(x, y)| (x.ln(), y.ln())).unzip();
    let (mx, my) = (lx.iter().sum::<f64>() / n, ly.iter().sum::<f64>() / n);
    let cov: f64 = lx.iter().zip(&ly).map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = lx.iter().map(|x| (x - mx).powi(2)).sum();
    cov / var
}

/// Runs `f` on a pool of `threads` threads.
fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> Result<R> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::invalid("threads", e.to_string()))?;
    Ok(pool.install(f))
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let (lengths, min_time): (&[usize], f64) = if options.quick {
        (&[64, 128, 256, 512, 1024, 2048], 0.02)
    } else {
        (&[64, 128, 256, 512, 1024, 2048, 4096], 0.1)
    };
    let mut rng = Rng::new(options.seed);
    let s = 1.0 / (WIDTH as f32).sqrt();
    let rnn = Elman::new(vec![ElmanLayer {
        weight_ih: rng.tensor(&[WIDTH, WIDTH], s),
        weight_hh: rng.tensor(&[WIDTH, WIDTH], s),
        bias_ih: Tensor::zeros(&[WIDTH]),
        bias_hh: Tensor::zeros(&[WIDTH]),
    }])?;
    let reference = AttentionSpec {
        kernel: Kernel::Reference,
        ..Default::default()
    };
    let tiled = AttentionSpec::default();
    let d = WIDTH / HEADS;

    // The memory pass comes first, on the program's own pool: the pools of the timing
    // pass free their threads' buffers when they wind down, and frees on other threads
    // during a measurement would hide part of its peak.
    let mut memory = Vec::new();
    if let Some(probe) = options.memory {
        for &n in lengths {
            let (q, k, v) = (
                rng.tensor(&[1, n, HEADS, d], 1.0),
                rng.tensor(&[1, n, HEADS, d], 1.0),
                rng.tensor(&[1, n, HEADS, d], 1.0),
            );
            let mut extra = [0usize; 2];
            for (slot, spec) in [&reference, &tiled].into_iter().enumerate() {
                let before = probe.reset_peak();
                drop(attention(&q, &k, &v, spec)?);
                extra[slot] = probe.peak().saturating_sub(before);
            }
            memory.push((n, extra));
        }
    }
    // times[layer][threads − 1] = (N, seconds)
    let mut times = vec![vec![Vec::new(), Vec::new()]; LAYERS.len()];
    for &n in lengths {
        let x = rng.tensor(&[1, n, WIDTH], 1.0);
        let (q, k, v) = (
            rng.tensor(&[1, n, HEADS, d], 1.0),
            rng.tensor(&[1, n, HEADS, d], 1.0),
            rng.tensor(&[1, n, HEADS, d], 1.0),
        );
        for threads in [1, 2] {
            let t = on_threads(threads, || -> Result<[f64; 3]> {
                Ok([
                    time(min_time, || rnn.forward(&x, None, None).map(drop))?,
                    time(min_time, || attention(&q, &k, &v, &reference).map(drop))?,
                    time(min_time, || attention(&q, &k, &v, &tiled).map(drop))?,
                ])
            })??;
            for (layer, &secs) in t.iter().enumerate() {
                times[layer][threads - 1].push((n as f64, secs));
            }
            progress(&format!(
                "N = {n}, {threads} thread(s): rnn {:.3} ms, reference {:.3} ms, tiled {:.3} ms",
                t[0] * 1e3,
                t[1] * 1e3,
                t[2] * 1e3
            ));
        }
    }

    // slopes over the longer half of the lengths, where fixed costs no longer dominate
    let half = lengths.len() / 2;
    let slope = |layer: usize, threads: usize| log_slope(&times[layer][threads - 1][half..]);
    let speedup = |layer: usize| {
        let (one, two) = (&times[layer][0], &times[layer][1]);
        one.last().expect("lengths").1 / two.last().expect("lengths").1
    };
    let mut layers = serde_json::Map::new();
    for (i, name) in LAYERS.iter().enumerate() {
        layers.insert(
            name.to_string(),
            json!({
                "seconds_1_thread": times[i][0].iter().map(|&(n, s)| json!({"n": n as usize, "seconds": s})).collect::<Vec<_>>(),
                "seconds_2_threads": times[i][1].iter().map(|&(n, s)| json!({"n": n as usize, "seconds": s})).collect::<Vec<_>>(),
                "log_log_slope_1_thread": slope(i, 1),
                "speedup_2_threads_at_longest": speedup(i),
            }),
        );
    }
    let (rnn_slope, ref_slope) = (slope(0, 1), slope(1, 1));
    let (rnn_speedup, tiled_speedup) = (speedup(0), speedup(2));
    // the memory slopes, when counted: the reference's N×N weights against the tiles
    let memory_slope = |slot: usize| {
        let points: Vec<(f64, f64)> = memory[half..]
            .iter()
            .map(|&(n, extra)| (n as f64, extra[slot].max(1) as f64))
            .collect();
        (!points.is_empty()).then(|| log_slope(&points))
    };
    let (ref_memory_slope, tiled_memory_slope) = (memory_slope(0), memory_slope(1));
    let linear = (0.75..=1.3).contains(&rnn_slope);
    let quadratic = (1.7..=2.3).contains(&ref_slope)
        && ref_memory_slope.is_none_or(|m| (1.7..=2.3).contains(&m));
    let parallel = tiled_speedup >= 1.4 && rnn_speedup <= 1.25;
    let verdict = match (linear, quadratic, parallel) {
        (true, true, true) => Verdict::Supported,
        (false, false, _) => Verdict::NotSupported,
        _ => Verdict::Inconclusive,
    };
    let rule = "supported when, on one thread, the RNN's log-log slope of time against N lies in 0.75..1.3 (linear), the reference attention's slopes of time and of extra memory lie in 1.7..2.3 (quadratic), and two threads speed the tiled attention up by at least 1.4× but the RNN by at most 1.25× at the longest N; not supported when the RNN is not linear and the reference not quadratic; inconclusive otherwise".to_string();
    let memory_json: Vec<_> = memory
        .iter()
        .map(|&(n, [r, t])| json!({"n": n, "reference_bytes": r, "tiled_bytes": t}))
        .collect();
    let metrics = json!({
        "width": WIDTH,
        "heads": HEADS,
        "layers": layers,
        "attention_extra_memory": if options.memory.is_some() { json!(memory_json) } else { json!(null) },
        "memory_log_log_slope": {"reference": ref_memory_slope, "tiled": tiled_memory_slope},
    });
    let mut figures = vec![Lines {
        title: "One layer over N tokens".into(),
        x_label: "N".into(),
        y_label: "seconds per call".into(),
        log_x: true,
        log_y: true,
        series: LAYERS
            .iter()
            .enumerate()
            .flat_map(|(i, name)| {
                [1, 2].map(|threads| Series {
                    label: format!(
                        "{name}, {threads} thread{}",
                        if threads > 1 { "s" } else { "" }
                    ),
                    points: times[i][threads - 1].clone(),
                })
            })
            .collect(),
    }
    .into()];
    if !memory.is_empty() {
        figures.push(
            Lines {
                title: "Extra memory of one attention call".into(),
                x_label: "N".into(),
                y_label: "bytes".into(),
                log_x: true,
                log_y: true,
                series: vec![
                    Series {
                        label: "reference (N×N weights)".into(),
                        points: memory
                            .iter()
                            .map(|&(n, [r, _])| (n as f64, r.max(1) as f64))
                            .collect(),
                    },
                    Series {
                        label: "tiled".into(),
                        points: memory
                            .iter()
                            .map(|&(n, [_, t])| (n as f64, t.max(1) as f64))
                            .collect(),
                    },
                ],
            }
            .into(),
        );
    }
    Ok(Report {
        name: "parallel",
        claim: CLAIM,
        verdict,
        rule,
        metrics,
        figures,
    })
}
