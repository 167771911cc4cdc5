//! The trainable decoder-only language model: [`DecoderLm`], assembled from the same
//! modules the checkpoint families run on ([`Embedding`], [`Linear`] projections,
//! [`LayerNorm`] / [`RmsNorm`], [`FeedForward`], [`Rope`], ALiBi through
//! [`Bias::Alibi`], and [`attention`] with a causal mask), with a hand-written backward
//! that composes the layers' own backward passes in reverse.
//!
//! ## Forward (shapes: B batch, T length, C width, H heads, G key/value heads, D = C/H)
//!
//! ```text
//! x₀ = wte`[ids]` (+ wpe`[pos]` | + sinusoidal`[pos]`)                  `[B,T,C]`
//! per layer (pre-norm):  a = norm₁(x);  x = x + o(attn(q(a), k(a), v(a)))
//!                        f = norm₂(x);  x = x + ffn(f)
//! per layer (post-norm): x = norm₁(x + o(attn(q(x), k(x), v(x))))
//!                        x = norm₂(x + ffn(x))
//! h = norm_f(x) (pre-norm only);  logits = h·Wᵀ, W = lm_head or wte (tied)  `[B,T,V]`
//! ```
//!
//! q, k are rotated by RoPE when configured; attention is causal (top-left), scaled
//! by 1/√D, with ALiBi's per-head distance bias when configured.
//!
//! The forward saves, per layer, exactly what the backward needs (the inputs of the
//! two norms and of the two sub-layers, the rotated q, k and v, the attention output
//! and log-sum-exp, the FFN's intermediates); the backward walks the layers in reverse.
//! A residual `x + branch(x)` has no backward of its own: its gradient flows to both
//! terms, so the branch's input gradient is added to the stream's.
//!
//! ## Parameters, names and Hugging Face folders
//!
//! The model owns one gradient buffer per parameter ([`TrainableModel`]) and visits
//! them under checkpoint names, in Hugging Face's `named_parameters()` order:
//!
//! - a configuration that is exactly a GPT-2 ([`HfFamily::Gpt2`]) uses GPT-2's tree,
//!   `transformer.h.0.attn.c_attn.weight`, …. Its Q, K, V projections are the three
//!   row blocks of one [`Linear`] of width 3C (GPT-2's `c_attn`; the three parallel
//!   maps computed by one product, then split into heads), so every parameter is
//!   exactly one tensor of the checkpoint. **Layout:** every weight is held as
//!   `nn.Linear` holds it, `[out, in]`; GPT-2's `Conv1D` stores `[in, out]`, so the
//!   four Conv1D weights (`c_attn`, `attn.c_proj`, `c_fc`, `mlp.c_proj`) are the
//!   transposes of the file's tensors. [`DecoderLm::save`] and [`DecoderLm::load`]
//!   transpose; [`DecoderLm::hf_tensors`] / [`DecoderLm::hf_grads`] give the file's
//!   layout. (AdamW is elementwise, so the layout does not change an update.)
//! - every other configuration uses Llama's tree, `model.layers.0.self_attn.q_proj.weight`,
//!   …, which is Hugging Face's exactly (same layout) for a Llama ([`HfFamily::Llama`]),
//!   and is extended for what Llama lacks: `model.embed_positions.weight` (learned
//!   positions), `*.bias` of a LayerNorm, `mlp.up_proj` alone for a plain (ungated)
//!   FFN, and `input_layernorm` / `post_attention_layernorm` naming the norms of the
//!   attention and FFN sub-layers also in post-norm.
//!
//! [`DecoderLm::save`] writes `config.json` + `model.safetensors`: a GPT-2 as
//! `GPT2LMHeadModel`, a Llama as `LlamaForCausalLM` (both load in `transformers` and in
//! [`crate::models::load`]), anything else as qkv's own `QkvDecoderLM` (the
//! [`LmConfig`] under `"qkv"`), which [`DecoderLm::load`] reads back.
//!
//! ## Initialisation
//!
//! GPT-2's: every matrix and embedding ~ N(0, 0.02²), the two residual projections
//! of each layer (attention output, FFN down) ~ N(0, (0.02/√(2·n_layers))²), biases 0,
//! norm weights 1 (and biases 0), drawn in visiting order from one seeded [`Rng`].

mod config;
mod hf;

use std::path::Path;

pub use config::{FfnKind, HfFamily, LmConfig, NormKind, PositionKind};

use crate::attention::{
    attention, attention_backward, AttentionOutput, AttentionSpec, Bias, CausalAlign, Kernel,
};
use crate::error::{Error, Result};
use crate::layers::{
    Embedding, EmbeddingGrads, FeedForward, FeedForwardCache, FeedForwardGrads, LayerNorm,
    LayerNormCache, LayerNormGrads, Linear, LinearGrads, RmsNorm, RmsNormCache, RmsNormGrads,
};
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::position::{alibi_slopes, sinusoidal_table, Rope, RopeLayout, SinusoidalLayout};
use crate::rng::Rng;
use crate::tensor::Tensor;
use crate::train::loss::cross_entropy_in_place;
use crate::train::trainable::{Batch, TrainableModel};

