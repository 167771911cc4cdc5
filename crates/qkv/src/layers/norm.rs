//! LayerNorm and RMSNorm over the last axis, as one [`Norm`] with a [`NormKind`].
//!
//! One forward implementation: [`Norm::forward_with_cache`] runs it while saving the
//! per-row statistics the backward needs (LayerNorm: mean and 1/σ; RMSNorm: 1/rms), and
//! the plain [`Norm::forward`] runs it without saving. The backward recomputes the
//! normalised row x̂ from `x` and those statistics exactly as the forward computed it.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Inputs with at least this many elements are normalised on all threads.
const PARALLEL_ELEMS: usize = 1 << 16;

/// Columns of dw and db one task of the backward sums over every row.
const PARAM_BLOCK: usize = 64;

/// Which normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// y = (x − mean) / √(var + eps) · weight (+ bias), the biased variance as PyTorch.
    LayerNorm,
    /// y = x / √(mean(x²) + eps) · weight: no centring, no bias (Llama, T5's LayerNorm).
    RmsNorm,
}

/// A norm over the last axis. x, y: `[N, C]`; weight, bias: `[C]`.
#[derive(Clone, Debug)]
pub struct Norm {
    pub weight: Tensor,
    /// LayerNorm only, and optional there.
    pub bias: Option<Tensor>,
    pub eps: f32,
    pub kind: NormKind,
    /// The scale is 1 + weight, not weight (Gemma's RMSNorm, whose weights start at 0).
    pub unit_offset: bool,
}

crate::module!(Norm { weight, bias });

/// What [`Norm::backward`] needs from the forward: per row of `x` (`[N, C]`, the leading
/// axes flattened into N) the reciprocal scale r (1/σ or 1/rms) and, for LayerNorm, the
/// mean, both exactly as the forward used them.
#[derive(Clone, Debug, Default)]
pub struct NormCache {
    /// `[N]`, LayerNorm only
    pub mean: Vec<f32>,
    /// `[N]`
    pub rstd: Vec<f32>,
}

impl Norm {
    /// LayerNorm with `weight` `[C]` and an optional `bias` `[C]`.
    pub fn layer_norm(weight: Tensor, bias: Option<Tensor>, eps: f32) -> Result<Self> {
        Norm::new(NormKind::LayerNorm, weight, bias, eps)
    }

    /// RMSNorm with `weight` `[C]`.
    pub fn rms_norm(weight: Tensor, eps: f32) -> Result<Self> {
        Norm::new(NormKind::RmsNorm, weight, None, eps)
    }

