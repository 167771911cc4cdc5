//! The building blocks both trainable models are assembled from — the decoder-only
//! [`DecoderLm`](super::DecoderLm) and the encoder-decoder
//! [`EncoderDecoderLm`](super::EncoderDecoderLm) — each a forward that saves what
//! its backward needs and a backward that **accumulates** into a `*Grads` struct:
//!
//! - [`Norm`]: LayerNorm or RMSNorm, as a [`NormKind`] asks;
//! - the residual wrapping of a sub-layer around its branch f, with the norm before
//!   (pre-norm, `out = x + f(norm(x))`) or after (post-norm, `out = norm(x + f(x))`):
//!   [`Norm::open`] / [`Norm::close`] around the branch, and their backward halves;
//! - [`AttnBlock`]: an attention sub-layer — self-attention (q, k, v from the stream,
//!   RoPE when configured) or cross-attention (q from the stream, k and v from the
//!   encoder's output, the *memory*);
//! - [`FfnBlock`]: a feed-forward sub-layer;
//! - [`Layer`]: self-attention then FFN, the layer of a decoder-only model and of an
//!   encoder (the mask in [`Ctx::spec`] makes the difference);
//! - token embedding plus learned or sinusoidal positions ([`embed`]), and the LM head,
//!   tied or not ([`head`]);
//! - the macros that visit a Linear's and a norm's parameters under checkpoint names.
//!
//! Shapes: B batch, T query length, S key length (S = T for self-attention), C width,
//! H heads, G key/value heads, D = C/H head width, V vocabulary, N = B·T rows.

use crate::attention::{attention, attention_backward, AttentionOutput, AttentionSpec};
use crate::error::Result;
use crate::layers::{
    Embedding, EmbeddingGrads, FeedForward, FeedForwardCache, FeedForwardGrads, LayerNorm,
    LayerNormCache, LayerNormGrads, Linear, LinearGrads, RmsNorm, RmsNormCache, RmsNormGrads,
};
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::position::Rope;
use crate::rng::Rng;
use crate::tensor::Tensor;

use super::NormKind;

/// Standard deviation of GPT-2's initialisation.
pub(super) const INIT_STD: f32 = 0.02;

/// A `[out, inp]` Linear ~ N(0, std²), with a zero bias when `bias`.
pub(super) fn init_linear(
    rng: &mut Rng,
    out: usize,
    inp: usize,
    std: f32,
    bias: bool,
) -> Result<Linear> {
    Linear::new(
        rng.tensor(&[out, inp], std),
        bias.then(|| Tensor::zeros(&[out])),
    )
}

/// x += y (a residual connection; same shapes by construction).
pub(super) fn add_into(x: &mut Tensor, y: &Tensor) {
    debug_assert_eq!(x.shape(), y.shape());
    for (a, b) in x.data_mut().iter_mut().zip(y.data()) {
        *a += b;
    }
}

/// x + y as a new tensor.
pub(super) fn add(x: &Tensor, y: &Tensor) -> Tensor {
    let mut s = x.clone();
    add_into(&mut s, y);
    s
}

// ------------------------------------------------------------------------------------
// norms and the residual wrapping
// ------------------------------------------------------------------------------------

/// LayerNorm or RMSNorm, as the config asks.
#[derive(Clone, Debug)]
pub(super) enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

#[derive(Clone, Debug)]
pub(super) enum NormGrads {
    Layer(LayerNormGrads),
    Rms(RmsNormGrads),
}

#[derive(Clone, Debug)]
pub(super) enum NormCache {
    Layer(LayerNormCache),
    Rms(RmsNormCache),
}

/// A sub-layer's forward between its two halves (see [`Norm::open`]).
pub(super) struct Opened {
    /// `[B,T,C]` the branch input: norm(x) (pre-norm) or x (post-norm)
    branch_in: Tensor,
    /// pre-norm: the stream x and the norm's statistics
    pre: Option<(Tensor, NormCache)>,
}

/// What the backward of a residual sub-layer needs besides its branch's own values.
/// Pre-norm saves norm_in = x, branch_in = norm(x); post-norm saves branch_in = x,
/// norm_in = r = x + f(x).
pub(super) struct ResidualActs {
    /// `[B,T,C]` the input of the norm
    norm_in: Tensor,
    norm: NormCache,
    /// `[B,T,C]` the input of the branch
    branch_in: Tensor,
}