/// Standard deviation of GPT-2's initialisation.
const INIT_STD: f32 = 0.02;

/// LayerNorm or RMSNorm, as the config asks.
#[derive(Clone, Debug)]
enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

#[derive(Clone, Debug)]
enum NormGrads {
    Layer(LayerNormGrads),
    Rms(RmsNormGrads),
}

#[derive(Clone, Debug)]
enum NormCache {
    Layer(LayerNormCache),
    Rms(RmsNormCache),
}

impl Norm {
    /// Weight 1, bias 0 (a bias exactly for a LayerNorm with `bias`).
    fn new(kind: NormKind, c: usize, bias: bool) -> Result<Self> {
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

    fn zero_grads(&self) -> NormGrads {
        match self {
            Norm::Layer(n) => NormGrads::Layer(LayerNormGrads::zeros(n)),
            Norm::Rms(n) => NormGrads::Rms(RmsNormGrads::zeros(n)),
        }
    }

    /// x: `[.., C]` → (`[.., C]`, what the backward needs).
    fn forward(&self, x: &Tensor) -> Result<(Tensor, NormCache)> {
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
    fn backward(
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
}

/// The three parallel projections W_Q, W_K, W_V of one attention sub-layer.
#[derive(Clone, Debug)]
enum QkvProj {
    /// One Linear `[(H + 2G)·D, C]` whose row blocks are W_Q, W_K, W_V (GPT-2's `c_attn`).
    Fused(Linear),
    /// Three Linears `[H·D, C]`, `[G·D, C]`, `[G·D, C]`.
    Split { q: Linear, k: Linear, v: Linear },
}

#[derive(Clone, Debug)]
enum QkvGrads {
    Fused(LinearGrads),
    Split {
        q: LinearGrads,
        k: LinearGrads,
        v: LinearGrads,
    },
}

/// One decoder layer.
#[derive(Clone, Debug)]
struct Layer {
    /// The attention sub-layer's norm (`ln_1`, `input_layernorm`).
    norm1: Norm,
    qkv: QkvProj,
    /// H·D → C
    o: Linear,
    /// The FFN sub-layer's norm (`ln_2`, `post_attention_layernorm`).
    norm2: Norm,
    ffn: FeedForward,
}

#[derive(Clone, Debug)]
struct LayerGrads {
    norm1: NormGrads,
    qkv: QkvGrads,
    o: LinearGrads,
    norm2: NormGrads,
    ffn: FeedForwardGrads,
}

impl LayerGrads {
    fn zeros(layer: &Layer) -> Self {
        LayerGrads {
            norm1: layer.norm1.zero_grads(),
            qkv: match &layer.qkv {
                QkvProj::Fused(l) => QkvGrads::Fused(LinearGrads::zeros(l)),
                QkvProj::Split { q, k, v } => QkvGrads::Split {
                    q: LinearGrads::zeros(q),
                    k: LinearGrads::zeros(k),
                    v: LinearGrads::zeros(v),
                },
            },
            o: LinearGrads::zeros(&layer.o),
            norm2: layer.norm2.zero_grads(),
            ffn: FeedForwardGrads::zeros(&layer.ffn),
        }
    }
}

/// What one layer's backward needs from its forward. With x the layer input,
/// r₁ = x + attention branch, x₂ the stream between the sub-layers and
/// r₂ = x₂ + FFN branch:
/// pre-norm saves norm1_in = x, attn_in = norm₁(x), norm2_in = x₂, ffn_in = norm₂(x₂);
/// post-norm saves attn_in = x, norm1_in = r₁, ffn_in = x₂ = norm₁(r₁), norm2_in = r₂.
struct LayerActs {
    /// `[B,T,C]` the input of norm₁
    norm1_in: Tensor,
    norm1: NormCache,
    /// `[B,T,C]` the input of the Q/K/V projections
    attn_in: Tensor,
    /// `[B,T,H,D]` after RoPE
    q: Tensor,
    /// `[B,T,G,D]` after RoPE
    k: Tensor,
    /// `[B,T,G,D]`
    v: Tensor,
    /// `[B,T,H·D]` the attention output, the input of W_O
    o_in: Tensor,
    /// `[B,H,T]` the attention's log-sum-exp
    lse: Tensor,
    /// `[B,T,C]` the input of norm₂
    norm2_in: Tensor,
    norm2: NormCache,
    /// `[B,T,C]` the input of the FFN
    ffn_in: Tensor,
    ffn: FeedForwardCache,
}

/// What the whole backward needs from the forward.
struct Acts {
    layers: Vec<LayerActs>,
    /// pre-norm: the last layer's output `[B,T,C]` (the final norm's input) and the
    /// final norm's statistics
    final_norm: Option<(Tensor, NormCache)>,
    /// `[B,T,C]` the input of the LM head
    head_in: Tensor,
}

/// Per-call settings shared by every layer.
struct Ctx<'a> {
    pre_norm: bool,
    rope: Option<&'a Rope>,
    /// `[B·T]` position of each token
    positions: &'a [usize],
    spec: AttentionSpec<'a>,
    b: usize,
    t: usize,
    h: usize,
    g: usize,
    d: usize,
}

/// The per-call settings for a batch of B rows of T tokens.
fn make_ctx<'a>(
    c: &LmConfig,
    rope: Option<&'a Rope>,
    alibi: Option<&'a [f32]>,
    kernel: Kernel,
    positions: &'a [usize],
    b: usize,
    t: usize,
) -> Ctx<'a> {
    Ctx {
        pre_norm: c.pre_norm,
        rope,
        positions,
        spec: AttentionSpec {
            causal: Some(CausalAlign::TopLeft),
            bias: alibi.map(|slopes| Bias::Alibi { slopes }),
            kernel,
            ..Default::default()
        },
        b,
        t,
        h: c.n_heads,
        g: c.n_kv_heads,
        d: c.head_dim(),
    }
}

