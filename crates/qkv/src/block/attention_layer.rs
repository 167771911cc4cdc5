//! An attention sub-layer as models use it: project, position (RoPE), cache, attend,
//! merge heads, project out. Self-attention appends its K/V to a [`LayerKv`] when
//! decoding; cross-attention reads K/V computed once from the encoder output.

use crate::attention::{
    attention_views, AttentionSpec, Bias, CausalAlign, HeadsView, MultiHeadAttention,
};
use crate::error::Result;
use crate::models::cache::LayerKv;
use crate::position::Rope;
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct AttentionLayer {
    pub mha: MultiHeadAttention,
    /// Rotates q and k by position after projection (Llama-family).
    pub rope: Option<Rope>,
}

/// Per-call settings of a self-attention sub-layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttendOpts<'a> {
    /// [B·T] position of each new token (used by RoPE)
    pub positions: &'a [usize],
    /// [B, S] real keys, S = cached + new positions
    pub key_padding: Option<&'a [bool]>,
    pub causal: bool,
    pub window: Option<usize>,
    pub bias: Option<Bias<'a>>,
    /// `None` for 1/√D
    pub scale: Option<f32>,
}

/// Encoder-side keys `[B, S, G, D]` and values `[B, S, G, Dv]` for cross-attention.
#[derive(Clone, Debug)]
pub struct CrossKv {
    pub k: Tensor,
    pub v: Tensor,
}

impl AttentionLayer {
    /// x: [B, T, C] → [B, T, C]. With `cache`, the new K/V are appended and the T
    /// queries attend over every cached position (causal alignment bottom-right);
    /// without it they attend over themselves.
    pub fn self_attention(
        &self,
        x: &Tensor,
        opts: &AttendOpts,
        cache: Option<&mut LayerKv>,
    ) -> Result<Tensor> {
        let (mut q, mut k, v) = self.mha.project(x, None)?;
        if let Some(rope) = &self.rope {
            rope.apply(&mut q, opts.positions)?;
            rope.apply(&mut k, opts.positions)?;
        }
        let spec = AttentionSpec {
            scale: opts.scale,
            causal: opts.causal.then_some(CausalAlign::BottomRight),
            window: opts.window,
            key_padding: opts.key_padding,
            bias: opts.bias,
            ..Default::default()
        };
        let qv = HeadsView::of(&q, "q")?;
        let out = match cache {
            Some(cache) => {
                cache.append(&k, &v)?;
                attention_views(&qv, &cache.keys(), &cache.values(), &spec)?
            }
            None => attention_views(
                &qv,
                &HeadsView::of(&k, "k")?,
                &HeadsView::of(&v, "v")?,
                &spec,
            )?,
        };
        self.mha.merge_heads(out.out)
    }

    /// K/V of the encoder output `memory`: [B, S, Ckv], computed once per source.
    pub fn cross_kv(&self, memory: &Tensor) -> Result<CrossKv> {
        memory.expect_shape(
            "encoder output",
            &[None, None, Some(self.mha.wk.in_features())],
        )?;
        let (b, s) = (memory.shape()[0], memory.shape()[1]);
        let g = self.mha.n_kv_heads;
        let k = self.mha.wk.forward(memory)?;
        let v = self.mha.wv.forward(memory)?;
        let (dk, dv) = (k.last_dim() / g, v.last_dim() / g);
        Ok(CrossKv {
            k: k.reshape(&[b, s, g, dk])?,
            v: v.reshape(&[b, s, g, dv])?,
        })
    }

    /// x: [B, T, C] attends over `kv` (no causal mask). key_padding: [B, S].
    pub fn cross_attention(
        &self,
        x: &Tensor,
        kv: &CrossKv,
        key_padding: Option<&[bool]>,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        x.expect_shape("x", &[None, None, Some(self.mha.wq.in_features())])?;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let q = self
            .mha
            .wq
            .forward(x)?
            .reshape(&[b, t, self.mha.n_heads, self.mha.head_dim()])?;
        let spec = AttentionSpec {
            scale,
            key_padding,
            ..Default::default()
        };
        let out = attention_views(
            &HeadsView::of(&q, "q")?,
            &HeadsView::of(&kv.k, "k")?,
            &HeadsView::of(&kv.v, "v")?,
            &spec,
        )?;
        self.mha.merge_heads(out.out)
    }
}
