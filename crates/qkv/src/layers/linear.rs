//! y = x·Wᵀ + b, with W stored `[out, in]` as PyTorch and checkpoints store it.

use crate::error::{Error, Result};
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct Linear {
    /// [out, in]
    pub weight: Tensor,
    /// [out]
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Checks that weight is `[out, in]` and bias, if any, is `[out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        weight.expect_shape("linear.weight", &[None, None])?;
        if weight.numel() == 0 {
            return Err(Error::shape(
                "linear.weight",
                "[out ≥ 1, in ≥ 1]",
                weight.shape(),
            ));
        }
        if let Some(b) = &bias {
            b.expect_shape("linear.bias", &[Some(weight.shape()[0])])?;
        }
        Ok(Linear { weight, bias })
    }

    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// x: [..., in] → [..., out].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n_in, n_out) = (self.in_features(), self.out_features());
        if x.rank() == 0 || x.last_dim() != n_in {
            return Err(Error::shape(
                "linear input",
                format!("[.., {n_in}]"),
                x.shape(),
            ));
        }
        let rows = x.numel() / n_in;
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank checked") = n_out;
        let mut y = Tensor::zeros(&shape);
        if let Some(b) = &self.bias {
            for row in y.data_mut().chunks_exact_mut(n_out) {
                row.copy_from_slice(b.data());
            }
        }
        gemm(
            MatMut::row_major(y.data_mut(), rows, n_out),
            MatRef::row_major(x.data(), rows, n_in),
            MatRef::row_major(self.weight.data(), n_out, n_in).t(),
            1.0,
            self.bias.is_some(),
            Par::Auto,
        );
        Ok(y)
    }
}