/// x += y (a residual connection; same shapes by construction).
fn add_into(x: &mut Tensor, y: &Tensor) {
    debug_assert_eq!(x.shape(), y.shape());
    for (a, b) in x.data_mut().iter_mut().zip(y.data()) {
        *a += b;
    }
}

/// x + y as a new tensor.
fn add(x: &Tensor, y: &Tensor) -> Tensor {
    let mut s = x.clone();
    add_into(&mut s, y);
    s
}

impl Layer {
    /// Projections split into heads: q `[B,T,H,D]`, k and v `[B,T,G,D]`.
    fn project(&self, ctx: &Ctx, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, h, g, d) = (ctx.b, ctx.t, ctx.h, ctx.g, ctx.d);
        match &self.qkv {
            QkvProj::Split { q, k, v } => Ok((
                q.forward(x)?.reshape(&[b, t, h, d])?,
                k.forward(x)?.reshape(&[b, t, g, d])?,
                v.forward(x)?.reshape(&[b, t, g, d])?,
            )),
            QkvProj::Fused(qkv) => {
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
        }
    }

    /// Backward of [`Layer::project`]: dq `[B,T,H,D]`, dk, dv `[B,T,G,D]` → dx `[B,T,C]`.
    /// x feeds all three projections, so their input gradients add up.
    fn project_backward(
        &self,
        ctx: &Ctx,
        x: &Tensor,
        dq: Tensor,
        dk: Tensor,
        dv: Tensor,
        grads: &mut QkvGrads,
    ) -> Result<Tensor> {
        let (b, t, h, g, d) = (ctx.b, ctx.t, ctx.h, ctx.g, ctx.d);
        match (&self.qkv, grads) {
            (
                QkvProj::Split { q, k, v },
                QkvGrads::Split {
                    q: gq,
                    k: gk,
                    v: gv,
                },
            ) => {
                // forward: q = W_Q·x, k = W_K·x, v = W_V·x
                let mut dx = q.backward(x, &dq.reshape(&[b, t, h * d])?, gq)?;
                add_into(&mut dx, &k.backward(x, &dk.reshape(&[b, t, g * d])?, gk)?);
                add_into(&mut dx, &v.backward(x, &dv.reshape(&[b, t, g * d])?, gv)?);
                Ok(dx)
            }
            (QkvProj::Fused(qkv), QkvGrads::Fused(gqkv)) => {
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
                qkv.backward(x, &Tensor::new(&[b, t, hd + 2 * gd], dy)?, gqkv)
            }
            _ => unreachable!("projections and their gradients are built with the same kind"),
        }
    }

    /// x: `[B,T,C]` → (`[B,T,C]`, what the backward needs).
    fn forward(&self, ctx: &Ctx, x: Tensor) -> Result<(Tensor, LayerActs)> {
        // Attention sub-layer. pre-norm: a = norm₁(x); post-norm: a = x.
        let (attn_in, pre1, x_kept) = if ctx.pre_norm {
            let (a, c) = self.norm1.forward(&x)?;
            (a, Some(c), Some(x))
        } else {
            (x, None, None)
        };
        let (mut q, mut k, v) = self.project(ctx, &attn_in)?;
        if let Some(rope) = ctx.rope {
            rope.apply(&mut q, ctx.positions)?;
            rope.apply(&mut k, ctx.positions)?;
        }
        let AttentionOutput { out, lse, .. } = attention(&q, &k, &v, &ctx.spec)?;
        let o_in = out.reshape(&[ctx.b, ctx.t, ctx.h * ctx.d])?;
        let y = self.o.forward(&o_in)?;
        // r₁ = x + y; pre-norm: x₂ = r₁; post-norm: x₂ = norm₁(r₁).
        let r1 = add(x_kept.as_ref().unwrap_or(&attn_in), &y);
        let (norm1_in, norm1, x2) = match (pre1, x_kept) {
            (Some(c), Some(x)) => (x, c, r1),
            _ => {
                let (x2, c) = self.norm1.forward(&r1)?;
                (r1, c, x2)
            }
        };

        // FFN sub-layer, the same pattern.
        let (ffn_in, pre2, x2_kept) = if ctx.pre_norm {
            let (f, c) = self.norm2.forward(&x2)?;
            (f, Some(c), Some(x2))
        } else {
            (x2, None, None)
        };
        let mut ffn = FeedForwardCache::default();
        let fy = self.ffn.forward_with_cache(&ffn_in, &mut ffn)?;
        let r2 = add(x2_kept.as_ref().unwrap_or(&ffn_in), &fy);
        let (norm2_in, norm2, out) = match (pre2, x2_kept) {
            (Some(c), Some(x2)) => (x2, c, r2),
            _ => {
                let (out, c) = self.norm2.forward(&r2)?;
                (r2, c, out)
            }
        };
        let acts = LayerActs {
            norm1_in,
            norm1,
            attn_in,
            q,
            k,
            v,
            o_in,
            lse,
            norm2_in,
            norm2,
            ffn_in,
            ffn,
        };
        Ok((out, acts))
    }