impl Norm {
    /// Weight 1, bias 0 (a bias exactly for a LayerNorm with `bias`).
    pub(super) fn new(kind: NormKind, c: usize, bias: bool) -> Result<Self> {
        let ones = Tensor::from_fn(&[c], |_| 1.0);
        Ok(match kind {
            NormKind::LayerNorm { eps } => Norm::Layer(LayerNorm::new(
                ones,
                bias.then(|| Tensor::zeros(&[c])),
                eps,
            )?),
            NormKind::RmsNorm { eps } => Norm::Rms(RmsNorm::new(ones, eps)?),
        })
    }

    pub(super) fn zero_grads(&self) -> NormGrads {
        match self {
            Norm::Layer(n) => NormGrads::Layer(LayerNormGrads::zeros(n)),
            Norm::Rms(n) => NormGrads::Rms(RmsNormGrads::zeros(n)),
        }
    }

    /// x: `[.., C]` → (`[.., C]`, what the backward needs).
    pub(super) fn forward(&self, x: &Tensor) -> Result<(Tensor, NormCache)> {
        Ok(match self {
            Norm::Layer(n) => {
                let mut cache = LayerNormCache::default();
                (
                    n.forward_with_cache(x, &mut cache)?,
                    NormCache::Layer(cache),
                )
            }
            Norm::Rms(n) => {
                let mut cache = RmsNormCache::default();
                (n.forward_with_cache(x, &mut cache)?, NormCache::Rms(cache))
            }
        })
    }

    /// Accumulates into `grads`; returns dx.
    pub(super) fn backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        cache: &NormCache,
        grads: &mut NormGrads,
    ) -> Result<Tensor> {
        match (self, cache, grads) {
            (Norm::Layer(n), NormCache::Layer(c), NormGrads::Layer(g)) => n.backward(dy, x, c, g),
            (Norm::Rms(n), NormCache::Rms(c), NormGrads::Rms(g)) => n.backward(dy, x, c, g),
            _ => unreachable!("a norm, its cache and its gradient are built with the same kind"),
        }
    }

    /// First half of the residual sub-layer this norm belongs to,
    /// `pre-norm: out = x + f(norm(x))`, `post-norm: out = norm(x + f(x))`:
    /// x `[B,T,C]` → the branch input `a` ([`Opened::branch_in`]).
    pub(super) fn open(&self, pre_norm: bool, x: Tensor) -> Result<Opened> {
        if pre_norm {
            let (a, cache) = self.forward(&x)?;
            Ok(Opened {
                branch_in: a,
                pre: Some((x, cache)),
            })
        } else {
            Ok(Opened {
                branch_in: x,
                pre: None,
            })
        }
    }

    /// Second half: r = x + y with the branch output y `[B,T,C]`; out = r (pre-norm) or
    /// norm(r) (post-norm).
    pub(super) fn close(&self, opened: Opened, y: &Tensor) -> Result<(Tensor, ResidualActs)> {
        let Opened { branch_in, pre } = opened;
        match pre {
            Some((x, norm)) => {
                let r = add(&x, y);
                let acts = ResidualActs {
                    norm_in: x,
                    norm,
                    branch_in,
                };
                Ok((r, acts))
            }
            None => {
                let r = add(&branch_in, y);
                let (out, norm) = self.forward(&r)?;
                let acts = ResidualActs {
                    norm_in: r,
                    norm,
                    branch_in,
                };
                Ok((out, acts))
            }
        }
    }

    /// Backward of [`Norm::close`]: d_out → d_r, the gradient of r = x + y, which is
    /// both the branch output's gradient and the stream's share. **Accumulates** into
    /// `grads` (post-norm).
    pub(super) fn close_backward(
        &self,
        pre_norm: bool,
        acts: &ResidualActs,
        d_out: Tensor,
        grads: &mut NormGrads,
    ) -> Result<Tensor> {
        // out = r (pre-norm) or out = norm(r) (post-norm)
        if pre_norm {
            Ok(d_out)
        } else {
            self.backward(&d_out, &acts.norm_in, &acts.norm, grads)
        }
    }

    /// Backward of [`Norm::open`]: d_r (from [`Norm::close_backward`]) and the branch
    /// input's gradient → dx. **Accumulates** into `grads` (pre-norm).
    pub(super) fn open_backward(
        &self,
        pre_norm: bool,
        acts: &ResidualActs,
        d_r: Tensor,
        d_branch_in: Tensor,
        grads: &mut NormGrads,
    ) -> Result<Tensor> {
        // a = norm(x) (pre-norm) or a = x (post-norm); the residual r = x + f(a) passes
        // d_r to x as well.
        let branch = if pre_norm {
            self.backward(&d_branch_in, &acts.norm_in, &acts.norm, grads)?
        } else {
            d_branch_in
        };
        let mut dx = d_r;
        add_into(&mut dx, &branch);
        Ok(dx)
    }
}

