//! LayerNorm and RMSNorm over the last axis.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// y = (x − mean) / √(var + eps) · weight + bias, with the biased variance as PyTorch.
/// x, y: [N, C]; weight, bias: [C].
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub eps: f32,
}

/// y = x / √(mean(x²) + eps) · weight: no centring, no bias (Llama, T5).
/// x, y: [N, C]; weight: [C].
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

impl LayerNorm {
    pub fn new(weight: Tensor, bias: Option<Tensor>, eps: f32) -> Result<Self> {
        check_weight("layer_norm.weight", &weight)?;
        if let Some(b) = &bias {
            b.expect_shape("layer_norm.bias", &[Some(weight.numel())])?;
        }
        check_eps(eps)?;
        Ok(LayerNorm { weight, bias, eps })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.weight.numel();
        check_norm_input("layer_norm input", x, c)?;
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
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f32) -> Result<Self> {
        check_weight("rms_norm.weight", &weight)?;
        check_eps(eps)?;
        Ok(RmsNorm { weight, eps })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.weight.numel();
        check_norm_input("rms_norm input", x, c)?;
        let mut y = x.clone();
        let w = self.weight.data();
        for row in y.data_mut().chunks_exact_mut(c) {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / c as f64;
            let r = (1.0 / (ms + self.eps as f64).sqrt()) as f32;
            for (v, wi) in row.iter_mut().zip(w) {
                *v = *v * r * wi;
            }
        }
        Ok(y)
    }
}
