//! Pointwise activations under the names Hugging Face configs use.

use crate::error::{Error, Result};

/// An elementwise nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    /// Exact GELU, x·Φ(x) with the error function (`gelu` in HF configs).
    Gelu,
    /// The tanh approximation (`gelu_new`, `gelu_pytorch_tanh`, GPT-2's choice).
    GeluTanh,
    /// x·σ(x), also called swish (Llama's SwiGLU gate).
    Silu,
}

impl Activation {
    /// Maps a config's `hidden_act` / `activation_function` name.
    pub fn from_hf_name(name: &str) -> Result<Self> {
        match name {
            "relu" => Ok(Activation::Relu),
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
            "silu" | "swish" => Ok(Activation::Silu),
            other => Err(Error::invalid(
                "activation",
                format!("unknown activation `{other}` (known: relu, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, silu, swish)"),
            )),
        }
    }

    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Relu => x.max(0.0),
            Activation::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
            Activation::GeluTanh => {
                // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
            }
            Activation::Silu => x / (1.0 + (-x).exp()),
        }
    }

    /// Applies the activation to every element in place.
    pub fn apply_slice(self, xs: &mut [f32]) {
        for x in xs {
            *x = self.apply(*x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_and_unknown_is_named() {
        assert_eq!(
            Activation::from_hf_name("gelu_new").unwrap(),
            Activation::GeluTanh
        );
        let err = Activation::from_hf_name("mish").unwrap_err().to_string();
        assert!(err.contains("mish"));
    }

    #[test]
    fn known_values() {
        assert_eq!(Activation::Relu.apply(-2.0), 0.0);
        assert!((Activation::Silu.apply(0.0)).abs() < 1e-7);
        // GELU(1) = Φ(1) = 0.8413447
        assert!((Activation::Gelu.apply(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((Activation::GeluTanh.apply(1.0) - 0.841_192).abs() < 1e-5);
    }
}