// ------------------------------------------------------------------------------------
// attention
// ------------------------------------------------------------------------------------

/// Per-call settings of one kind of attention sub-layer (all layers of a stack share
/// them).
pub(super) struct Ctx<'a> {
    pub pre_norm: bool,
    /// RoPE of q and k; self-attention only (a cross-attention context has none).
    pub rope: Option<&'a Rope>,
    /// `[B·T]` position of each token, for RoPE
    pub positions: &'a [usize],
    /// causal mask, key padding, ALiBi: the whole attention rule
    pub spec: AttentionSpec<'a>,
    pub b: usize,
    /// query length
    pub t: usize,
    /// key length: T for self-attention, the memory's length for cross-attention
    pub s: usize,
    pub h: usize,
    pub g: usize,
    pub d: usize,
}

/// The three parallel projections W_Q, W_K, W_V of one attention sub-layer.
#[derive(Clone, Debug)]
pub(super) enum QkvProj {
    /// One Linear `[(H + 2G)·D, C]` whose row blocks are W_Q, W_K, W_V (GPT-2's
    /// `c_attn`); self-attention only.
    Fused(Linear),
    /// Three Linears `[H·D, C]`, `[G·D, C]`, `[G·D, C]`.
    Split { q: Linear, k: Linear, v: Linear },
}

#[derive(Clone, Debug)]
pub(super) enum QkvGrads {
    Fused(LinearGrads),
    Split {
        q: LinearGrads,
        k: LinearGrads,
        v: LinearGrads,
    },
}

impl QkvProj {
    pub(super) fn zero_grads(&self) -> QkvGrads {
        match self {
            QkvProj::Fused(l) => QkvGrads::Fused(LinearGrads::zeros(l)),
            QkvProj::Split { q, k, v } => QkvGrads::Split {
                q: LinearGrads::zeros(q),
                k: LinearGrads::zeros(k),
                v: LinearGrads::zeros(v),
            },
        }
    }

