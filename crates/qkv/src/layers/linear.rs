//! y = x·Wᵀ + b, with W stored `[out, in]` as PyTorch and checkpoints store it.
//!
//! Backward (x: `[N, in]` with the leading axes flattened into N rows):
//! dW += dyᵀ·x, db += Σ_rows dy, dx = dy·W. The forward saves nothing: its input `x`
//! is all the backward needs, and the caller holds it anyway.

use crate::error::{Error, Result};
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`
    pub weight: Tensor,
    /// `[out]`
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

    /// Checks that `x` is `[.., in]`.
    fn check_input(&self, x: &Tensor) -> Result<()> {
        let n_in = self.in_features();
        if x.rank() == 0 || x.last_dim() != n_in {
            return Err(Error::shape(
                "linear input",
                format!("[.., {n_in}]"),
                x.shape(),
            ));
        }
        Ok(())
    }

    /// x: `[..., in]` → `[..., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let n_out = self.out_features();
        self.check_input(x)?;
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank checked") = n_out;
        let mut y = Tensor::zeros(&shape);
        if let Some(b) = &self.bias {
            for row in y.data_mut().chunks_exact_mut(n_out) {
                row.copy_from_slice(b.data());
            }
        }
        product_into(&mut y, x, &self.weight, 1.0, self.bias.is_some());
        Ok(y)
    }
}

/// y (+)= α·x·Wᵀ for x `[rows, in]`, W `[out, in]` read in place, y `[rows, out]`
/// (any leading axes): overwritten, or added to when `accumulate`. A tied LM head reads
/// the embedding table as its W this way.
pub fn product_into(y: &mut Tensor, x: &Tensor, w: &Tensor, alpha: f32, accumulate: bool) {
    let (n_out, n_in) = (w.shape()[0], w.shape()[1]);
    let rows = x.numel() / n_in;
    gemm(
        MatMut::row_major(y.data_mut(), rows, n_out),
        MatRef::row_major(x.data(), rows, n_in),
        MatRef::row_major(w.data(), n_out, n_in).t(),
        alpha,
        accumulate,
        Par::Auto,
    );
}

/// Backward of [`product_into`] (`y = α·x·Wᵀ`): dy `[rows, out]` → dx `[rows, in]`
/// (shaped as x), written into `dx`, or added to it when `accumulate`; **accumulates**
/// α·dyᵀ·x into `dw` `[out, in]`.
pub fn product_backward(
    x: &Tensor,
    w: &Tensor,
    alpha: f32,
    dy: &Tensor,
    dw: &mut Tensor,
    (dx, accumulate): (&mut Tensor, bool),
) {
    let (n_out, n_in) = (w.shape()[0], w.shape()[1]);
    let rows = x.numel() / n_in;
    let dy_m = MatRef::row_major(dy.data(), rows, n_out);
    // forward: y = α·x·Wᵀ  →  dW += α·dyᵀ·x   ([out, N]·[N, in])
    gemm(
        MatMut::row_major(dw.data_mut(), n_out, n_in),
        dy_m.t(),
        MatRef::row_major(x.data(), rows, n_in),
        alpha,
        true,
        Par::Auto,
    );
    // forward: y = α·x·Wᵀ  →  dx = α·dy·W   ([N, out]·[out, in])
    gemm(
        MatMut::row_major(dx.data_mut(), rows, n_in),
        dy_m,
        MatRef::row_major(w.data(), n_out, n_in),
        alpha,
        accumulate,
        Par::Auto,
    );
}

crate::module!(Linear { weight, bias });

impl Linear {
    /// Errors unless `grads` is shaped as this layer (a bias exactly when it has one).
    fn check_grads(&self, grads: &Linear) -> Result<()> {
        let same = grads.weight.shape() == self.weight.shape()
            && grads.bias.as_ref().map(Tensor::shape) == self.bias.as_ref().map(Tensor::shape);
        if !same {
            return Err(Error::shape(
                "linear grads",
                format!(
                    "{:?}{} like the layer",
                    self.weight.shape(),
                    if self.bias.is_some() {
                        " with a bias"
                    } else {
                        ""
                    }
                ),
                grads.weight.shape(),
            ));
        }
        Ok(())
    }
}

impl Linear {
    /// Backward of [`Linear::forward`]. x: `[.., in]` as given to the forward;
    /// dy: `[.., out]` with the same leading axes. **Accumulates** into `grads.weight`
    /// (`[out, in]`) and `grads.bias` (`[out]`), a gradient tree shaped as this layer;
    /// returns dx: `[.., in]`.
    pub fn backward(&self, x: &Tensor, dy: &Tensor, grads: &mut Linear) -> Result<Tensor> {
        let mut dx = Tensor::zeros(x.shape());
        self.backward_impl(x, dy, grads, (&mut dx, false))?;
        Ok(dx)
    }

    /// [`Linear::backward`] that adds dx into `dx` `[.., in]`: the input gradient of an
    /// x that feeds several layers (W_Q, W_K and W_V) is the sum of theirs.
    pub fn backward_add(
        &self,
        x: &Tensor,
        dy: &Tensor,
        grads: &mut Linear,
        dx: &mut Tensor,
    ) -> Result<()> {
        if dx.shape() != x.shape() {
            return Err(Error::shape(
                "linear dx",
                format!("{:?}", x.shape()),
                dx.shape(),
            ));
        }
        self.backward_impl(x, dy, grads, (dx, true))
    }

    fn backward_impl(
        &self,
        x: &Tensor,
        dy: &Tensor,
        grads: &mut Linear,
        dx: (&mut Tensor, bool),
    ) -> Result<()> {
        let n_out = self.out_features();
        self.check_input(x)?;
        let mut dy_shape = x.shape().to_vec();
        *dy_shape.last_mut().expect("rank checked") = n_out;
        if dy.shape() != dy_shape.as_slice() {
            return Err(Error::shape(
                "linear dy",
                format!("{dy_shape:?}"),
                dy.shape(),
            ));
        }
        self.check_grads(grads)?;
        if let Some(db) = &mut grads.bias {
            // forward: y = … + b on every row  →  db += Σ_rows dy
            let db = db.data_mut();
            for row in dy.data().chunks_exact(n_out) {
                for (g, &d) in db.iter_mut().zip(row) {
                    *g += d;
                }
            }
        }
        product_backward(x, &self.weight, 1.0, dy, &mut grads.weight, dx);
        Ok(())
    }
}
