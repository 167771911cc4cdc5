//! Why the scores are divided by √d_k. For q, k with independent unit-variance
//! components, q·k = Σ_i q_i k_i is a sum of d_k unit-variance terms, so Var(q·k) = d_k:
//! the logits spread out as the head widens and softmax saturates towards one-hot
//! (its gradient vanishing with it). Scaling by 1/√d_k brings the variance back to 1.
//! Both effects are measured from random vectors.

use std::io::{self, Write};

use anyhow::Result;
use qkv::{attention, AttentionSpec, Tensor};
use serde::Serialize;

use super::table::Table;
use qkv::rng::Rng;

const SEED: u64 = 0x5EED_0003;
const DIMS: [usize; 4] = [16, 64, 256, 1024];
/// Independent (q, k) pairs per d_k for the variance. The sample variance of q·k has
/// relative standard error √((2 + 6/d_k)/n) (its fourth moment is 3d_k² + 6d_k), so
/// 10 000 pairs pin Var(q·k)/d_k to about ±1.6%.
const SAMPLES: usize = 10_000;
/// Queries, each with its own KEYS random keys, for the mean largest softmax weight.
const QUERIES: usize = 500;
const KEYS: usize = 16;

#[derive(Serialize)]
pub struct Scaling {
    d_k: usize,
    samples: usize,
    /// Sample variance of q·k; theory: d_k.
    var_unscaled: f64,
    /// Sample variance of q·k/√d_k; theory: 1.
    var_scaled: f64,
    queries: usize,
    keys: usize,
    /// Mean over queries of the largest weight of softmax(q·Kᵀ); 1 is one-hot.
    max_weight_unscaled: f64,
    /// The same for softmax(q·Kᵀ/√d_k).
    max_weight_scaled: f64,
}

pub fn run() -> Result<Vec<Scaling>> {
    let mut rng = Rng::new(SEED);
    DIMS.iter().map(|&d| measure(&mut rng, d)).collect()
}

fn measure(rng: &mut Rng, d: usize) -> Result<Scaling> {
    let scale = 1.0 / (d as f64).sqrt();
    let dots: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            let (q, k) = (rng.normals(d, 1.0), rng.normals(d, 1.0));
            q.iter().zip(&k).map(|(a, b)| f64::from(a * b)).sum()
        })
        .collect();
    let scaled: Vec<f64> = dots.iter().map(|x| x * scale).collect();
    // Each query is its own batch row: q [N,1,1,d], k [N,16,1,d]; v [N,16,1,1] is a
    // placeholder, only the weights [N,1,1,16] are read.
    let q = rng.tensor(&[QUERIES, 1, 1, d], 1.0);
    let k = rng.tensor(&[QUERIES, KEYS, 1, d], 1.0);
    let v = Tensor::zeros(&[QUERIES, KEYS, 1, 1]);
    Ok(Scaling {
        d_k: d,
        samples: SAMPLES,
        var_unscaled: variance(&dots),
        var_scaled: variance(&scaled),
        queries: QUERIES,
        keys: KEYS,
        max_weight_unscaled: mean_max_weight(&q, &k, &v, Some(1.0))?,
        max_weight_scaled: mean_max_weight(&q, &k, &v, None)?,
    })
}

/// Unbiased sample variance.
fn variance(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
}

/// Mean over the batch of each query's largest attention weight; `scale` None is 1/√d.
fn mean_max_weight(q: &Tensor, k: &Tensor, v: &Tensor, scale: Option<f32>) -> Result<f64> {
    let spec = AttentionSpec {
        scale,
        want_weights: true,
        ..Default::default()
    };
    let weights = attention(q, k, v, &spec)?
        .weights
        .ok_or_else(|| anyhow::anyhow!("attention returned no weights though asked for them"))?;
    let rows = weights.data().chunks_exact(KEYS);
    let n = rows.len() as f64;
    Ok(rows
        .map(|row| f64::from(row.iter().copied().fold(0.0, f32::max)))
        .sum::<f64>()
        / n)
}

pub fn write_text(rows: &[Scaling], out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "3. Scaling by √d_k: random q, k with unit-variance components"
    )?;
    writeln!(
        out,
        "  Var(q·k) grows like d_k, so raw scores push softmax towards one-hot; q·k/√d_k keeps variance ≈ 1."
    )?;
    let mut t = Table::new(&[
        "d_k",
        "Var(q·k)",
        "Var(q·k)/d_k",
        "Var(q·k/√d_k)",
        "max weight raw",
        "max weight scaled",
    ]);
    for r in rows {
        t.row(vec![
            r.d_k.to_string(),
            format!("{:.1}", r.var_unscaled),
            format!("{:.3}", r.var_unscaled / r.d_k as f64),
            format!("{:.3}", r.var_scaled),
            format!("{:.3}", r.max_weight_unscaled),
            format!("{:.3}", r.max_weight_scaled),
        ]);
    }
    t.write(out)?;
    if let Some(r) = rows.first() {
        writeln!(
            out,
            "  Variances from {} pairs per d_k; max weight: mean over {} queries of the largest of {} softmax weights.",
            r.samples, r.queries, r.keys
        )?;
    }
    Ok(())
}