    /// Projections split into heads: q `[B,T,H,D]` from x `[B,T,C]`; k and v `[B,S,G,D]`
    /// from `memory` `[B,S,C]` (cross-attention) or from x (self-attention, S = T).
    fn project(
        &self,
        ctx: &Ctx,
        x: &Tensor,
        memory: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, s, h, g, d) = (ctx.b, ctx.t, ctx.s, ctx.h, ctx.g, ctx.d);
        match (self, memory) {
            (QkvProj::Split { q, k, v }, memory) => {
                let kv_in = memory.unwrap_or(x);
                Ok((
                    q.forward(x)?.reshape(&[b, t, h, d])?,
                    k.forward(kv_in)?.reshape(&[b, s, g, d])?,
                    v.forward(kv_in)?.reshape(&[b, s, g, d])?,
                ))
            }
            (QkvProj::Fused(qkv), None) => {
                // each row of y is [q (H·D) | k (G·D) | v (G·D)]
                let y = qkv.forward(x)?;
                let (hd, gd) = (h * d, g * d);
                let w = hd + 2 * gd;
                let mut q = Vec::with_capacity(b * t * hd);
                let mut k = Vec::with_capacity(b * t * gd);
                let mut v = Vec::with_capacity(b * t * gd);
                for row in y.data().chunks_exact(w) {
                    q.extend_from_slice(&row[..hd]);
                    k.extend_from_slice(&row[hd..hd + gd]);
                    v.extend_from_slice(&row[hd + gd..]);
                }
                Ok((
                    Tensor::new(&[b, t, h, d], q)?,
                    Tensor::new(&[b, t, g, d], k)?,
                    Tensor::new(&[b, t, g, d], v)?,
                ))
            }
            (QkvProj::Fused(_), Some(_)) => {
                unreachable!("fused projections are built for self-attention only")
            }
        }
    }

    /// Backward of [`QkvProj::project`]: dq `[B,T,H,D]`, dk, dv `[B,S,G,D]` → (dx `[B,T,C]`,
    /// d memory `[B,S,C]` for cross-attention). In self-attention x feeds all three
    /// projections, so their input gradients add up. **Accumulates** into `grads`.
    #[allow(clippy::too_many_arguments)]
    fn project_backward(
        &self,
        ctx: &Ctx,
        x: &Tensor,
        memory: Option<&Tensor>,
        dq: Tensor,
        dk: Tensor,
        dv: Tensor,
        grads: &mut QkvGrads,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (b, t, s, h, g, d) = (ctx.b, ctx.t, ctx.s, ctx.h, ctx.g, ctx.d);
        match (self, grads) {
            (
                QkvProj::Split { q, k, v },
                QkvGrads::Split {
                    q: gq,
                    k: gk,
                    v: gv,
                },
            ) => {
                // forward: q = W_Q·x, k = W_K·kv, v = W_V·kv (kv = memory or x)
                let mut dx = q.backward(x, &dq.reshape(&[b, t, h * d])?, gq)?;
                let dk = k.backward(memory.unwrap_or(x), &dk.reshape(&[b, s, g * d])?, gk)?;
                let dv = v.backward(memory.unwrap_or(x), &dv.reshape(&[b, s, g * d])?, gv)?;
                match memory {
                    Some(_) => {
                        let mut d_memory = dk;
                        add_into(&mut d_memory, &dv);
                        Ok((dx, Some(d_memory)))
                    }
                    None => {
                        add_into(&mut dx, &dk);
                        add_into(&mut dx, &dv);
                        Ok((dx, None))
                    }
                }
            }
            (QkvProj::Fused(qkv), QkvGrads::Fused(gqkv)) => {
                debug_assert!(
                    memory.is_none(),
                    "fused projections are self-attention only"
                );
                // forward: [q | k | v] = W_QKV·x, split by rows  →  d[q | k | v] joined
                let (hd, gd) = (h * d, g * d);
                let mut dy = Vec::with_capacity(b * t * (hd + 2 * gd));
                for ((rq, rk), rv) in dq
                    .data()
                    .chunks_exact(hd)
                    .zip(dk.data().chunks_exact(gd))
                    .zip(dv.data().chunks_exact(gd))
                {
                    dy.extend_from_slice(rq);
                    dy.extend_from_slice(rk);
                    dy.extend_from_slice(rv);
                }
                let dx = qkv.backward(x, &Tensor::new(&[b, t, hd + 2 * gd], dy)?, gqkv)?;
                Ok((dx, None))
            }
            _ => unreachable!("projections and their gradients are built with the same kind"),
        }
    }
}

/// An attention sub-layer: its norm, W_Q, W_K, W_V and W_O (H·D → C).
///
/// ```text
/// y = W_O·attention(q, k, v),  q = RoPE(W_Q·a),  k = RoPE(W_K·m),  v = W_V·m
/// self-attention: m = a; cross-attention: m = the memory (no RoPE)
/// a and the residual around y as in Norm::open / Norm::close
/// ```
#[derive(Clone, Debug)]
pub(super) struct AttnBlock {
    /// the sub-layer's norm (`ln_1`, `input_layernorm`, `self_attn_layer_norm`, …)
    pub norm: Norm,
    pub qkv: QkvProj,
    /// H·D → C
    pub o: Linear,
}

#[derive(Clone, Debug)]
pub(super) struct AttnBlockGrads {
    pub norm: NormGrads,
    pub qkv: QkvGrads,
    pub o: LinearGrads,
}

/// What [`AttnBlock::backward`] needs from its forward.
pub(super) struct AttnBlockActs {
    res: ResidualActs,
    /// `[B,T,H,D]` after RoPE
    q: Tensor,
    /// `[B,S,G,D]` after RoPE
    k: Tensor,
    /// `[B,S,G,D]`
    v: Tensor,
    /// `[B,T,H·D]` the attention output, the input of W_O
    o_in: Tensor,
    /// `[B,H,T]` the attention's log-sum-exp
    lse: Tensor,
}

