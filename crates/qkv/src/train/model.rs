//! The trainable decoder-only language model: [`DecoderLm`], assembled from the same
//! modules the checkpoint families run on ([`Embedding`], [`Linear`] projections,
//! [`LayerNorm`](crate::layers::LayerNorm) / [`RmsNorm`](crate::layers::RmsNorm),
//! [`FeedForward`], [`Rope`], ALiBi through [`Bias::Alibi`], and
//! [`attention`](crate::attention::attention) with a causal mask), with a hand-written
//! backward that composes the layers' own backward passes in reverse. The pieces it
//! shares with the encoder-decoder [`EncoderDecoderLm`] (norms, the pre-/post-norm
//! residual wrapping, attention and FFN sub-layers, embeddings, the LM head) live in
//! `model/block.rs`.
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

mod block;
mod config;
mod hf;
pub mod seq2seq;

use std::path::Path;

pub use config::{FfnKind, HfFamily, LmConfig, NormKind, PositionKind};
pub use seq2seq::{EncoderDecoderConfig, EncoderDecoderLm};

use crate::attention::{AttentionSpec, Bias, CausalAlign, Kernel};
use crate::error::{Error, Result};
use crate::layers::{Embedding, EmbeddingGrads, FeedForward, Linear, LinearGrads};
use crate::models::head::lm_logits;
use crate::position::{alibi_slopes, sinusoidal_table, Rope, RopeLayout, SinusoidalLayout};
use crate::rng::Rng;
use crate::tensor::Tensor;
use crate::train::loss::cross_entropy_in_place;
use crate::train::trainable::{Batch, TrainableModel};
use block::{
    embed, embed_backward, head_backward, init_linear, visit_linear, visit_norm, AttnBlock, Ctx,
    FfnBlock, Layer, LayerActs, LayerGrads, Norm, NormCache, NormGrads, QkvGrads, QkvProj,
    INIT_STD,
};