    /// Backward of [`Layer::forward`]: d_out `[B,T,C]` → dx `[B,T,C]`; **accumulates** into
    /// `grads`.
    fn backward(
        &self,
        ctx: &Ctx,
        acts: LayerActs,
        d_out: Tensor,
        grads: &mut LayerGrads,
    ) -> Result<Tensor> {
        // FFN sub-layer. forward: r₂ = x₂ + ffn(f), out = r₂ (pre) or norm₂(r₂) (post).
        let d_r2 = if ctx.pre_norm {
            d_out
        } else {
            self.norm2
                .backward(&d_out, &acts.norm2_in, &acts.norm2, &mut grads.norm2)?
        };
        let d_ffn_in = self
            .ffn
            .backward(&d_r2, &acts.ffn_in, &acts.ffn, &mut grads.ffn)?;
        // f = norm₂(x₂) (pre) or f = x₂ (post); the residual passes d_r₂ to x₂ as well.
        let branch = if ctx.pre_norm {
            self.norm2
                .backward(&d_ffn_in, &acts.norm2_in, &acts.norm2, &mut grads.norm2)?
        } else {
            d_ffn_in
        };
        let mut d_x2 = d_r2;
        add_into(&mut d_x2, &branch);

        // Attention sub-layer. forward: r₁ = x + o(attn(a)), x₂ = r₁ (pre) or norm₁(r₁).
        let d_r1 = if ctx.pre_norm {
            d_x2
        } else {
            self.norm1
                .backward(&d_x2, &acts.norm1_in, &acts.norm1, &mut grads.norm1)?
        };
        // y = W_O·o_in
        let d_o_in = self.o.backward(&acts.o_in, &d_r1, &mut grads.o)?;
        let (b, t, h, d) = (ctx.b, ctx.t, ctx.h, ctx.d);
        let fwd = AttentionOutput {
            out: acts.o_in.reshape(&[b, t, h, d])?,
            lse: acts.lse,
            weights: None,
        };
        // o_in = attention(q, k, v)
        let ag = attention_backward(
            &acts.q,
            &acts.k,
            &acts.v,
            &fwd,
            &d_o_in.reshape(&[b, t, h, d])?,
            &ctx.spec,
            false,
        )?;
        let (mut dq, mut dk) = (ag.dq, ag.dk);
        // q, k = RoPE(q, k): rotate the gradients back
        if let Some(rope) = ctx.rope {
            rope.backward(&mut dq, ctx.positions)?;
            rope.backward(&mut dk, ctx.positions)?;
        }
        let d_attn_in = self.project_backward(ctx, &acts.attn_in, dq, dk, ag.dv, &mut grads.qkv)?;
        // a = norm₁(x) (pre) or a = x (post); the residual passes d_r₁ to x as well.
        let branch = if ctx.pre_norm {
            self.norm1
                .backward(&d_attn_in, &acts.norm1_in, &acts.norm1, &mut grads.norm1)?
        } else {
            d_attn_in
        };
        let mut dx = d_r1;
        add_into(&mut dx, &branch);
        Ok(dx)
    }
}

/// Gradients of every parameter of a [`DecoderLm`], shaped as the parameters.
#[derive(Clone, Debug)]
struct Grads {
    wte: EmbeddingGrads,
    wpe: Option<EmbeddingGrads>,
    layers: Vec<LayerGrads>,
    norm_f: Option<NormGrads>,
    lm_head: Option<LinearGrads>,
}

/// Which checkpoint tree the parameters are named in (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tree {
    Gpt2,
    Llama,
}

/// A decoder-only language model that trains: see the module docs.
#[derive(Clone, Debug)]
pub struct DecoderLm {
    config: LmConfig,
    tree: Tree,
    /// Which attention kernel runs forward and backward (both give the same numbers;
    /// the tiled one never materialises T×T).
    pub kernel: Kernel,
    /// `[V, C]`
    wte: Embedding,
    /// `[max_len, C]` learned positions
    wpe: Option<Embedding>,
    /// `[max_len, C]` fixed sinusoidal positions
    sinusoidal: Option<Tensor>,
    rope: Option<Rope>,
    /// `[H]` ALiBi slopes
    alibi: Option<Vec<f32>>,
    layers: Vec<Layer>,
    /// pre-norm only
    norm_f: Option<Norm>,
    /// `[V, C]`; `None` when tied to `wte`
    lm_head: Option<Linear>,
    grads: Grads,
    /// `bos_token_id`, `eos_token_id`, `pad_token_id` as the loaded config.json had them,
    /// written back on save.
    special: serde_json::Map<String, serde_json::Value>,
}

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

