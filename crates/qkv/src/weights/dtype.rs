//! The number types a weight can be stored in. Activations, norms, softmax and the
//! residual stream stay f32 whatever the weights are.

use super::ggml::BlockType;
use crate::error::{Error, Result};

/// How a layer's weight is stored for its products. Stored (in a training checkpoint's
/// settings) by its [`DType::name`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DType {
    /// 4 bytes a weight: the reference.
    #[default]
    F32,
    /// 2 bytes a weight: f32's exponent range with 8 bits of precision
    /// ([`crate::weights::bf16`]).
    Bf16,
    /// 8-bit codes with one scale per 32 weights of a row, as GGUF's Q8_0
    /// ([`crate::weights::int8`]).
    Int8,
    /// 8-bit codes with one scale per row: the layout ONNX Runtime and CTranslate2 use.
    Int8Row,
    /// A GGUF file's 4- to 6-bit blocks, computed from as stored
    /// ([`crate::weights::ggml`]): a layer is loaded in them, never packed into them, so
    /// they are not among [`DType::ALL`] (a layer asked to pack into them packs in f32).
    Blocks(BlockType),
    /// A GGUF file's f16 values, computed from as stored ([`crate::weights::ggml::f16`]);
    /// likewise loaded, never packed into.
    F16,
}

impl DType {
    /// Every type a layer can be packed into, by its name.
    pub const ALL: [DType; 4] = [DType::F32, DType::Bf16, DType::Int8, DType::Int8Row];

    /// `f32`, `bf16`, `int8`, `int8-row`: the name flags and keywords take.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::Int8 => "int8",
            DType::Int8Row => "int8-row",
            DType::Blocks(t) => t.name(),
            DType::F16 => "f16",
        }
    }

    /// Bytes one weight takes, its share of the scales included (an f32 scale per 32
    /// for int8; a row's one scale is counted as nothing).
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            DType::F32 => 4.0,
            DType::Bf16 => 2.0,
            DType::Int8 => 1.0 + 4.0 / 32.0,
            DType::Int8Row => 1.0,
            DType::Blocks(t) => t.bytes() as f64 / t.weights() as f64,
            DType::F16 => 2.0,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Error;

    /// The type named `s`; anything else is an error that lists the names.
    fn from_str(s: &str) -> Result<Self> {
        if s == "f16" || BlockType::ALL.iter().any(|t| t.name() == s) {
            return Err(Error::invalid(
                "dtype",
                format!("`{s}` is a type GGUF files store: a model is loaded in it from such a file (--model FILE.gguf), not packed into it"),
            ));
        }
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
                Error::invalid("dtype", format!("`{s}` is not one of {}", names.join(", ")))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        let err = "int4".parse::<DType>().unwrap_err().to_string();
        assert!(
            err.contains("`int4`") && err.contains("f32, bf16, int8, int8-row"),
            "{err}"
        );
    }
}
