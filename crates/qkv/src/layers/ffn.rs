//! The position-wise feed-forward network: the same two-layer MLP applied to every
//! token. Plain form W₂·act(W₁x) (original Transformer, BERT, GPT-2) or gated form
//! W_down·(act(W_gate x) ⊙ W_up x) (SwiGLU in Llama, gated-GELU in T5 v1.1).
//!
//! In a block the FFN sits inside a residual, x + ffn(norm(x)); the residual add
//! needs no backward code of its own: its gradient passes to both branches unchanged,
//! so the caller adds the FFN's dx to the residual stream's gradient.

use super::linear::Linear;
use crate::error::{Error, Result};
use crate::module::Module;
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

crate::module!(FeedForward { up, gate_up, down });

impl FeedForward {
    /// The projections, for what is done to every linear layer (packing them).
    pub fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        let gate = self.gate_up.as_mut();
        [&mut self.up, &mut self.down].into_iter().chain(gate)
    }
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
        self.forward_impl(x, None)
    }

    /// As [`FeedForward::forward`], and saves the intermediate values into `cache`
    /// (replacing what it held) for [`FeedForward::backward`].
    pub fn forward_with_cache(&self, x: &Tensor, cache: &mut FeedForwardCache) -> Result<Tensor> {
        self.forward_impl(x, Some(cache))
    }

    /// The one forward: h = up(x); a = act(h); m = a ⊙ gate_up(x) (gated) or a;
    /// y = down(m).
    fn forward_impl(&self, x: &Tensor, cache: Option<&mut FeedForwardCache>) -> Result<Tensor> {
        // a gated FFN's two products read one x: one product job for both
        let (mut m, u) = match &self.gate_up {
            Some(g) => {
                let [m, u] = Linear::forward_each([&self.up, g], x)?;
                (m, Some(u))
            }
            None => (self.up.forward(x)?, None),
        };
        let h = cache.is_some().then(|| m.clone());
        self.activation.apply_slice(m.data_mut());
        if let Some(u) = &u {
            for (a, b) in m.data_mut().iter_mut().zip(u.data()) {
                *a *= b;
            }
        }
        match (cache, h) {
            (Some(cache), Some(h)) => {
                cache.h = h;
                cache.u = u;
                cache.m = m;
                self.down.forward(&cache.m)
            }
            _ => self.down.forward(&m),
        }
    }

    /// Backward of [`FeedForward::forward_with_cache`]. dy: [.., C]; x: [.., C] as
    /// given to the forward, `cache` as it filled. **Accumulates** into `grads`, a
    /// gradient tree shaped as this layer; returns dx: [.., C].
    pub fn backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        cache: &FeedForwardCache,
        grads: &mut FeedForward,
    ) -> Result<Tensor> {
        // Everything is checked before the first gradient is touched, so an error
        // leaves `grads` as it was.
        let leading = |t: &Tensor| t.shape().split_last().map(|(_, l)| l.to_vec());
        if x.rank() == 0
            || leading(x) != leading(&cache.h)
            || cache.h.last_dim() != self.up.out_features()
            || cache.h.shape() != cache.m.shape()
            || cache
                .u
                .as_ref()
                .is_some_and(|u| u.shape() != cache.h.shape())
            || cache.u.is_some() != self.gate_up.is_some()
        {
            return Err(Error::invalid(
                "ffn cache",
                "does not hold this layer's intermediates for this x: run forward_with_cache first",
            ));
        }
        self.expect_grads(grads, "ffn grads")?;
        if dy.shape() != x.shape() {
            return Err(Error::shape(
                "ffn dy",
                format!("{:?} (the shape of x)", x.shape()),
                dy.shape(),
            ));
        }
        // forward: y = down(m)
        let dm = self.down.backward(&cache.m, dy, &mut grads.down)?;
        let h = cache.h.data();
        let mut dh = Tensor::zeros(cache.h.shape());
        let du = match (&self.gate_up, &cache.u) {
            (Some(_), Some(u)) => {
                // forward: m = act(h) ⊙ u  →  du = dm ⊙ act(h),
                //          and through a = act(h): dh = dm ⊙ u ⊙ act′(h)
                let mut du = Tensor::zeros(u.shape());
                for ((((dui, dhi), &hi), &ui), &dmi) in du
                    .data_mut()
                    .iter_mut()
                    .zip(dh.data_mut())
                    .zip(h)
                    .zip(u.data())
                    .zip(dm.data())
                {
                    *dui = dmi * self.activation.apply(hi);
                    *dhi = dmi * ui * self.activation.derivative(hi);
                }
                Some(du)
            }
            _ => {
                // forward: m = act(h)  →  dh = dm ⊙ act′(h)
                self.activation
                    .backward_slice(h, dm.data(), dh.data_mut())?;
                None
            }
        };
        // forward: h = up(x), u = gate_up(x). x feeds both, so their dx add up.
        let mut dx = self.up.backward(x, &dh, &mut grads.up)?;
        if let (Some(gate_up), Some(du), Some(g)) = (&self.gate_up, du, &mut grads.gate_up) {
            gate_up.backward_add(x, &du, g, &mut dx)?;
        }
        Ok(dx)
    }
}

/// What [`FeedForward::backward`] needs from the forward, each [.., F]: the
/// pre-activation `h = up(x)` (for act′), the gate branch `u = gate_up(x)` in the gated
/// form, and the input `m` of `down` (for down's weight gradient).
#[derive(Clone, Debug)]
pub struct FeedForwardCache {
    pub h: Tensor,
    pub u: Option<Tensor>,
    pub m: Tensor,
}

impl Default for FeedForwardCache {
    fn default() -> Self {
        FeedForwardCache {
            h: Tensor::zeros(&[0]),
            u: None,
            m: Tensor::zeros(&[0]),
        }
    }
}