/// The one enumeration of parameters, names and order: `walk_params!(self, f)` calls
/// `f(name, &param, &grad)`, `walk_params!(self, f, mut)` `f(name, &mut param, &mut grad)`.
macro_rules! walk_params {
    ($s:ident, $f:ident $(, $m:tt)?) => {{
        let tree = $s.tree();
        let (wte, wpe, layer, norm_f) = match tree {
            Tree::Gpt2 => (
                "transformer.wte.weight",
                "transformer.wpe.weight",
                "transformer.h.",
                "transformer.ln_f",
            ),
            Tree::Llama => (
                "model.embed_tokens.weight",
                "model.embed_positions.weight",
                "model.layers.",
                "model.norm",
            ),
        };
        $f(wte, & $($m)? $s.wte.table, & $($m)? $s.grads.wte.table);
        if let (Some(p), Some(g)) = (& $($m)? $s.wpe, & $($m)? $s.grads.wpe) {
            $f(wpe, & $($m)? p.table, & $($m)? g.table);
        }
        for (l, (p, g)) in (& $($m)? $s.layers)
            .into_iter()
            .zip(& $($m)? $s.grads.layers)
            .enumerate()
        {
            let pre = format!("{layer}{l}.");
            match (tree, & $($m)? p.qkv, & $($m)? g.qkv) {
                (Tree::Gpt2, QkvProj::Fused(qkv), QkvGrads::Fused(gqkv)) => {
                    visit_norm!($f, format!("{pre}ln_1"), p.norm1, g.norm1 $(, $m)?);
                    visit_linear!($f, format!("{pre}attn.c_attn"), qkv, gqkv $(, $m)?);
                    visit_linear!($f, format!("{pre}attn.c_proj"), p.o, g.o $(, $m)?);
                    visit_norm!($f, format!("{pre}ln_2"), p.norm2, g.norm2 $(, $m)?);
                    visit_linear!($f, format!("{pre}mlp.c_fc"), p.ffn.up, g.ffn.up $(, $m)?);
                    visit_linear!($f, format!("{pre}mlp.c_proj"), p.ffn.down, g.ffn.down $(, $m)?);
                }
                (
                    Tree::Llama,
                    QkvProj::Split { q, k, v },
                    QkvGrads::Split { q: gq, k: gk, v: gv },
                ) => {
                    visit_linear!($f, format!("{pre}self_attn.q_proj"), q, gq $(, $m)?);
                    visit_linear!($f, format!("{pre}self_attn.k_proj"), k, gk $(, $m)?);
                    visit_linear!($f, format!("{pre}self_attn.v_proj"), v, gv $(, $m)?);
                    visit_linear!($f, format!("{pre}self_attn.o_proj"), p.o, g.o $(, $m)?);
                    // FeedForward's `up` is the activated branch: HF's gate_proj when gated
                    match (& $($m)? p.ffn.gate_up, & $($m)? g.ffn.gate_up) {
                        (Some(gu), Some(ggu)) => {
                            visit_linear!($f, format!("{pre}mlp.gate_proj"), p.ffn.up, g.ffn.up $(, $m)?);
                            visit_linear!($f, format!("{pre}mlp.up_proj"), gu, ggu $(, $m)?);
                        }
                        _ => visit_linear!($f, format!("{pre}mlp.up_proj"), p.ffn.up, g.ffn.up $(, $m)?),
                    }
                    visit_linear!($f, format!("{pre}mlp.down_proj"), p.ffn.down, g.ffn.down $(, $m)?);
                    visit_norm!($f, format!("{pre}input_layernorm"), p.norm1, g.norm1 $(, $m)?);
                    visit_norm!($f, format!("{pre}post_attention_layernorm"), p.norm2, g.norm2 $(, $m)?);
                }
                _ => unreachable!("the projection kind follows the naming tree"),
            }
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.norm_f, & $($m)? $s.grads.norm_f) {
            visit_norm!($f, norm_f, *p, *g $(, $m)?);
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.lm_head, & $($m)? $s.grads.lm_head) {
            visit_linear!($f, "lm_head", p, g $(, $m)?);
        }
    }};
}