    /// Weight `[C]` and optional bias `[C]` (LayerNorm only); eps finite and ≥ 0.
    pub fn new(kind: NormKind, weight: Tensor, bias: Option<Tensor>, eps: f32) -> Result<Self> {
        weight.expect_shape("norm.weight", &[None])?;
        if weight.numel() == 0 {
            return Err(Error::shape("norm.weight", "[C ≥ 1]", weight.shape()));
        }
        match (&bias, kind) {
            (Some(b), NormKind::LayerNorm) => {
                b.expect_shape("norm.bias", &[Some(weight.numel())])?
            }
            (Some(_), NormKind::RmsNorm) => {
                return Err(Error::invalid("norm.bias", "RMSNorm has no bias"))
            }
            (None, _) => {}
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::invalid(
                "eps",
                format!("must be finite and ≥ 0, got {eps}"),
            ));
        }
        Ok(Norm {
            weight,
            bias,
            eps,
            kind,
            unit_offset: false,
        })
    }

    /// The same norm scaling by 1 + weight (Gemma): a fresh one gets weights 0.
    pub fn with_unit_offset(mut self) -> Self {
        if !self.unit_offset {
            self.weight.data_mut().iter_mut().for_each(|w| *w -= 1.0);
        }
        self.unit_offset = true;
        self
    }

    /// The scale each column is multiplied by: the weight, or 1 + weight.
    fn scale(&self) -> std::borrow::Cow<'_, [f32]> {
        match self.unit_offset {
            false => std::borrow::Cow::Borrowed(self.weight.data()),
            true => self.weight.data().iter().map(|w| 1.0 + w).collect(),
        }
    }

    /// `layer_norm {what}` or `rms_norm {what}`, naming a tensor in an error.
    fn label(&self, what: &str) -> String {
        match self.kind {
            NormKind::LayerNorm => format!("layer_norm {what}"),
            NormKind::RmsNorm => format!("rms_norm {what}"),
        }
    }

    /// Weight 1, bias 0 (when `bias`), as a freshly initialised layer (a scale of 1).
    pub fn identity(kind: NormKind, c: usize, bias: bool, eps: f32) -> Result<Self> {
        let ones = Tensor::from_fn(&[c], |_| 1.0);
        Norm::new(kind, ones, bias.then(|| Tensor::zeros(&[c])), eps)
    }

    /// x: `[.., C]` → y: `[.., C]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_impl(x, None)
    }

    /// As [`Norm::forward`], and saves each row's statistics into `cache`
    /// (overwriting what it held) for [`Norm::backward`].
    pub fn forward_with_cache(&self, x: &Tensor, cache: &mut NormCache) -> Result<Tensor> {
        self.forward_impl(x, Some(cache))
    }

    /// [`Norm::forward`], or [`Norm::forward_with_cache`] when a cache is given.
    pub fn forward_impl(&self, x: &Tensor, mut cache: Option<&mut NormCache>) -> Result<Tensor> {
        let c = self.weight.numel();
        check_input(&self.label("input"), x, c)?;
        if let Some(cache) = cache.as_deref_mut() {
            cache.mean.clear();
            cache.rstd.clear();
        }
        let mut y = x.clone();
        let scale = self.scale();
        let w = &scale[..];
        let bias = self.bias.as_ref().map(Tensor::data);
        let row_stats = |row: &mut [f32]| {
            let (mean, r) = match self.kind {
                NormKind::LayerNorm => {
                    // Two passes (mean, then centred squares) keep precision for rows with
                    // a large common offset, where E[x²] − E[x]² would cancel; f64 sums keep
                    // the mean exact enough that x − mean is right to f32 rounding.
                    let mean = (sum_f64(row, |v| v as f64) / c as f64) as f32;
                    let var = sum_f64(row, |v| ((v - mean) as f64).powi(2)) / c as f64;
                    (mean, (1.0 / (var + self.eps as f64).sqrt()) as f32)
                }
                NormKind::RmsNorm => {
                    let ms = sum_f64(row, |v| (v as f64).powi(2)) / c as f64;
                    (0.0, (1.0 / (ms + self.eps as f64).sqrt()) as f32)
                }
            };
            for (v, wi) in row.iter_mut().zip(w) {
                *v = (*v - mean) * r * wi;
            }
            if let Some(b) = bias {
                for (v, bi) in row.iter_mut().zip(b) {
                    *v += bi;
                }
            }
            (mean, r)
        };
        // rows are independent: many of them (a batch of sentences) split over threads
        let stats: Vec<(f32, f32)> =
            if y.numel() >= PARALLEL_ELEMS && rayon::current_num_threads() > 1 {
                y.data_mut()
                    .par_chunks_exact_mut(c)
                    .map(row_stats)
                    .collect()
            } else {
                y.data_mut().chunks_exact_mut(c).map(row_stats).collect()
            };
        if let Some(cache) = cache {
            if self.kind == NormKind::LayerNorm {
                cache.mean.extend(stats.iter().map(|s| s.0));
            }
            cache.rstd.extend(stats.iter().map(|s| s.1));
        }
        Ok(y)
    }

    /// Backward of [`Norm::forward_with_cache`]. dy, x: `[.., C]` (x as given to the
    /// forward, `cache` as it filled). **Accumulates** into `grads.weight` and
    /// `grads.bias` (`[C]`, a gradient tree shaped as this layer); returns dx: `[.., C]`.
    ///
    /// With g = dy ∘ weight, row by row:
    /// - LayerNorm, x̂ = (x − mean)·r: dx = r·(g − mean(g) − x̂·mean(g ∘ x̂));
    /// - RMSNorm, r = 1/rms(x): dx = r·(g − x·r²·mean(g ∘ x)).
    pub fn backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        cache: &NormCache,
        grads: &mut Norm,
    ) -> Result<Tensor> {
        let c = self.weight.numel();
        check_input(&self.label("input"), x, c)?;
        if dy.shape() != x.shape() {
            return Err(Error::shape(
                self.label("dy"),
                format!("{:?} (the shape of x)", x.shape()),
                dy.shape(),
            ));
        }
        let rows = x.numel() / c;
        let layer = self.kind == NormKind::LayerNorm;
        if cache.rstd.len() != rows || (layer && cache.mean.len() != rows) {
            return Err(Error::invalid(
                "norm cache",
                format!(
                    "holds statistics for {} rows but x has {rows}: run forward_with_cache on this x first",
                    cache.rstd.len()
                ),
            ));
        }
        if grads.weight.shape() != [c]
            || grads.bias.as_ref().map(Tensor::shape) != self.bias.as_ref().map(Tensor::shape)
        {
            return Err(Error::shape(
                "norm grads",
                format!("[{c}] like the layer"),
                grads.weight.shape(),
            ));
        }
        // d(1 + w)/dw = 1: the weight's gradient is the scale's
        let scale = self.scale();
        let w = &scale[..];
        let (xs, gs) = (x.data(), dy.data());
        let mut dx = Tensor::zeros(x.shape());
        // dx row by row, then dw and db column block by column block: each row's and
        // each column's sums run in the order of the one-pass loop this replaced, so the
        // results are its bits, and neither pass leaves a thread waiting.
        let row_dx = |(i, dxr): (usize, &mut [f32])| {
            let (xr, gr, r) = (&xs[i * c..][..c], &gs[i * c..][..c], cache.rstd[i]);
            if layer {
                let mean = cache.mean[i];
                // forward: y = x̂·w + b  →  dx̂ = dy·w. First pass: x̂ into dx (reused
                // as scratch) and the two row sums.
                let (mut s_g, mut s_gx) = (0.0f64, 0.0f64);
                for (((d, &xi), &gi), &wi) in dxr.iter_mut().zip(xr).zip(gr).zip(w) {
                    let xhat = (xi - mean) * r;
                    let g = gi * wi;
                    s_g += g as f64;
                    s_gx += (g * xhat) as f64;
                    *d = xhat;
                }
                // forward: x̂ = (x − mean)·r with mean and r functions of the row  →
                // dx = r·(dx̂ − mean(dx̂) − x̂·mean(dx̂ ∘ x̂)).
                let (m_g, m_gx) = ((s_g / c as f64) as f32, (s_gx / c as f64) as f32);
                for ((d, &gi), &wi) in dxr.iter_mut().zip(gr).zip(w) {
                    let xhat = *d;
                    *d = r * (gi * wi - m_g - xhat * m_gx);
                }
            } else {
                // forward: y = (x·r)·w, and g = dy·w flows to x·r.
                let mut s_gx = 0.0f64;
                for ((&xi, &gi), &wi) in xr.iter().zip(gr).zip(w) {
                    s_gx += (gi * wi * xi) as f64;
                }
                // forward: r = 1/√(mean(x²) + eps), ∂r/∂xⱼ = −r³·xⱼ/C  →
                // dx = r·g − x·r³·mean(g ∘ x).
                let k = r * r * (s_gx / c as f64) as f32;
                for (((d, &xi), &gi), &wi) in dxr.iter_mut().zip(xr).zip(gr).zip(w) {
                    *d = r * (gi * wi - xi * k);
                }
            }
        };
        // forward: y = x̂·w + b (LayerNorm; RMSNorm: x̂ = x·r)  →  dw += dy·x̂, db += dy
        let block_dw = |(b, dwb): (usize, &mut [f32])| {
            let c0 = b * PARAM_BLOCK;
            for (i, &r) in cache.rstd.iter().enumerate() {
                let (xr, gr) = (
                    &xs[i * c + c0..][..dwb.len()],
                    &gs[i * c + c0..][..dwb.len()],
                );
                let mean = if layer { cache.mean[i] } else { 0.0 };
                for ((dwi, &xi), &gi) in dwb.iter_mut().zip(xr).zip(gr) {
                    *dwi += match layer {
                        true => gi * ((xi - mean) * r),
                        false => gi * (xi * r),
                    };
                }
            }
        };
        let block_db = |(b, dbb): (usize, &mut [f32])| {
            for gr in gs.chunks_exact(c) {
                for (dbi, &gi) in dbb.iter_mut().zip(&gr[b * PARAM_BLOCK..]) {
                    *dbi += gi;
                }
            }
        };
        let dw = grads.weight.data_mut();
        let db = grads.bias.as_mut().map(Tensor::data_mut);
        if xs.len() >= PARALLEL_ELEMS && rayon::current_num_threads() > 1 {
            dx.data_mut().par_chunks_mut(c).enumerate().for_each(row_dx);
            dw.par_chunks_mut(PARAM_BLOCK)
                .enumerate()
                .for_each(block_dw);
            if let Some(db) = db {
                db.par_chunks_mut(PARAM_BLOCK)
                    .enumerate()
                    .for_each(block_db);
            }
        } else {
            dx.data_mut().chunks_mut(c).enumerate().for_each(row_dx);
            dw.chunks_mut(PARAM_BLOCK).enumerate().for_each(block_dw);
            if let Some(db) = db {
                db.chunks_mut(PARAM_BLOCK).enumerate().for_each(block_db);
            }
        }
        Ok(dx)
    }
}

