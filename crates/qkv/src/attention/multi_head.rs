//! Multi-head attention as a module: three parallel projections W_Q, W_K, W_V (one
//! linear map each, applied side by side to the same input, not stacked as layers),
//! a split into heads, the attention kernel, a merge, and the output projection W_O.

use super::{attention, AttentionOutput, AttentionSpec};
use crate::error::{Error, Result};
use crate::layers::Linear;
use crate::position::Rope;
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    /// C → H·D
    pub wq: Linear,
    /// Ckv → G·D
    pub wk: Linear,
    /// Ckv → G·Dv
    pub wv: Linear,
    /// H·Dv → C
    pub wo: Linear,
    pub n_heads: usize,
    pub n_kv_heads: usize,
}

impl MultiHeadAttention {
    /// Checks that the four projections agree on H query heads and G key/value heads.
    pub fn new(
        wq: Linear,
        wk: Linear,
        wv: Linear,
        wo: Linear,
        n_heads: usize,
        n_kv_heads: usize,
    ) -> Result<Self> {
        if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(Error::invalid(
                "n_kv_heads",
                format!("{n_kv_heads} key/value heads must divide {n_heads} query heads"),
            ));
        }
        let qd = wq.out_features();
        if !qd.is_multiple_of(n_heads) {
            return Err(Error::shape(
                "wq.weight",
                format!("[a multiple of {n_heads} heads, _]"),
                wq.weight.shape(),
            ));
        }
        let d = qd / n_heads;
        if wk.out_features() != n_kv_heads * d {
            return Err(Error::shape(
                "wk.weight",
                format!("[{}, _]", n_kv_heads * d),
                wk.weight.shape(),
            ));
        }
        if wv.in_features() != wk.in_features() || !wv.out_features().is_multiple_of(n_kv_heads) {
            return Err(Error::shape(
                "wv.weight",
                format!("[a multiple of {n_kv_heads}, {}]", wk.in_features()),
                wv.weight.shape(),
            ));
        }
        let dv = wv.out_features() / n_kv_heads;
        if wo.in_features() != n_heads * dv {
            return Err(Error::shape(
                "wo.weight",
                format!("[_, {}]", n_heads * dv),
                wo.weight.shape(),
            ));
        }
        Ok(MultiHeadAttention {
            wq,
            wk,
            wv,
            wo,
            n_heads,
            n_kv_heads,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.wq.out_features() / self.n_heads
    }

    /// x: `[B,T,C]` attends over `context`: `[B,S,Ckv]` (cross-attention), or over itself
    /// when `context` is `None`. Output `out`: `[B,T,C]`; weights, if asked: `[B,H,T,S]`.
    pub fn forward(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        spec: &AttentionSpec,
    ) -> Result<AttentionOutput> {
        let (q, k, v) = self.project(x, context)?;
        self.attend_and_merge(&q, &k, &v, spec)
    }

    /// Self-attention with RoPE: queries and keys are rotated by their positions
    /// (`positions`: `[B·T]`) after projection, before the scores.
    pub fn forward_rope(
        &self,
        x: &Tensor,
        spec: &AttentionSpec,
        rope: &Rope,
        positions: &[usize],
    ) -> Result<AttentionOutput> {
        let (mut q, mut k, v) = self.project(x, None)?;
        rope.apply(&mut q, positions)?;
        rope.apply(&mut k, positions)?;
        self.attend_and_merge(&q, &k, &v, spec)
    }

    /// Projections split into heads: q `[B,T,H,D]`, k `[B,S,G,D]`, v `[B,S,G,Dv]`.
    /// Splitting is a reshape: `[B,T,H·D]` is already `[B,T,H,D]` in row-major order.
    pub fn project(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        x.expect_shape("x", &[None, None, Some(self.wq.in_features())])?;
        let src = context.unwrap_or(x);
        src.expect_shape(
            "context",
            &[Some(x.shape()[0]), None, Some(self.wk.in_features())],
        )?;
        let (b, t, s) = (x.shape()[0], x.shape()[1], src.shape()[1]);
        let (h, g, d) = (self.n_heads, self.n_kv_heads, self.head_dim());
        let dv = self.wv.out_features() / g;
        let q = self.wq.forward(x)?.reshape(&[b, t, h, d])?;
        let k = self.wk.forward(src)?.reshape(&[b, s, g, d])?;
        let v = self.wv.forward(src)?.reshape(&[b, s, g, dv])?;
        Ok((q, k, v))
    }

    fn attend_and_merge(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<AttentionOutput> {
        let mut a = attention(q, k, v, spec)?;
        let heads = std::mem::replace(&mut a.out, Tensor::zeros(&[0]));
        a.out = self.merge_heads(heads)?;
        Ok(a)
    }

    /// Attention output heads `[B, T, H, Dv]` → W_O · concat(heads): `[B, T, C]`.
    /// Concatenating heads is a reshape: `[B,T,H,Dv]` is `[B,T,H·Dv]` in memory.
    pub fn merge_heads(&self, heads: Tensor) -> Result<Tensor> {
        heads.expect_shape("attention heads", &[None, None, Some(self.n_heads), None])?;
        let s = heads.shape().to_vec();
        let merged = heads.reshape(&[s[0], s[1], s[2] * s[3]])?;
        self.wo.forward(&merged)
    }
}