impl AttnBlock {
    pub(super) fn zero_grads(&self) -> AttnBlockGrads {
        AttnBlockGrads {
            norm: self.norm.zero_grads(),
            qkv: self.qkv.zero_grads(),
            o: LinearGrads::zeros(&self.o),
        }
    }

    /// x: `[B,T,C]` → (`[B,T,C]`, what the backward needs); `memory` `[B,S,C]` makes it
    /// cross-attention.
    pub(super) fn forward(
        &self,
        ctx: &Ctx,
        x: Tensor,
        memory: Option<&Tensor>,
    ) -> Result<(Tensor, AttnBlockActs)> {
        let opened = self.norm.open(ctx.pre_norm, x)?;
        let (mut q, mut k, v) = self.qkv.project(ctx, &opened.branch_in, memory)?;
        if let (Some(rope), None) = (ctx.rope, memory) {
            rope.apply(&mut q, ctx.positions)?;
            rope.apply(&mut k, ctx.positions)?;
        }
        let AttentionOutput { out, lse, .. } = attention(&q, &k, &v, &ctx.spec)?;
        let o_in = out.reshape(&[ctx.b, ctx.t, ctx.h * ctx.d])?;
        let y = self.o.forward(&o_in)?;
        let (out, res) = self.norm.close(opened, &y)?;
        let acts = AttnBlockActs {
            res,
            q,
            k,
            v,
            o_in,
            lse,
        };
        Ok((out, acts))
    }

    /// Backward of [`AttnBlock::forward`] (with the same `memory`): d_out `[B,T,C]` →
    /// (dx `[B,T,C]`, d memory `[B,S,C]` for cross-attention); **accumulates** into `grads`.
    pub(super) fn backward(
        &self,
        ctx: &Ctx,
        memory: Option<&Tensor>,
        acts: AttnBlockActs,
        d_out: Tensor,
        grads: &mut AttnBlockGrads,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let AttnBlockActs {
            res,
            q,
            k,
            v,
            o_in,
            lse,
        } = acts;
        let d_r = self
            .norm
            .close_backward(ctx.pre_norm, &res, d_out, &mut grads.norm)?;
        // y = W_O·o_in
        let d_o_in = self.o.backward(&o_in, &d_r, &mut grads.o)?;
        let (b, t, h, d) = (ctx.b, ctx.t, ctx.h, ctx.d);
        let fwd = AttentionOutput {
            out: o_in.reshape(&[b, t, h, d])?,
            lse,
            weights: None,
        };
        // o_in = attention(q, k, v)
        let ag = attention_backward(
            &q,
            &k,
            &v,
            &fwd,
            &d_o_in.reshape(&[b, t, h, d])?,
            &ctx.spec,
            false,
        )?;
        let (mut dq, mut dk) = (ag.dq, ag.dk);
        // q, k = RoPE(q, k): rotate the gradients back
        if let (Some(rope), None) = (ctx.rope, memory) {
            rope.backward(&mut dq, ctx.positions)?;
            rope.backward(&mut dk, ctx.positions)?;
        }
        let (d_branch_in, d_memory) = self.qkv.project_backward(
            ctx,
            &res.branch_in,
            memory,
            dq,
            dk,
            ag.dv,
            &mut grads.qkv,
        )?;
        let dx = self
            .norm
            .open_backward(ctx.pre_norm, &res, d_r, d_branch_in, &mut grads.norm)?;
        Ok((dx, d_memory))
    }
}

// ------------------------------------------------------------------------------------
// feed-forward, and the self-attention + FFN layer
// ------------------------------------------------------------------------------------

/// A feed-forward sub-layer: its norm and the FFN, `y = ffn(a)` inside the residual.
#[derive(Clone, Debug)]
pub(super) struct FfnBlock {
    /// the sub-layer's norm (`ln_2`, `post_attention_layernorm`, `final_layer_norm`, …)
    pub norm: Norm,
    pub ffn: FeedForward,
}

#[derive(Clone, Debug)]
pub(super) struct FfnBlockGrads {
    pub norm: NormGrads,
    pub ffn: FeedForwardGrads,
}

pub(super) struct FfnBlockActs {
    res: ResidualActs,
    ffn: FeedForwardCache,
}

impl FfnBlock {
    pub(super) fn zero_grads(&self) -> FfnBlockGrads {
        FfnBlockGrads {
            norm: self.norm.zero_grads(),
            ffn: FeedForwardGrads::zeros(&self.ffn),
        }
    }