impl DecoderLm {
    /// A freshly initialised model (GPT-2's initialisation, see the module docs), all
    /// of whose random draws come from `seed`.
    pub fn new(config: &LmConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let c = config;
        let (cw, v, f) = (c.d_model, c.vocab, c.ffn_dim);
        let (h, g, d) = (c.n_heads, c.n_kv_heads, c.head_dim());
        let tree = match c.hf_family() {
            Some(HfFamily::Gpt2) => Tree::Gpt2,
            _ => Tree::Llama,
        };
        let mut rng = Rng::new(seed);
        let resid_std = INIT_STD / ((2 * c.n_layers) as f32).sqrt();
        // Draws follow the visiting order, so a parameter's initial values depend only
        // on the seed and on the parameters visited before it.
        let linear = |rng: &mut Rng, out: usize, inp: usize, std: f32| -> Result<Linear> {
            Linear::new(
                rng.tensor(&[out, inp], std),
                c.bias.then(|| Tensor::zeros(&[out])),
            )
        };
        let wte = Embedding::new(rng.tensor(&[v, cw], INIT_STD))?;
        let wpe = match c.position {
            PositionKind::Learned => Some(Embedding::new(rng.tensor(&[c.max_len, cw], INIT_STD))?),
            _ => None,
        };
        let (act, gated) = c.ffn.activation();
        let mut layers = Vec::with_capacity(c.n_layers);
        for _ in 0..c.n_layers {
            let norm1 = Norm::new(c.norm, cw, c.bias)?;
            let norm2 = Norm::new(c.norm, cw, c.bias)?;
            let layer = match tree {
                Tree::Gpt2 => {
                    let qkv = QkvProj::Fused(linear(&mut rng, (h + 2 * g) * d, cw, INIT_STD)?);
                    let o = linear(&mut rng, cw, h * d, resid_std)?;
                    let up = linear(&mut rng, f, cw, INIT_STD)?;
                    let down = linear(&mut rng, cw, f, resid_std)?;
                    Layer {
                        norm1,
                        qkv,
                        o,
                        norm2,
                        ffn: FeedForward::new(up, None, down, act)?,
                    }
                }
                Tree::Llama => {
                    let q = linear(&mut rng, h * d, cw, INIT_STD)?;
                    let k = linear(&mut rng, g * d, cw, INIT_STD)?;
                    let vv = linear(&mut rng, g * d, cw, INIT_STD)?;
                    let o = linear(&mut rng, cw, h * d, resid_std)?;
                    let up = linear(&mut rng, f, cw, INIT_STD)?;
                    let gate_up = if gated {
                        Some(linear(&mut rng, f, cw, INIT_STD)?)
                    } else {
                        None
                    };
                    let down = linear(&mut rng, cw, f, resid_std)?;
                    Layer {
                        norm1,
                        qkv: QkvProj::Split { q, k, v: vv },
                        o,
                        norm2,
                        ffn: FeedForward::new(up, gate_up, down, act)?,
                    }
                }
            };
            layers.push(layer);
        }
        let norm_f = if c.pre_norm {
            Some(Norm::new(c.norm, cw, c.bias)?)
        } else {
            None
        };
        let lm_head = if c.tie_embeddings {
            None
        } else {
            Some(Linear::new(rng.tensor(&[v, cw], INIT_STD), None)?)
        };
        let sinusoidal = (c.position == PositionKind::Sinusoidal)
            .then(|| sinusoidal_table(c.max_len, cw, SinusoidalLayout::Interleaved));
        let rope = match c.position {
            PositionKind::Rope { theta } => Some(Rope::new(d, theta, RopeLayout::HalfSplit)?),
            _ => None,
        };
        let alibi = (c.position == PositionKind::Alibi).then(|| alibi_slopes(h));
        let grads = Grads {
            wte: EmbeddingGrads::zeros(&wte),
            wpe: wpe.as_ref().map(EmbeddingGrads::zeros),
            layers: layers.iter().map(LayerGrads::zeros).collect(),
            norm_f: norm_f.as_ref().map(Norm::zero_grads),
            lm_head: lm_head.as_ref().map(LinearGrads::zeros),
        };
        Ok(DecoderLm {
            config: config.clone(),
            tree,
            kernel: Kernel::Tiled,
            wte,
            wpe,
            sinusoidal,
            rope,
            alibi,
            layers,
            norm_f,
            lm_head,
            grads,
            special: serde_json::Map::new(),
        })
    }

    pub fn config(&self) -> &LmConfig {
        &self.config
    }

    fn tree(&self) -> Tree {
        self.tree
    }

    /// Number of trainable parameters (a tied head counts once).
    pub fn num_params(&self) -> usize {
        let mut n = 0;
        self.visit_ref(&mut |_, p, _| n += p.numel());
        n
    }

    /// Calls `f(name, param, grad)` for every parameter in visiting order (read-only).
    pub fn visit_ref(&self, f: &mut dyn FnMut(&str, &Tensor, &Tensor)) {
        walk_params!(self, f);
    }