/// What the whole backward needs from the forward.
struct Acts {
    layers: Vec<LayerActs>,
    /// pre-norm: the last layer's output `[B,T,C]` (the final norm's input) and the
    /// final norm's statistics
    final_norm: Option<(Tensor, NormCache)>,
    /// `[B,T,C]` the input of the LM head
    head_in: Tensor,
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
        s: t,
        h: c.n_heads,
        g: c.n_kv_heads,
        d: c.head_dim(),
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
            match (tree, & $($m)? p.attn.qkv, & $($m)? g.attn.qkv) {
                (Tree::Gpt2, QkvProj::Fused(qkv), QkvGrads::Fused(gqkv)) => {
                    visit_norm!($f, format!("{pre}ln_1"), p.attn.norm, g.attn.norm $(, $m)?);
                    visit_linear!($f, format!("{pre}attn.c_attn"), qkv, gqkv $(, $m)?);
                    visit_linear!($f, format!("{pre}attn.c_proj"), p.attn.o, g.attn.o $(, $m)?);
                    visit_norm!($f, format!("{pre}ln_2"), p.mlp.norm, g.mlp.norm $(, $m)?);
                    visit_linear!($f, format!("{pre}mlp.c_fc"), p.mlp.ffn.up, g.mlp.ffn.up $(, $m)?);
                    visit_linear!($f, format!("{pre}mlp.c_proj"), p.mlp.ffn.down, g.mlp.ffn.down $(, $m)?);
                }
                (
                    Tree::Llama,
                    QkvProj::Split { q, k, v },
                    QkvGrads::Split { q: gq, k: gk, v: gv },
                ) => {
                    visit_linear!($f, format!("{pre}self_attn.q_proj"), q, gq $(, $m)?);
                    visit_linear!($f, format!("{pre}self_attn.k_proj"), k, gk $(, $m)?);
                    visit_linear!($f, format!("{pre}self_attn.v_proj"), v, gv $(, $m)?);
                    visit_linear!($f, format!("{pre}self_attn.o_proj"), p.attn.o, g.attn.o $(, $m)?);
                    // FeedForward's `up` is the activated branch: HF's gate_proj when gated
                    match (& $($m)? p.mlp.ffn.gate_up, & $($m)? g.mlp.ffn.gate_up) {
                        (Some(gu), Some(ggu)) => {
                            visit_linear!($f, format!("{pre}mlp.gate_proj"), p.mlp.ffn.up, g.mlp.ffn.up $(, $m)?);
                            visit_linear!($f, format!("{pre}mlp.up_proj"), gu, ggu $(, $m)?);
                        }
                        _ => visit_linear!($f, format!("{pre}mlp.up_proj"), p.mlp.ffn.up, g.mlp.ffn.up $(, $m)?),
                    }
                    visit_linear!($f, format!("{pre}mlp.down_proj"), p.mlp.ffn.down, g.mlp.ffn.down $(, $m)?);
                    visit_norm!($f, format!("{pre}input_layernorm"), p.attn.norm, g.attn.norm $(, $m)?);
                    visit_norm!($f, format!("{pre}post_attention_layernorm"), p.mlp.norm, g.mlp.norm $(, $m)?);
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
        let linear = |rng: &mut Rng, out: usize, inp: usize, std: f32| {
            init_linear(rng, out, inp, std, c.bias)
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
                        attn: AttnBlock {
                            norm: norm1,
                            qkv,
                            o,
                        },
                        mlp: FfnBlock {
                            norm: norm2,
                            ffn: FeedForward::new(up, None, down, act)?,
                        },
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
                        attn: AttnBlock {
                            norm: norm1,
                            qkv: QkvProj::Split { q, k, v: vv },
                            o,
                        },
                        mlp: FfnBlock {
                            norm: norm2,
                            ffn: FeedForward::new(up, gate_up, down, act)?,
                        },
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
            layers: layers.iter().map(Layer::zero_grads).collect(),
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
        let x = embed(
            &self.wte,
            1.0,
            self.wpe.as_ref(),
            self.sinusoidal.as_ref(),
            ids,
            &positions,
        )?;
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
        lm_logits(h, self.lm_head.as_ref(), &self.wte.table, 1.0)
    }

    /// The whole backward from d loss / d logits `[B,T,V]`; **accumulates** into the
    /// model's gradients.
    fn backward(&mut self, ids: &[usize], acts: Acts, dlogits: &Tensor) -> Result<()> {
        let (b, t) = (acts.head_in.shape()[0], acts.head_in.shape()[1]);
        let c = self.config.d_model;
        let positions: Vec<usize> = (0..b * t).map(|i| i % t).collect();
        // logits = h·Wᵀ
        let dh = head_backward(
            self.lm_head.as_ref().zip(self.grads.lm_head.as_mut()),
            &self.wte.table,
            &mut self.grads.wte.table,
            &acts.head_in,
            dlogits,
        )?;
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
        embed_backward(
            (&self.wte, &mut self.grads.wte),
            1.0,
            self.wpe.as_ref().zip(self.grads.wpe.as_mut()),
            ids,
            &positions,
            &dx.reshape(&[b * t, c])?,
        )
    }

    /// Logits `[B,T,V]` of `inputs` (`[B·T]` ids), no gradients.
    pub fn forward_logits(&self, inputs: &[usize], b: usize, t: usize) -> Result<Tensor> {
        Ok(self.forward(inputs, b, t)?.0)
    }

    /// The loss of a batch (mean cross-entropy over scored targets), no gradients.
    pub fn loss(&self, batch: &Batch) -> Result<f32> {
        no_source(batch)?;
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

/// A decoder-only model reads no source: a batch that carries one is an error.
fn no_source(batch: &Batch) -> Result<()> {
    match batch.source {
        Some(_) => Err(Error::invalid(
            "batch.source",
            "a decoder-only model reads no source (encoder-decoder batches need an EncoderDecoderLm)",
        )),
        None => Ok(()),
    }
}

impl TrainableModel for DecoderLm {
    fn zero_grads(&mut self) {
        self.visit_mut(&mut |_, _, g| g.data_mut().fill(0.0));
    }

    /// A non-finite loss is returned as it is, without a backward (the trainer reports
    /// it); the gradients are then unchanged.
    fn loss_and_backward(&mut self, batch: &Batch) -> Result<f32> {
        no_source(batch)?;
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
        no_source(batch)?;
        self.forward_logits(&batch.inputs, batch.batch, batch.len)
    }

    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        self.visit_mut(&mut |name, p, g| f(name, p, g));
    }

    fn save(&self, dir: &Path) -> Result<()> {
        DecoderLm::save(self, dir)
    }
}