    /// x: `[B,T,C]` → (`[B,T,C]`, what the backward needs).
    pub(super) fn forward(&self, pre_norm: bool, x: Tensor) -> Result<(Tensor, FfnBlockActs)> {
        let opened = self.norm.open(pre_norm, x)?;
        let mut ffn = FeedForwardCache::default();
        let y = self.ffn.forward_with_cache(&opened.branch_in, &mut ffn)?;
        let (out, res) = self.norm.close(opened, &y)?;
        Ok((out, FfnBlockActs { res, ffn }))
    }

    /// Backward of [`FfnBlock::forward`]: d_out → dx; **accumulates** into `grads`.
    pub(super) fn backward(
        &self,
        pre_norm: bool,
        acts: FfnBlockActs,
        d_out: Tensor,
        grads: &mut FfnBlockGrads,
    ) -> Result<Tensor> {
        let d_r = self
            .norm
            .close_backward(pre_norm, &acts.res, d_out, &mut grads.norm)?;
        // y = ffn(a)
        let d_a = self
            .ffn
            .backward(&d_r, &acts.res.branch_in, &acts.ffn, &mut grads.ffn)?;
        self.norm
            .open_backward(pre_norm, &acts.res, d_r, d_a, &mut grads.norm)
    }
}

/// Self-attention then FFN: one layer of a decoder-only model (causal spec) or of an
/// encoder (bidirectional spec with key padding).
#[derive(Clone, Debug)]
pub(super) struct Layer {
    pub attn: AttnBlock,
    pub mlp: FfnBlock,
}

#[derive(Clone, Debug)]
pub(super) struct LayerGrads {
    pub attn: AttnBlockGrads,
    pub mlp: FfnBlockGrads,
}

pub(super) struct LayerActs {
    attn: AttnBlockActs,
    mlp: FfnBlockActs,
}

impl Layer {
    pub(super) fn zero_grads(&self) -> LayerGrads {
        LayerGrads {
            attn: self.attn.zero_grads(),
            mlp: self.mlp.zero_grads(),
        }
    }

    /// x: `[B,T,C]` → (`[B,T,C]`, what the backward needs).
    pub(super) fn forward(&self, ctx: &Ctx, x: Tensor) -> Result<(Tensor, LayerActs)> {
        let (x, attn) = self.attn.forward(ctx, x, None)?;
        let (out, mlp) = self.mlp.forward(ctx.pre_norm, x)?;
        Ok((out, LayerActs { attn, mlp }))
    }

    /// Backward of [`Layer::forward`]: d_out `[B,T,C]` → dx `[B,T,C]`; **accumulates** into
    /// `grads`.
    pub(super) fn backward(
        &self,
        ctx: &Ctx,
        acts: LayerActs,
        d_out: Tensor,
        grads: &mut LayerGrads,
    ) -> Result<Tensor> {
        let d_x2 = self
            .mlp
            .backward(ctx.pre_norm, acts.mlp, d_out, &mut grads.mlp)?;
        let (dx, _) = self
            .attn
            .backward(ctx, None, acts.attn, d_x2, &mut grads.attn)?;
        Ok(dx)
    }
}

// ------------------------------------------------------------------------------------
// embeddings and the LM head
// ------------------------------------------------------------------------------------

/// `x₀ = scale·wte[ids] (+ wpe[positions]) (+ sinusoidal[positions])`: ids, positions
/// `[N]` → `[N, C]`. `scale` is 1, or √C in the original Transformer (which multiplies
/// the embedding weights by √d_model so that they are not drowned by the sinusoids).
pub(super) fn embed(
    wte: &Embedding,
    scale: f32,
    wpe: Option<&Embedding>,
    sinusoidal: Option<&Tensor>,
    ids: &[usize],
    positions: &[usize],
) -> Result<Tensor> {
    let c = wte.dim();
    let mut x = wte.forward(ids)?;
    if scale != 1.0 {
        x.data_mut().iter_mut().for_each(|a| *a *= scale);
    }
    if let Some(wpe) = wpe {
        add_into(&mut x, &wpe.forward(positions)?);
    }
    if let Some(table) = sinusoidal {
        for (row, &p) in x.data_mut().chunks_exact_mut(c).zip(positions) {
            for (a, &e) in row.iter_mut().zip(&table.data()[p * c..(p + 1) * c]) {
                *a += e;
            }
        }
    }
    Ok(x)
}

