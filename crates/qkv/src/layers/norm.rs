//! LayerNorm and RMSNorm over the last axis.
//!
//! Each has one forward implementation; [`LayerNorm::forward_with_cache`] and
//! [`RmsNorm::forward_with_cache`] run it while saving the per-row statistics the
//! backward needs (LayerNorm: mean and 1/σ; RMSNorm: 1/rms), and the plain `forward`
//! runs it without saving. The backward recomputes the normalised row x̂ from `x` and
//! those statistics exactly as the forward computed it.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// y = (x − mean) / √(var + eps) · weight + bias, with the biased variance as PyTorch.
/// x, y: `[N, C]`; weight, bias: `[C]`.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub eps: f32,
}

/// y = x / √(mean(x²) + eps) · weight: no centring, no bias (Llama, T5).
/// x, y: `[N, C]`; weight: `[C]`.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

fn check_norm_input(name: &str, x: &Tensor, c: usize) -> Result<()> {
    if x.rank() == 0 || x.last_dim() != c {
        return Err(Error::shape(name, format!("[.., {c}]"), x.shape()));
    }
    Ok(())
}

fn check_weight(name: &str, w: &Tensor) -> Result<()> {
    w.expect_shape(name, &[None])?;
    if w.numel() == 0 {
        return Err(Error::shape(name, "[C ≥ 1]", w.shape()));
    }
    Ok(())
}

fn check_eps(eps: f32) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(
            "eps",
            format!("must be finite and ≥ 0, got {eps}"),
        ));
    }
    Ok(())
}

/// What [`LayerNorm::backward`] needs from the forward: per row of `x` (`[N, C]`, the
/// leading axes flattened into N), the mean and the reciprocal standard deviation
/// 1/√(var + eps), both exactly as the forward used them.
#[derive(Clone, Debug, Default)]
pub struct LayerNormCache {
    /// `[N]`
    pub mean: Vec<f32>,
    /// `[N]`
    pub rstd: Vec<f32>,
}

/// What [`RmsNorm::backward`] needs from the forward: per row of `x` (`[N, C]`) the
/// reciprocal root mean square 1/√(mean(x²) + eps).
#[derive(Clone, Debug, Default)]
pub struct RmsNormCache {
    /// `[N]`
    pub rstd: Vec<f32>,
}

/// Gradients of a [`LayerNorm`]'s parameters.
#[derive(Clone, Debug)]
pub struct LayerNormGrads {
    /// `[C]`
    pub weight: Tensor,
    /// `[C]`, present exactly when the layer has a bias
    pub bias: Option<Tensor>,
}

/// Gradient of an [`RmsNorm`]'s weight.
#[derive(Clone, Debug)]
pub struct RmsNormGrads {
    /// `[C]`
    pub weight: Tensor,
}

impl LayerNormGrads {
    pub fn zeros(layer: &LayerNorm) -> Self {
        LayerNormGrads {
            weight: Tensor::zeros(layer.weight.shape()),
            bias: layer.bias.as_ref().map(|b| Tensor::zeros(b.shape())),
        }
    }
}

impl RmsNormGrads {
    pub fn zeros(layer: &RmsNorm) -> Self {
        RmsNormGrads {
            weight: Tensor::zeros(layer.weight.shape()),
        }
    }
}

/// Checks what every norm backward is given: dy shaped as x, statistics for every row
/// of x, a weight gradient of `[C]`. Returns the number of rows.
fn check_backward(name: &str, x: &Tensor, dy: &Tensor, stats: usize, dw: &Tensor) -> Result<usize> {
    let c = dw.numel();
    check_norm_input(&format!("{name} input"), x, c)?;
    if dy.shape() != x.shape() {
        return Err(Error::shape(
            format!("{name} dy"),
            format!("{:?} (the shape of x)", x.shape()),
            dy.shape(),
        ));
    }
    let rows = x.numel() / c;
    if stats != rows {
        return Err(Error::invalid(
            format!("{name} cache"),
            format!("holds statistics for {stats} rows but x has {rows}: run forward_with_cache on this x first"),
        ));
    }
    Ok(rows)
}

impl LayerNorm {
    pub fn new(weight: Tensor, bias: Option<Tensor>, eps: f32) -> Result<Self> {
        check_weight("layer_norm.weight", &weight)?;
        if let Some(b) = &bias {
            b.expect_shape("layer_norm.bias", &[Some(weight.numel())])?;
        }
        check_eps(eps)?;
        Ok(LayerNorm { weight, bias, eps })
    }