/// What [`maybe_norm`] keeps for the backward: the norm's input and statistics.
pub type NormTape = (Tensor, NormCache);

/// `x` through `norm` when there is one (else `x` itself); with `keep`, also what
/// [`maybe_norm_backward`] needs.
pub fn maybe_norm(
    norm: Option<&Norm>,
    x: Tensor,
    keep: bool,
) -> Result<(Tensor, Option<NormTape>)> {
    let Some(norm) = norm else {
        return Ok((x, None));
    };
    let mut stats = keep.then(NormCache::default);
    let y = norm.forward_impl(&x, stats.as_mut())?;
    Ok((y, stats.map(|s| (x, s))))
}

/// Backward of [`maybe_norm`] (with `keep`): dy → dx; **accumulates** into `grads`.
pub fn maybe_norm_backward(
    norm: Option<&Norm>,
    tape: Option<NormTape>,
    dy: Tensor,
    grads: Option<&mut Norm>,
) -> Result<Tensor> {
    match (norm, tape, grads) {
        (None, _, _) => Ok(dy),
        (Some(norm), Some((x, stats)), Some(grads)) => norm.backward(&dy, &x, &stats, grads),
        (Some(n), _, _) => Err(Error::invalid(
            n.label("backward"),
            "needs the forward's input and statistics (run it with keep) and a gradient tree with the norm",
        )),
    }
}

fn check_input(name: &str, x: &Tensor, c: usize) -> Result<()> {
    if x.rank() == 0 || x.last_dim() != c {
        return Err(Error::shape(name, format!("[.., {c}]"), x.shape()));
    }
    Ok(())
}

/// Σ f(v) over `row`, in f64 and in 8 interleaved partial sums. One running f64 sum
/// waits on each addition's latency (about 4 cycles a value, which made the norms of a
/// 900-row batch a few percent of a MiniLM forward); eight independent ones vectorise,
/// with the same f64 precision.
fn sum_f64(row: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(v);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    acc.iter().sum::<f64>() + tail
}
