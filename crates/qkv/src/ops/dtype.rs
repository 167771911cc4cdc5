//! The number types a weight can be stored in. Activations, norms, softmax and the
//! residual stream stay f32 whatever the weights are.

use crate::error::{Error, Result};

/// How a layer's weight is stored for its products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DType {
    /// 4 bytes a weight: the reference.
    #[default]
    F32,
    /// 2 bytes a weight: f32's exponent range with 8 bits of precision
    /// ([`crate::ops::bf16`]).
    Bf16,
}

impl DType {
    /// Every type, by its name.
    pub const ALL: [DType; 2] = [DType::F32, DType::Bf16];

    /// `f32`, `bf16`: the name flags and keywords take.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }

    /// Bytes one weight takes.
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
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
        assert!(err.contains("`int4`") && err.contains("f32, bf16"), "{err}");
    }
}