/// Backward of [`embed`] from dx `[N, C]` (any shape of N·C elements); **accumulates**
/// into the tables' gradients. The sinusoidal table is constant.
pub(super) fn embed_backward(
    wte: (&Embedding, &mut EmbeddingGrads),
    scale: f32,
    wpe: Option<(&Embedding, &mut EmbeddingGrads)>,
    ids: &[usize],
    positions: &[usize],
    dx: &Tensor,
) -> Result<()> {
    // x₀ = scale·wte[ids] + wpe[positions]
    if scale == 1.0 {
        wte.0.backward(ids, dx, wte.1)?;
    } else {
        let mut scaled = dx.clone();
        scaled.data_mut().iter_mut().for_each(|a| *a *= scale);
        wte.0.backward(ids, &scaled, wte.1)?;
    }
    if let Some((wpe, g)) = wpe {
        wpe.backward(positions, dx, g)?;
    }
    Ok(())
}

/// Backward of [`lm_logits`](crate::models::head::lm_logits) with a tied scale of 1:
/// dlogits `[.., V]` → dh `[.., C]`; **accumulates** into the head's
/// gradients, or (tied) into `table_grad` `[V, C]`.
pub(super) fn head_backward(
    lm_head: Option<(&Linear, &mut LinearGrads)>,
    table: &Tensor,
    table_grad: &mut Tensor,
    h: &Tensor,
    dlogits: &Tensor,
) -> Result<Tensor> {
    if let Some((head, g)) = lm_head {
        return head.backward(h, dlogits, g);
    }
    let (v, c) = (table.shape()[0], table.shape()[1]);
    let rows = h.numel() / c;
    let dl = MatRef::row_major(dlogits.data(), rows, v);
    // logits = h·Wᵀ  →  dW += dlogitsᵀ·h   ([V, N]·[N, C])
    gemm(
        MatMut::row_major(table_grad.data_mut(), v, c),
        dl.t(),
        MatRef::row_major(h.data(), rows, c),
        1.0,
        true,
        Par::Auto,
    );
    // dh = dlogits·W   ([N, V]·[V, C])
    let mut dh = Tensor::zeros(h.shape());
    gemm(
        MatMut::row_major(dh.data_mut(), rows, c),
        dl,
        MatRef::row_major(table.data(), v, c),
        1.0,
        false,
        Par::Auto,
    );
    Ok(dh)
}

// ------------------------------------------------------------------------------------
// visiting parameters under checkpoint names
// ------------------------------------------------------------------------------------

/// Visits one Linear's weight (and bias) under `{prefix}.weight` / `{prefix}.bias`.
/// `mut` as last argument visits mutably.
macro_rules! visit_linear {
    ($f:ident, $prefix:expr, $p:expr, $g:expr $(, $m:tt)?) => {{
        let prefix = $prefix;
        $f(&format!("{prefix}.weight"), & $($m)? $p.weight, & $($m)? $g.weight);
        if let (Some(b), Some(gb)) = (& $($m)? $p.bias, & $($m)? $g.bias) {
            $f(&format!("{prefix}.bias"), b, gb);
        }
    }};
}

/// Visits a norm's weight (and LayerNorm bias).
macro_rules! visit_norm {
    ($f:ident, $prefix:expr, $p:expr, $g:expr $(, $m:tt)?) => {{
        use $crate::train::model::block::{Norm, NormGrads};
        let prefix = $prefix;
        match (& $($m)? $p, & $($m)? $g) {
            (Norm::Layer(n), NormGrads::Layer(g)) => {
                $f(&format!("{prefix}.weight"), & $($m)? n.weight, & $($m)? g.weight);
                if let (Some(b), Some(gb)) = (& $($m)? n.bias, & $($m)? g.bias) {
                    $f(&format!("{prefix}.bias"), b, gb);
                }
            }
            (Norm::Rms(n), NormGrads::Rms(g)) => {
                $f(&format!("{prefix}.weight"), & $($m)? n.weight, & $($m)? g.weight)
            }
            _ => unreachable!("a norm and its gradient are built with the same kind"),
        }
    }};
}

pub(super) use {visit_linear, visit_norm};