    /// x: `[.., C]` → y: `[.., C]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_impl(x, None)
    }

    /// As [`LayerNorm::forward`], and saves each row's mean and 1/σ into `cache`
    /// (overwriting what it held) for [`LayerNorm::backward`].
    pub fn forward_with_cache(&self, x: &Tensor, cache: &mut LayerNormCache) -> Result<Tensor> {
        self.forward_impl(x, Some(cache))
    }

    fn forward_impl(&self, x: &Tensor, mut cache: Option<&mut LayerNormCache>) -> Result<Tensor> {
        let c = self.weight.numel();
        check_norm_input("layer_norm input", x, c)?;
        if let Some(cache) = cache.as_deref_mut() {
            cache.mean.clear();
            cache.rstd.clear();
            cache.mean.reserve(x.numel() / c);
            cache.rstd.reserve(x.numel() / c);
        }
        let mut y = x.clone();
        let w = self.weight.data();
        for row in y.data_mut().chunks_exact_mut(c) {
            // Two passes (mean, then centred squares) keep precision for rows with a
            // large common offset, where E[x²] − E[x]² would cancel catastrophically;
            // f64 sums keep the mean exact enough that x − mean is right to f32 rounding.
            let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / c as f64) as f32;
            let var = row
                .iter()
                .map(|&v| ((v - mean) as f64).powi(2))
                .sum::<f64>()
                / c as f64;
            let r = (1.0 / (var + self.eps as f64).sqrt()) as f32;
            if let Some(cache) = cache.as_deref_mut() {
                cache.mean.push(mean);
                cache.rstd.push(r);
            }
            for (v, wi) in row.iter_mut().zip(w) {
                *v = (*v - mean) * r * wi;
            }
            if let Some(b) = &self.bias {
                for (v, bi) in row.iter_mut().zip(b.data()) {
                    *v += bi;
                }
            }
        }
        Ok(y)
    }

    /// Backward of [`LayerNorm::forward_with_cache`]. dy, x: `[.., C]` (x as given to
    /// the forward, `cache` as it filled). **Accumulates** into `grads.weight` and
    /// `grads.bias` (`[C]`); returns dx: `[.., C]`.
    ///
    /// With x̂ = (x − mean)·r and g = dy ∘ weight:
    /// dx = r·(g − mean(g) − x̂·mean(g ∘ x̂)), row by row.
    pub fn backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        cache: &LayerNormCache,
        grads: &mut LayerNormGrads,
    ) -> Result<Tensor> {
        let c = self.weight.numel();
        grads
            .weight
            .expect_shape("layer_norm grads.weight", &[Some(c)])?;
        let rows = check_backward("layer_norm", x, dy, cache.rstd.len(), &grads.weight)?;
        if cache.mean.len() != rows {
            return Err(Error::invalid(
                "layer_norm cache",
                "mean and rstd hold different row counts",
            ));
        }
        let mut db = match (&self.bias, &mut grads.bias) {
            (Some(_), Some(db)) => {
                db.expect_shape("layer_norm grads.bias", &[Some(c)])?;
                Some(db.data_mut())
            }
            (None, None) => None,
            (Some(_), None) => {
                return Err(Error::invalid(
                    "layer_norm grads.bias",
                    "the layer has a bias but its gradient is missing",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "layer_norm grads.bias",
                    "the layer has no bias but a bias gradient was given",
                ))
            }
        };
        let dw = grads.weight.data_mut();
        let w = self.weight.data();
        let mut dx = Tensor::zeros(x.shape());
        for (((xr, gr), dxr), (&mean, &r)) in x
            .data()
            .chunks_exact(c)
            .zip(dy.data().chunks_exact(c))
            .zip(dx.data_mut().chunks_exact_mut(c))
            .zip(cache.mean.iter().zip(&cache.rstd))
        {
            // forward: y = x̂·w + b  →  dw += dy·x̂, db += dy, dx̂ = dy·w.
            // First pass: x̂ into dx (reused as scratch) and the two row sums.
            let (mut s_g, mut s_gx) = (0.0f64, 0.0f64);
            for ((((d, &xi), &gi), &wi), dwi) in
                dxr.iter_mut().zip(xr).zip(gr).zip(w).zip(dw.iter_mut())
            {
                let xhat = (xi - mean) * r;
                let g = gi * wi;
                *dwi += gi * xhat;
                s_g += g as f64;
                s_gx += (g * xhat) as f64;
                *d = xhat;
            }
            if let Some(db) = db.as_deref_mut() {
                for (dbi, &gi) in db.iter_mut().zip(gr) {
                    *dbi += gi;
                }
            }
            // forward: x̂ = (x − mean)·r with mean and r functions of the row  →
            // dx = r·(dx̂ − mean(dx̂) − x̂·mean(dx̂ ∘ x̂)).
            let (m_g, m_gx) = ((s_g / c as f64) as f32, (s_gx / c as f64) as f32);
            for ((d, &gi), &wi) in dxr.iter_mut().zip(gr).zip(w) {
                let xhat = *d;
                *d = r * (gi * wi - m_g - xhat * m_gx);
            }
        }
        Ok(dx)
    }
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f32) -> Result<Self> {
        check_weight("rms_norm.weight", &weight)?;
        check_eps(eps)?;
        Ok(RmsNorm { weight, eps })
    }

    /// x: `[.., C]` → y: `[.., C]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_impl(x, None)
    }

    /// As [`RmsNorm::forward`], and saves each row's 1/rms into `cache` (overwriting
    /// what it held) for [`RmsNorm::backward`].
    pub fn forward_with_cache(&self, x: &Tensor, cache: &mut RmsNormCache) -> Result<Tensor> {
        self.forward_impl(x, Some(cache))
    }

    fn forward_impl(&self, x: &Tensor, mut cache: Option<&mut RmsNormCache>) -> Result<Tensor> {
        let c = self.weight.numel();
        check_norm_input("rms_norm input", x, c)?;
        if let Some(cache) = cache.as_deref_mut() {
            cache.rstd.clear();
            cache.rstd.reserve(x.numel() / c);
        }
        let mut y = x.clone();
        let w = self.weight.data();
        for row in y.data_mut().chunks_exact_mut(c) {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / c as f64;
            let r = (1.0 / (ms + self.eps as f64).sqrt()) as f32;
            if let Some(cache) = cache.as_deref_mut() {
                cache.rstd.push(r);
            }
            for (v, wi) in row.iter_mut().zip(w) {
                *v = *v * r * wi;
            }
        }
        Ok(y)
    }

    /// Backward of [`RmsNorm::forward_with_cache`]. dy, x: `[.., C]` (x as given to the
    /// forward, `cache` as it filled). **Accumulates** into `grads.weight` (`[C]`);
    /// returns dx: `[.., C]`.
    ///
    /// With r = 1/rms(x) and g = dy ∘ weight: dx = r·(g − x·r²·mean(g ∘ x)), row by row.
    pub fn backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        cache: &RmsNormCache,
        grads: &mut RmsNormGrads,
    ) -> Result<Tensor> {
        let c = self.weight.numel();
        grads
            .weight
            .expect_shape("rms_norm grads.weight", &[Some(c)])?;
        check_backward("rms_norm", x, dy, cache.rstd.len(), &grads.weight)?;
        let dw = grads.weight.data_mut();
        let w = self.weight.data();
        let mut dx = Tensor::zeros(x.shape());
        for (((xr, gr), dxr), &r) in x
            .data()
            .chunks_exact(c)
            .zip(dy.data().chunks_exact(c))
            .zip(dx.data_mut().chunks_exact_mut(c))
            .zip(&cache.rstd)
        {
            // forward: y = (x·r)·w  →  dw += dy·x·r, and g = dy·w flows to x·r.
            let mut s_gx = 0.0f64;
            for (((&xi, &gi), &wi), dwi) in xr.iter().zip(gr).zip(w).zip(dw.iter_mut()) {
                *dwi += gi * (xi * r);
                s_gx += (gi * wi * xi) as f64;
            }
            // forward: r = 1/√(mean(x²) + eps), ∂r/∂xⱼ = −r³·xⱼ/C  →
            // dx = r·g − x·r³·mean(g ∘ x).
            let k = r * r * (s_gx / c as f64) as f32;
            for (((d, &xi), &gi), &wi) in dxr.iter_mut().zip(xr).zip(gr).zip(w) {
                *d = r * (gi * wi - xi * k);
            }
        }
        Ok(dx)
    }
}