    /// Calls `f(name, param, grad)` for every parameter in visiting order.
    pub fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &mut Tensor)) {
        walk_params!(self, f, mut);
    }

    /// Checks a batch against the model: sizes, and the sequence length against a
    /// position table.
    fn check_batch(
        &self,
        inputs: &[usize],
        targets: Option<&[i64]>,
        b: usize,
        t: usize,
    ) -> Result<()> {
        if b == 0 || t == 0 {
            return Err(Error::invalid(
                "batch",
                "empty batch: need at least one token",
            ));
        }
        let n = b.saturating_mul(t);
        if inputs.len() != n {
            return Err(Error::Shape {
                tensor: "batch inputs".into(),
                expected: format!("[{b}, {t}] = {n} ids"),
                got: vec![inputs.len()],
            });
        }
        if let Some(targets) = targets {
            if targets.len() != n {
                return Err(Error::Shape {
                    tensor: "batch targets".into(),
                    expected: format!("[{b}, {t}] = {n} targets"),
                    got: vec![targets.len()],
                });
            }
        }
        let table = matches!(
            self.config.position,
            PositionKind::Learned | PositionKind::Sinusoidal
        );
        if table && t > self.config.max_len {
            return Err(Error::OutOfRange {
                what: "position (sequence longer than the model's max_len)".into(),
                index: t - 1,
                size: self.config.max_len,
            });
        }
        Ok(())
    }

    /// The whole forward: ids `[B·T]` → (logits `[B,T,V]`, what the backward needs).
    fn forward(&self, ids: &[usize], b: usize, t: usize) -> Result<(Tensor, Acts)> {
        self.check_batch(ids, None, b, t)?;
        let c = self.config.d_model;
        let positions: Vec<usize> = (0..b * t).map(|i| i % t).collect();
        // x₀ = wte[ids] + positions
        let mut x = self.wte.forward(ids)?;
        if let Some(wpe) = &self.wpe {
            add_into(&mut x, &wpe.forward(&positions)?);
        }
        if let Some(table) = &self.sinusoidal {
            for (row, &p) in x.data_mut().chunks_exact_mut(c).zip(&positions) {
                for (a, &e) in row.iter_mut().zip(&table.data()[p * c..(p + 1) * c]) {
                    *a += e;
                }
            }
        }
        let mut x = x.reshape(&[b, t, c])?;
        let ctx = make_ctx(
            &self.config,
            self.rope.as_ref(),
            self.alibi.as_deref(),
            self.kernel,
            &positions,
            b,
            t,
        );
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (y, acts) = layer.forward(&ctx, x)?;
            layers.push(acts);
            x = y;
        }
        let (head_in, final_norm) = match &self.norm_f {
            Some(norm) => {
                let (h, cache) = norm.forward(&x)?;
                (h, Some((x, cache)))
            }
            None => (x, None),
        };
        let logits = self.head(&head_in)?;
        Ok((
            logits,
            Acts {
                layers,
                final_norm,
                head_in,
            },
        ))
    }

    /// h: `[B,T,C]` → logits `[B,T,V]` = h·Wᵀ, W = lm_head or the embedding table.
    fn head(&self, h: &Tensor) -> Result<Tensor> {
        if let Some(head) = &self.lm_head {
            return head.forward(h);
        }
        let (c, v) = (self.wte.dim(), self.wte.vocab_size());
        let rows = h.numel() / c;
        let mut shape = h.shape().to_vec();
        *shape.last_mut().expect("[B, T, C]") = v;
        let mut out = Tensor::zeros(&shape);
        gemm(
            MatMut::row_major(out.data_mut(), rows, v),
            MatRef::row_major(h.data(), rows, c),
            MatRef::row_major(self.wte.table.data(), v, c).t(),
            1.0,
            false,
            Par::Auto,
        );
        Ok(out)
    }

    /// The whole backward from d loss / d logits `[B,T,V]`; **accumulates** into the
    /// model's gradients.
    fn backward(&mut self, ids: &[usize], acts: Acts, dlogits: &Tensor) -> Result<()> {
        let (b, t) = (acts.head_in.shape()[0], acts.head_in.shape()[1]);
        let c = self.config.d_model;
        let positions: Vec<usize> = (0..b * t).map(|i| i % t).collect();
        // logits = h·Wᵀ
        let dh = match (&self.lm_head, &mut self.grads.lm_head) {
            (Some(head), Some(g)) => head.backward(&acts.head_in, dlogits, g)?,
            _ => {
                let v = self.wte.vocab_size();
                let rows = b * t;
                let dl = MatRef::row_major(dlogits.data(), rows, v);
                // tied: dW_wte += dlogitsᵀ·h   ([V, N]·[N, C])
                gemm(
                    MatMut::row_major(self.grads.wte.table.data_mut(), v, c),
                    dl.t(),
                    MatRef::row_major(acts.head_in.data(), rows, c),
                    1.0,
                    true,
                    Par::Auto,
                );
                // dh = dlogits·W   ([N, V]·[V, C])
                let mut dh = Tensor::zeros(acts.head_in.shape());
                gemm(
                    MatMut::row_major(dh.data_mut(), rows, c),
                    dl,
                    MatRef::row_major(self.wte.table.data(), v, c),
                    1.0,
                    false,
                    Par::Auto,
                );
                dh
            }
        };
        // h = norm_f(x) (pre-norm) or h = x
        let mut dx = match (&self.norm_f, &acts.final_norm, &mut self.grads.norm_f) {
            (Some(norm), Some((x, cache)), Some(g)) => norm.backward(&dh, x, cache, g)?,
            _ => dh,
        };
        let ctx = make_ctx(
            &self.config,
            self.rope.as_ref(),
            self.alibi.as_deref(),
            self.kernel,
            &positions,
            b,
            t,
        );
        for ((layer, la), lg) in self
            .layers
            .iter()
            .zip(acts.layers)
            .zip(self.grads.layers.iter_mut())
            .rev()
        {
            dx = layer.backward(&ctx, la, dx, lg)?;
        }
        // x₀ = wte[ids] + wpe[positions] (+ a constant sinusoidal table)
        let dx = dx.reshape(&[b * t, c])?;
        self.wte.backward(ids, &dx, &mut self.grads.wte)?;
        if let (Some(wpe), Some(g)) = (&self.wpe, &mut self.grads.wpe) {
            wpe.backward(&positions, &dx, g)?;
        }
        Ok(())
    }

    /// Logits `[B,T,V]` of `inputs` (`[B·T]` ids), no gradients.
    pub fn forward_logits(&self, inputs: &[usize], b: usize, t: usize) -> Result<Tensor> {
        Ok(self.forward(inputs, b, t)?.0)
    }

    /// The loss of a batch (mean cross-entropy over scored targets), no gradients.
    pub fn loss(&self, batch: &Batch) -> Result<f32> {
        self.check_batch(&batch.inputs, Some(&batch.targets), batch.batch, batch.len)?;
        let mut logits = self.forward_logits(&batch.inputs, batch.batch, batch.len)?;
        cross_entropy_in_place(&mut logits, &batch.targets)
    }

    /// Forward on `inputs` (`[B·T]` ids), then backward from the given logits gradient
    /// `dlogits` `[B,T,V]`: **accumulates** d(Σ logits ∘ dlogits)/dθ into the gradients.
    /// For losses other than the built-in cross-entropy, and for gradient checks.
    pub fn backward_from_logits(
        &mut self,
        inputs: &[usize],
        b: usize,
        t: usize,
        dlogits: &Tensor,
    ) -> Result<()> {
        let (logits, acts) = self.forward(inputs, b, t)?;
        if dlogits.shape() != logits.shape() {
            return Err(Error::shape(
                "dlogits",
                format!("{:?} like the logits", logits.shape()),
                dlogits.shape(),
            ));
        }
        dlogits.check_finite("dlogits")?;
        self.backward(inputs, acts, dlogits)
    }

    /// Every parameter as Hugging Face stores it (GPT-2's Conv1D weights transposed to
    /// `[in, out]`), under its checkpoint name, in visiting order.
    pub fn hf_tensors(&self) -> Vec<(String, Tensor)> {
        self.converted(|p, _| p)
    }

    /// Every gradient in the layout of [`DecoderLm::hf_tensors`].
    pub fn hf_grads(&self) -> Vec<(String, Tensor)> {
        self.converted(|_, g| g)
    }

    fn converted(
        &self,
        pick: impl for<'a> Fn(&'a Tensor, &'a Tensor) -> &'a Tensor,
    ) -> Vec<(String, Tensor)> {
        let gpt2 = self.tree() == Tree::Gpt2;
        let mut out = Vec::new();
        self.visit_ref(&mut |name, p, g| {
            let t = pick(p, g);
            let t = if gpt2 && hf::is_conv1d_weight(name) {
                hf::transpose(t)
            } else {
                t.clone()
            };
            out.push((name.to_string(), t));
        });
        out
    }

    /// Writes `dir/config.json` and `dir/model.safetensors` (each atomically), creating
    /// `dir`: a `GPT2LMHeadModel` or `LlamaForCausalLM` folder when the configuration
    /// is one of those families, else a `QkvDecoderLM` folder (see the module docs).
    pub fn save(&self, dir: &Path) -> Result<()> {
        hf::save(self, dir)
    }

    /// Reads a Hugging Face `GPT2LMHeadModel` / `GPT2Model` or `LlamaForCausalLM`
    /// folder (as `save_pretrained` writes it, or as [`DecoderLm::save`] does), or a
    /// `QkvDecoderLM` folder written by [`DecoderLm::save`]. Gradients start at zero.
    pub fn load(dir: &Path) -> Result<Self> {
        hf::load(dir)
    }

    /// [`DecoderLm::load`] under the name `qkv train --init DIR` uses: a Hugging Face
    /// GPT-2 or Llama folder (or one saved by qkv).
    pub fn load_hf(dir: &Path) -> Result<Self> {
        hf::load(dir)
    }
}

impl TrainableModel for DecoderLm {
    fn zero_grads(&mut self) {
        self.visit_mut(&mut |_, _, g| g.data_mut().fill(0.0));
    }

    /// A non-finite loss is returned as it is, without a backward (the trainer reports
    /// it); the gradients are then unchanged.
    fn loss_and_backward(&mut self, batch: &Batch) -> Result<f32> {
        self.check_batch(&batch.inputs, Some(&batch.targets), batch.batch, batch.len)?;
        let (mut logits, acts) = self.forward(&batch.inputs, batch.batch, batch.len)?;
        // the logits become d loss / d logits in place
        let loss = cross_entropy_in_place(&mut logits, &batch.targets)?;
        if !loss.is_finite() {
            return Ok(loss);
        }
        self.backward(&batch.inputs, acts, &logits)?;
        Ok(loss)
    }

    fn logits(&self, batch: &Batch) -> Result<Tensor> {
        self.forward_logits(&batch.inputs, batch.batch, batch.len)
    }

    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        self.visit_mut(&mut |name, p, g| f(name, p, g));
    }

    fn save(&self, dir: &Path) -> Result<()> {
        DecoderLm::save(self, dir)
    }
}
