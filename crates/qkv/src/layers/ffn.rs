//! The position-wise feed-forward network: the same two-layer MLP applied to every
//! token. Plain form W₂·act(W₁x) (original Transformer, BERT, GPT-2) or gated form
//! W_down·(act(W_gate x) ⊙ W_up x) (SwiGLU in Llama, gated-GELU in T5 v1.1).

use crate::error::{Error, Result};
use crate::layers::Linear;
use crate::ops::Activation;
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct FeedForward {
    /// C → F (the gate in the gated form)
    pub up: Linear,
    /// C → F, multiplied into act(up x) when present
    pub gate_up: Option<Linear>,
    /// F → C
    pub down: Linear,
    pub activation: Activation,
}

impl FeedForward {
    pub fn new(
        up: Linear,
        gate_up: Option<Linear>,
        down: Linear,
        activation: Activation,
    ) -> Result<Self> {
        let f = up.out_features();
        if down.in_features() != f {
            return Err(Error::shape(
                "ffn.down.weight",
                format!("[_, {f}]"),
                down.weight.shape(),
            ));
        }
        if let Some(g) = &gate_up {
            if g.out_features() != f || g.in_features() != up.in_features() {
                return Err(Error::shape(
                    "ffn.up.weight",
                    format!("{:?}", up.weight.shape()),
                    g.weight.shape(),
                ));
            }
        }
        Ok(FeedForward {
            up,
            gate_up,
            down,
            activation,
        })
    }

    /// x: [.., C] → [.., C].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.up.forward(x)?;
        self.activation.apply_slice(h.data_mut());
        if let Some(g) = &self.gate_up {
            let u = g.forward(x)?;
            for (a, b) in h.data_mut().iter_mut().zip(u.data()) {
                *a *= b;
            }
        }
        self.down.forward(&h)
    }
}
