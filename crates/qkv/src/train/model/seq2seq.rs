//! The trainable encoder-decoder model: [`EncoderDecoderLm`], the Transformer of
//! "Attention Is All You Need" in its configurable form, assembled from the same
//! blocks as [`DecoderLm`](super::DecoderLm) (see `block.rs`): its encoder layers are
//! the decoder-only model's layer (self-attention, FFN) with a bidirectional mask, its
//! decoder layers add a cross-attention sub-layer between self-attention and the FFN.
//!
//! ## Forward (shapes: B batch, S source length, T target length, C width, V target
//! vocabulary)
//!
//! ```text
//! e₀ = src_embed[src]·k (+ pos[0..S])        k = √C or 1               [B,S,C]
//! encoder layer:  e = ffn_sublayer(self_attn_sublayer(e))   bidirectional, source key padding
//! m = norm_enc(e) (pre-norm) or e                                       [B,S,C]  the memory
//! x₀ = tgt_embed[dec_in]·k (+ pos[0..T])                               [B,T,C]
//! decoder layer:  x = ffn_sublayer(cross_attn_sublayer(self_attn_sublayer(x), m))
//!                 self: causal;  cross: q from x, k and v from m, source key padding
//! h = norm_dec(x) (pre-norm) or x;  logits = h·Wᵀ, W = lm_head or tgt_embed (tied)  [B,T,V]
//! ```
//!
//! Each sub-layer is pre-norm `x + f(norm(x))` or post-norm `norm(x + f(x))`; k is √C
//! with [`EncoderDecoderConfig::scale_embeddings`], as in the original Transformer.
//! Positions, as [`PositionKind`] says: learned tables (one per stack, as BART) or the
//! sinusoidal table added to both embeddings; RoPE on the self-attention q and k of
//! both stacks; ALiBi in the decoder's causal self-attention as in the decoder-only
//! model, and in the encoder as the *symmetric* bias −slope·|i − j| (the causal form
//! slope·(j − i) would make a bidirectional encoder prefer later keys). Cross-attention
//! gets no position term, as in every encoder-decoder family: the queries' and keys'
//! positions live in different sequences.
//!
//! The backward walks the decoder layers in reverse; every cross-attention returns the
//! gradient of its k and v projections' input, the memory, and those add up over the
//! decoder layers before the backward enters the encoder (`attention_backward` with
//! T ≠ S gives dq `[B,T,H,D]` and dk, dv `[B,S,G,D]`). With shared embeddings the
//! encoder's and decoder's token gradients add into the one table.
//!
//! ## Batches
//!
//! A [`Batch`] with a [`Source`]: `source.ids` `[B·S]` with `source.mask` (padding is
//! never attended to, by encoder self-attention nor by cross-attention, so it changes
//! no logit), decoder inputs `inputs` `[B·T]` (teacher forcing: a start token, then the
//! target shifted right) and `targets` `[B·T]` (−100 = not scored).
//! [`source_target_batch`] turns a decoder-only task batch (`copy`, `reverse`, …) into
//! this form.
//!
//! ## Parameters and folders
//!
//! Names follow BART / Marian's tree (`model.encoder.layers.0.self_attn.q_proj.weight`,
//! `…encoder_attn…`, `…fc1…`, `…final_layer_norm…`, `model.shared.weight` for shared
//! embeddings, `lm_head.weight` when untied); a gated (SwiGLU) FFN names its activated
//! branch `fc1` and its linear branch `fc1_linear`. [`EncoderDecoderLm::save`] writes
//! `config.json` (`"architectures": ["QkvEncoderDecoderLM"]`, the
//! [`EncoderDecoderConfig`] under `"qkv"`) and `model.safetensors`;
//! [`EncoderDecoderLm::load`] reads them back.
//!
//! ## Initialisation
//!
//! GPT-2's, as [`DecoderLm`](super::DecoderLm): matrices and embeddings ~ N(0, 0.02²),
//! the projections that end a residual branch (`out_proj`, `fc2`) ~ N(0, (0.02/√n)²)
//! with n the residual branches of their stack (2 per encoder layer, 3 per decoder
//! layer), biases 0, norms 1; drawn in visiting order from one seeded [`Rng`].

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::block::{
    add_into, embed, embed_backward, head_backward, init_linear, visit_linear, visit_norm,
    AttnBlock, AttnBlockActs, AttnBlockGrads, Ctx, FfnBlock, FfnBlockActs, FfnBlockGrads, Layer,
    LayerActs, LayerGrads, Norm, NormCache, NormGrads, QkvGrads, QkvProj, INIT_STD,
};
use super::{FfnKind, LmConfig, NormKind, PositionKind};
use crate::attention::{AttentionSpec, Bias, CausalAlign, Kernel};
use crate::error::{Error, Result};
use crate::io::{bad_field, read_config, write_atomic, Checkpoint};
use crate::layers::{Embedding, EmbeddingGrads, FeedForward, Linear, LinearGrads};
use crate::models::head::lm_logits;
use crate::position::{alibi_slopes, sinusoidal_table, Rope, RopeLayout, SinusoidalLayout};
use crate::rng::Rng;
use crate::tensor::Tensor;
use crate::train::loss::{cross_entropy_in_place, IGNORE_INDEX};
use crate::train::trainable::{Batch, Source, TrainableModel};

/// `architectures[0]` of an [`EncoderDecoderLm`] folder.
pub const ENCODER_DECODER_ARCHITECTURE: &str = "QkvEncoderDecoderLM";

/// An encoder-decoder model's architecture. The fields shared with [`LmConfig`] mean
/// the same there; both stacks use the same width, heads, FFN, norm and positions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncoderDecoderConfig {
    /// Vocabulary of the source (encoder input).
    pub src_vocab: usize,
    /// V: vocabulary of the target (decoder input and logits).
    pub tgt_vocab: usize,
    /// C
    pub d_model: usize,
    pub n_encoder_layers: usize,
    pub n_decoder_layers: usize,
    /// H
    pub n_heads: usize,
    /// G, dividing H (self- and cross-attention alike)
    pub n_kv_heads: usize,
    /// F
    pub ffn_dim: usize,
    /// Longest source and longest target: the rows of a learned or sinusoidal table.
    pub max_len: usize,
    pub position: PositionKind,
    pub norm: NormKind,
    pub pre_norm: bool,
    pub ffn: FfnKind,
    /// Biases on every projection (and on LayerNorm).
    pub bias: bool,
    /// One token table for source and target (`model.shared`); needs
    /// `src_vocab == tgt_vocab`.
    pub share_embeddings: bool,
    /// The LM head reads the target token table (no `lm_head.weight` of its own).
    pub tie_embeddings: bool,
    /// Multiply token embeddings by √C before adding positions, as the original
    /// Transformer (and Marian's `scale_embedding`) does; a tied head reads the table
    /// unscaled.
    #[serde(default)]
    pub scale_embeddings: bool,
}

impl EncoderDecoderConfig {
    /// The base Transformer of "Attention Is All You Need" at any size: one shared
    /// vocabulary and embedding (tied to the head) scaled by √C, sinusoidal positions,
    /// post-norm LayerNorm (eps 1e-5), a 4·C ReLU FFN, biases, `n_layers` in each
    /// stack. (Without the √C, a token embedding of std 0.02 is drowned by sinusoids
    /// of amplitude 1: a shared table then sits on the ln(symbols) plateau of
    /// `reverse` for thousands of steps.)
    pub fn vaswani_style(
        vocab: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        max_len: usize,
    ) -> Self {
        EncoderDecoderConfig {
            src_vocab: vocab,
            tgt_vocab: vocab,
            d_model,
            n_encoder_layers: n_layers,
            n_decoder_layers: n_layers,
            n_heads,
            n_kv_heads: n_heads,
            ffn_dim: 4 * d_model,
            max_len,
            position: PositionKind::Sinusoidal,
            norm: NormKind::LayerNorm { eps: 1e-5 },
            pre_norm: false,
            ffn: FfnKind::Relu,
            bias: true,
            share_embeddings: true,
            tie_embeddings: true,
            scale_embeddings: true,
        }
    }

    /// D = C / H.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// The decoder stack as an [`LmConfig`]: the checks of the shared fields are its.
    fn decoder_view(&self) -> LmConfig {
        LmConfig {
            vocab: self.tgt_vocab,
            d_model: self.d_model,
            n_layers: self.n_decoder_layers,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            ffn_dim: self.ffn_dim,
            max_len: self.max_len,
            position: self.position,
            norm: self.norm,
            pre_norm: self.pre_norm,
            ffn: self.ffn,
            bias: self.bias,
            tie_embeddings: self.tie_embeddings,
        }
    }

    /// Errors on the first inconsistent field, naming it.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("src_vocab", self.src_vocab),
            ("tgt_vocab", self.tgt_vocab),
            ("n_encoder_layers", self.n_encoder_layers),
            ("n_decoder_layers", self.n_decoder_layers),
        ] {
            if v == 0 {
                return Err(Error::invalid(field, "must be at least 1"));
            }
        }
        if self.share_embeddings && self.src_vocab != self.tgt_vocab {
            return Err(Error::invalid(
                "share_embeddings",
                format!(
                    "one table for both sides needs src_vocab = tgt_vocab, got {} and {}",
                    self.src_vocab, self.tgt_vocab
                ),
            ));
        }
        self.decoder_view().validate()
    }
}

/// One decoder layer: causal self-attention, cross-attention over the memory, FFN.
#[derive(Clone, Debug)]
struct DecoderLayer {
    self_attn: AttnBlock,
    cross_attn: AttnBlock,
    mlp: FfnBlock,
}

#[derive(Clone, Debug)]
struct DecoderLayerGrads {
    self_attn: AttnBlockGrads,
    cross_attn: AttnBlockGrads,
    mlp: FfnBlockGrads,
}

struct DecoderLayerActs {
    self_attn: AttnBlockActs,
    cross_attn: AttnBlockActs,
    mlp: FfnBlockActs,
}

impl DecoderLayer {
    fn zero_grads(&self) -> DecoderLayerGrads {
        DecoderLayerGrads {
            self_attn: self.self_attn.zero_grads(),
            cross_attn: self.cross_attn.zero_grads(),
            mlp: self.mlp.zero_grads(),
        }
    }

    /// x: `[B,T,C]`, memory `[B,S,C]` → (`[B,T,C]`, what the backward needs).
    fn forward(
        &self,
        self_ctx: &Ctx,
        cross_ctx: &Ctx,
        x: Tensor,
        memory: &Tensor,
    ) -> Result<(Tensor, DecoderLayerActs)> {
        let (x, self_attn) = self.self_attn.forward(self_ctx, x, None)?;
        let (x, cross_attn) = self.cross_attn.forward(cross_ctx, x, Some(memory))?;
        let (out, mlp) = self.mlp.forward(self_ctx.pre_norm, x)?;
        let acts = DecoderLayerActs {
            self_attn,
            cross_attn,
            mlp,
        };
        Ok((out, acts))
    }

    /// Backward of [`DecoderLayer::forward`]: d_out `[B,T,C]` → (dx `[B,T,C]`, this
    /// layer's share of the memory's gradient `[B,S,C]`); **accumulates** into `grads`.
    fn backward(
        &self,
        self_ctx: &Ctx,
        cross_ctx: &Ctx,
        memory: &Tensor,
        acts: DecoderLayerActs,
        d_out: Tensor,
        grads: &mut DecoderLayerGrads,
    ) -> Result<(Tensor, Tensor)> {
        let dx = self
            .mlp
            .backward(self_ctx.pre_norm, acts.mlp, d_out, &mut grads.mlp)?;
        // cross-attention: q = W_Q·x, k = W_K·m, v = W_V·m  →  dx and dm
        let (dx, dm) = self.cross_attn.backward(
            cross_ctx,
            Some(memory),
            acts.cross_attn,
            dx,
            &mut grads.cross_attn,
        )?;
        let dm = dm.expect("cross-attention returns the memory's gradient");
        let (dx, _) =
            self.self_attn
                .backward(self_ctx, None, acts.self_attn, dx, &mut grads.self_attn)?;
        Ok((dx, dm))
    }
}

/// Gradients of every parameter of an [`EncoderDecoderLm`], shaped as the parameters.
#[derive(Clone, Debug)]
struct Grads {
    src_embed: Option<EmbeddingGrads>,
    enc_pos: Option<EmbeddingGrads>,
    encoder: Vec<LayerGrads>,
    enc_norm: Option<NormGrads>,
    tgt_embed: EmbeddingGrads,
    dec_pos: Option<EmbeddingGrads>,
    decoder: Vec<DecoderLayerGrads>,
    dec_norm: Option<NormGrads>,
    lm_head: Option<LinearGrads>,
}

/// What the encoder's backward needs from its forward.
struct EncActs {
    layers: Vec<LayerActs>,
    /// pre-norm: the last layer's output and the final norm's statistics
    final_norm: Option<(Tensor, NormCache)>,
}

/// What the decoder's backward needs from its forward.
struct DecActs {
    layers: Vec<DecoderLayerActs>,
    final_norm: Option<(Tensor, NormCache)>,
    /// `[B,T,C]` the input of the LM head
    head_in: Tensor,
}

/// A trainable encoder-decoder Transformer: see the module docs.
#[derive(Clone, Debug)]
pub struct EncoderDecoderLm {
    config: EncoderDecoderConfig,
    /// Which attention kernel runs forward and backward (both give the same numbers).
    pub kernel: Kernel,
    /// `[src_vocab, C]`; `None` when shared with `tgt_embed`
    src_embed: Option<Embedding>,
    /// `[max_len, C]` learned encoder positions
    enc_pos: Option<Embedding>,
    encoder: Vec<Layer>,
    /// pre-norm only
    enc_norm: Option<Norm>,
    /// `[V, C]` the target table (the shared one when `share_embeddings`)
    tgt_embed: Embedding,
    /// `[max_len, C]` learned decoder positions
    dec_pos: Option<Embedding>,
    decoder: Vec<DecoderLayer>,
    /// pre-norm only
    dec_norm: Option<Norm>,
    /// `[V, C]`; `None` when tied to `tgt_embed`
    lm_head: Option<Linear>,
    /// `[max_len, C]` fixed sinusoidal positions
    sinusoidal: Option<Tensor>,
    rope: Option<Rope>,
    /// `[H]` ALiBi slopes
    alibi: Option<Vec<f32>>,
    grads: Grads,
}

/// Visits an attention block's four projections under `{prefix}.{q,k,v,out}_proj`.
macro_rules! visit_attn {
    ($f:ident, $prefix:expr, $p:expr, $g:expr $(, $m:tt)?) => {{
        let prefix = $prefix;
        match (& $($m)? $p.qkv, & $($m)? $g.qkv) {
            (QkvProj::Split { q, k, v }, QkvGrads::Split { q: gq, k: gk, v: gv }) => {
                visit_linear!($f, format!("{prefix}.q_proj"), q, gq $(, $m)?);
                visit_linear!($f, format!("{prefix}.k_proj"), k, gk $(, $m)?);
                visit_linear!($f, format!("{prefix}.v_proj"), v, gv $(, $m)?);
            }
            _ => unreachable!("encoder-decoder attention has split projections"),
        }
        visit_linear!($f, format!("{prefix}.out_proj"), $p.o, $g.o $(, $m)?);
    }};
}

/// Visits an FFN block: `fc1` (the activated branch), `fc1_linear` (gated only), `fc2`,
/// then its norm as `final_layer_norm`.
macro_rules! visit_mlp {
    ($f:ident, $pre:expr, $p:expr, $g:expr $(, $m:tt)?) => {{
        let pre = $pre;
        visit_linear!($f, format!("{pre}fc1"), $p.ffn.up, $g.ffn.up $(, $m)?);
        if let (Some(u), Some(gu)) = (& $($m)? $p.ffn.gate_up, & $($m)? $g.ffn.gate_up) {
            visit_linear!($f, format!("{pre}fc1_linear"), u, gu $(, $m)?);
        }
        visit_linear!($f, format!("{pre}fc2"), $p.ffn.down, $g.ffn.down $(, $m)?);
        visit_norm!($f, format!("{pre}final_layer_norm"), $p.norm, $g.norm $(, $m)?);
    }};
}

/// The one enumeration of parameters, names and order (see `walk_params!` in model.rs).
macro_rules! walk_params {
    ($s:ident, $f:ident $(, $m:tt)?) => {{
        let shared = $s.src_embed.is_none();
        if shared {
            $f("model.shared.weight", & $($m)? $s.tgt_embed.table, & $($m)? $s.grads.tgt_embed.table);
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.src_embed, & $($m)? $s.grads.src_embed) {
            $f("model.encoder.embed_tokens.weight", & $($m)? p.table, & $($m)? g.table);
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.enc_pos, & $($m)? $s.grads.enc_pos) {
            $f("model.encoder.embed_positions.weight", & $($m)? p.table, & $($m)? g.table);
        }
        for (l, (p, g)) in (& $($m)? $s.encoder).into_iter().zip(& $($m)? $s.grads.encoder).enumerate() {
            let pre = format!("model.encoder.layers.{l}.");
            visit_attn!($f, format!("{pre}self_attn"), p.attn, g.attn $(, $m)?);
            visit_norm!($f, format!("{pre}self_attn_layer_norm"), p.attn.norm, g.attn.norm $(, $m)?);
            visit_mlp!($f, pre, p.mlp, g.mlp $(, $m)?);
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.enc_norm, & $($m)? $s.grads.enc_norm) {
            visit_norm!($f, "model.encoder.layer_norm", *p, *g $(, $m)?);
        }
        if !shared {
            $f("model.decoder.embed_tokens.weight", & $($m)? $s.tgt_embed.table, & $($m)? $s.grads.tgt_embed.table);
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.dec_pos, & $($m)? $s.grads.dec_pos) {
            $f("model.decoder.embed_positions.weight", & $($m)? p.table, & $($m)? g.table);
        }
        for (l, (p, g)) in (& $($m)? $s.decoder).into_iter().zip(& $($m)? $s.grads.decoder).enumerate() {
            let pre = format!("model.decoder.layers.{l}.");
            visit_attn!($f, format!("{pre}self_attn"), p.self_attn, g.self_attn $(, $m)?);
            visit_norm!($f, format!("{pre}self_attn_layer_norm"), p.self_attn.norm, g.self_attn.norm $(, $m)?);
            visit_attn!($f, format!("{pre}encoder_attn"), p.cross_attn, g.cross_attn $(, $m)?);
            visit_norm!($f, format!("{pre}encoder_attn_layer_norm"), p.cross_attn.norm, g.cross_attn.norm $(, $m)?);
            visit_mlp!($f, pre, p.mlp, g.mlp $(, $m)?);
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.dec_norm, & $($m)? $s.grads.dec_norm) {
            visit_norm!($f, "model.decoder.layer_norm", *p, *g $(, $m)?);
        }
        if let (Some(p), Some(g)) = (& $($m)? $s.lm_head, & $($m)? $s.grads.lm_head) {
            visit_linear!($f, "lm_head", p, g $(, $m)?);
        }
    }};
}

/// Rows of `t` positions each, `0..t` per row: `[B·T]`.
fn row_positions(b: usize, t: usize) -> Vec<usize> {
    (0..b * t).map(|i| i % t).collect()
}

/// The encoder's symmetric ALiBi bias `[1, H, S, S]`: −slope_h·|i − j|.
fn symmetric_alibi(slopes: &[f32], s: usize) -> Tensor {
    Tensor::from_fn(&[1, slopes.len(), s, s], |k| {
        let (h, i, j) = (k / (s * s), k / s % s, k % s);
        -slopes[h] * i.abs_diff(j) as f32
    })
}

impl EncoderDecoderLm {
    /// A freshly initialised model (see the module docs), all of whose random draws
    /// come from `seed`.
    pub fn new(config: &EncoderDecoderConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let c = config;
        let (cw, f) = (c.d_model, c.ffn_dim);
        let (h, g, d) = (c.n_heads, c.n_kv_heads, c.head_dim());
        let mut rng = Rng::new(seed);
        let linear = |rng: &mut Rng, out: usize, inp: usize, std: f32| {
            init_linear(rng, out, inp, std, c.bias)
        };
        let (act, gated) = c.ffn.activation();
        let attn = |rng: &mut Rng, resid_std: f32| -> Result<AttnBlock> {
            let q = linear(rng, h * d, cw, INIT_STD)?;
            let k = linear(rng, g * d, cw, INIT_STD)?;
            let v = linear(rng, g * d, cw, INIT_STD)?;
            let o = linear(rng, cw, h * d, resid_std)?;
            Ok(AttnBlock {
                norm: Norm::new(c.norm, cw, c.bias)?,
                qkv: QkvProj::Split { q, k, v },
                o,
            })
        };
        let mlp = |rng: &mut Rng, resid_std: f32| -> Result<FfnBlock> {
            let up = linear(rng, f, cw, INIT_STD)?;
            let gate_up = if gated {
                Some(linear(rng, f, cw, INIT_STD)?)
            } else {
                None
            };
            let down = linear(rng, cw, f, resid_std)?;
            Ok(FfnBlock {
                norm: Norm::new(c.norm, cw, c.bias)?,
                ffn: FeedForward::new(up, gate_up, down, act)?,
            })
        };
        let final_norm = || -> Result<Option<Norm>> {
            c.pre_norm
                .then(|| Norm::new(c.norm, cw, c.bias))
                .transpose()
        };
        let learned = |rng: &mut Rng| -> Result<Option<Embedding>> {
            (c.position == PositionKind::Learned)
                .then(|| Embedding::new(rng.tensor(&[c.max_len, cw], INIT_STD)))
                .transpose()
        };

        // draws in visiting order
        let shared = c
            .share_embeddings
            .then(|| Embedding::new(rng.tensor(&[c.tgt_vocab, cw], INIT_STD)))
            .transpose()?;
        let src_embed = if shared.is_some() {
            None
        } else {
            Some(Embedding::new(rng.tensor(&[c.src_vocab, cw], INIT_STD))?)
        };
        let enc_pos = learned(&mut rng)?;
        let enc_std = INIT_STD / ((2 * c.n_encoder_layers) as f32).sqrt();
        let mut encoder = Vec::with_capacity(c.n_encoder_layers);
        for _ in 0..c.n_encoder_layers {
            let attn = attn(&mut rng, enc_std)?;
            let mlp = mlp(&mut rng, enc_std)?;
            encoder.push(Layer { attn, mlp });
        }
        let enc_norm = final_norm()?;
        let tgt_embed = match shared {
            Some(table) => table,
            None => Embedding::new(rng.tensor(&[c.tgt_vocab, cw], INIT_STD))?,
        };
        let dec_pos = learned(&mut rng)?;
        let dec_std = INIT_STD / ((3 * c.n_decoder_layers) as f32).sqrt();
        let mut decoder = Vec::with_capacity(c.n_decoder_layers);
        for _ in 0..c.n_decoder_layers {
            let self_attn = attn(&mut rng, dec_std)?;
            let cross_attn = attn(&mut rng, dec_std)?;
            let mlp = mlp(&mut rng, dec_std)?;
            decoder.push(DecoderLayer {
                self_attn,
                cross_attn,
                mlp,
            });
        }
        let dec_norm = final_norm()?;
        let lm_head = if c.tie_embeddings {
            None
        } else {
            Some(Linear::new(rng.tensor(&[c.tgt_vocab, cw], INIT_STD), None)?)
        };

        let sinusoidal = (c.position == PositionKind::Sinusoidal)
            .then(|| sinusoidal_table(c.max_len, cw, SinusoidalLayout::Interleaved));
        let rope = match c.position {
            PositionKind::Rope { theta } => Some(Rope::new(d, theta, RopeLayout::HalfSplit)?),
            _ => None,
        };
        let alibi = (c.position == PositionKind::Alibi).then(|| alibi_slopes(h));
        let grads = Grads {
            src_embed: src_embed.as_ref().map(EmbeddingGrads::zeros),
            enc_pos: enc_pos.as_ref().map(EmbeddingGrads::zeros),
            encoder: encoder.iter().map(Layer::zero_grads).collect(),
            enc_norm: enc_norm.as_ref().map(Norm::zero_grads),
            tgt_embed: EmbeddingGrads::zeros(&tgt_embed),
            dec_pos: dec_pos.as_ref().map(EmbeddingGrads::zeros),
            decoder: decoder.iter().map(DecoderLayer::zero_grads).collect(),
            dec_norm: dec_norm.as_ref().map(Norm::zero_grads),
            lm_head: lm_head.as_ref().map(LinearGrads::zeros),
        };
        Ok(EncoderDecoderLm {
            config: config.clone(),
            kernel: Kernel::Tiled,
            src_embed,
            enc_pos,
            encoder,
            enc_norm,
            tgt_embed,
            dec_pos,
            decoder,
            dec_norm,
            lm_head,
            sinusoidal,
            rope,
            alibi,
            grads,
        })
    }

    pub fn config(&self) -> &EncoderDecoderConfig {
        &self.config
    }

    /// Number of trainable parameters (a shared or tied table counts once).
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

    /// The factor on token embeddings: √C with `scale_embeddings`, else 1.
    fn embed_scale(&self) -> f32 {
        if self.config.scale_embeddings {
            (self.config.d_model as f32).sqrt()
        } else {
            1.0
        }
    }

    /// The encoder's token table (the shared one when embeddings are shared).
    fn src_table(&self) -> &Embedding {
        self.src_embed.as_ref().unwrap_or(&self.tgt_embed)
    }

    /// Checks sizes: B, S, T ≥ 1, `[B·S]` source ids and mask, `[B·T]` inputs (and
    /// targets), and S, T against a position table.
    fn check(
        &self,
        source: &Source,
        inputs: &[usize],
        targets: Option<&[i64]>,
        b: usize,
        t: usize,
    ) -> Result<()> {
        let s = source.len;
        if b == 0 || t == 0 || s == 0 {
            return Err(Error::invalid(
                "batch",
                format!("empty batch: B = {b}, S = {s}, T = {t} must all be at least 1"),
            ));
        }
        let sizes = [
            ("batch source.ids", source.ids.len(), b * s),
            ("batch source.mask", source.mask.len(), b * s),
            ("batch inputs", inputs.len(), b * t),
            ("batch targets", targets.map_or(b * t, <[i64]>::len), b * t),
        ];
        for (what, got, want) in sizes {
            if got != want {
                return Err(Error::Shape {
                    tensor: what.into(),
                    expected: format!(
                        "{want} entries ([B, S] = [{b}, {s}] or [B, T] = [{b}, {t}])"
                    ),
                    got: vec![got],
                });
            }
        }
        let table = matches!(
            self.config.position,
            PositionKind::Learned | PositionKind::Sinusoidal
        );
        let longest = s.max(t);
        if table && longest > self.config.max_len {
            return Err(Error::OutOfRange {
                what: "position (source or target longer than the model's max_len)".into(),
                index: longest - 1,
                size: self.config.max_len,
            });
        }
        Ok(())
    }

    /// The fields the attention contexts read, borrowed one by one.
    fn setup(&self) -> AttnSetup<'_> {
        AttnSetup {
            config: &self.config,
            kernel: self.kernel,
            rope: self.rope.as_ref(),
            alibi: self.alibi.as_deref(),
        }
    }

    /// The encoder's symmetric ALiBi bias for sources of length S, if ALiBi is on.
    fn enc_bias(&self, s: usize) -> Option<Tensor> {
        self.alibi
            .as_deref()
            .map(|slopes| symmetric_alibi(slopes, s))
    }

    /// The encoder: source → (memory `[B,S,C]`, what the backward needs).
    fn encode(&self, source: &Source, b: usize) -> Result<(Tensor, EncActs)> {
        let (s, c) = (source.len, self.config.d_model);
        let positions = row_positions(b, s);
        let bias = self.enc_bias(s);
        let ctx = self.setup().ctx(
            AttnKind::Encoder,
            &source.mask,
            bias.as_ref(),
            &positions,
            b,
            s,
            s,
        )?;
        // e₀ = k·src_embed[src] + positions
        let mut e = embed(
            self.src_table(),
            self.embed_scale(),
            self.enc_pos.as_ref(),
            self.sinusoidal.as_ref(),
            &source.ids,
            &positions,
        )?
        .reshape(&[b, s, c])?;
        let mut layers = Vec::with_capacity(self.encoder.len());
        for layer in &self.encoder {
            let (y, acts) = layer.forward(&ctx, e)?;
            layers.push(acts);
            e = y;
        }
        let (memory, final_norm) = match &self.enc_norm {
            Some(norm) => {
                let (m, cache) = norm.forward(&e)?;
                (m, Some((e, cache)))
            }
            None => (e, None),
        };
        Ok((memory, EncActs { layers, final_norm }))
    }

    /// The decoder: inputs `[B·T]` over `memory` → (logits `[B,T,V]`, what the backward
    /// needs).
    fn decode(
        &self,
        source: &Source,
        memory: &Tensor,
        ids: &[usize],
        b: usize,
        t: usize,
    ) -> Result<(Tensor, DecActs)> {
        let (s, c) = (source.len, self.config.d_model);
        let positions = row_positions(b, t);
        let setup = self.setup();
        let self_ctx = setup.ctx(AttnKind::DecoderSelf, &[], None, &positions, b, t, t)?;
        let cross_ctx = setup.ctx(AttnKind::Cross, &source.mask, None, &[], b, t, s)?;
        // x₀ = k·tgt_embed[ids] + positions
        let mut x = embed(
            &self.tgt_embed,
            self.embed_scale(),
            self.dec_pos.as_ref(),
            self.sinusoidal.as_ref(),
            ids,
            &positions,
        )?
        .reshape(&[b, t, c])?;
        let mut layers = Vec::with_capacity(self.decoder.len());
        for layer in &self.decoder {
            let (y, acts) = layer.forward(&self_ctx, &cross_ctx, x, memory)?;
            layers.push(acts);
            x = y;
        }
        let (head_in, final_norm) = match &self.dec_norm {
            Some(norm) => {
                let (h, cache) = norm.forward(&x)?;
                (h, Some((x, cache)))
            }
            None => (x, None),
        };
        let logits = lm_logits(&head_in, self.lm_head.as_ref(), &self.tgt_embed.table, 1.0)?;
        let acts = DecActs {
            layers,
            final_norm,
            head_in,
        };
        Ok((logits, acts))
    }

    /// The whole backward from d loss / d logits `[B,T,V]`; **accumulates** into the
    /// model's gradients.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        source: &Source,
        ids: &[usize],
        b: usize,
        t: usize,
        memory: &Tensor,
        enc: EncActs,
        dec: DecActs,
        dlogits: &Tensor,
    ) -> Result<()> {
        let (s, c) = (source.len, self.config.d_model);
        // logits = h·Wᵀ
        let dh = head_backward(
            self.lm_head.as_ref().zip(self.grads.lm_head.as_mut()),
            &self.tgt_embed.table,
            &mut self.grads.tgt_embed.table,
            &dec.head_in,
            dlogits,
        )?;
        // h = norm_dec(x) (pre-norm) or h = x
        let mut dx = match (&self.dec_norm, &dec.final_norm, &mut self.grads.dec_norm) {
            (Some(norm), Some((x, cache)), Some(g)) => norm.backward(&dh, x, cache, g)?,
            _ => dh,
        };

        // the contexts borrow the configuration fields, the walk the gradient fields
        let setup = AttnSetup {
            config: &self.config,
            kernel: self.kernel,
            rope: self.rope.as_ref(),
            alibi: self.alibi.as_deref(),
        };
        let dec_positions = row_positions(b, t);
        let self_ctx = setup.ctx(AttnKind::DecoderSelf, &[], None, &dec_positions, b, t, t)?;
        let cross_ctx = setup.ctx(AttnKind::Cross, &source.mask, None, &[], b, t, s)?;
        let mut d_memory = Tensor::zeros(&[b, s, c]);
        for ((layer, la), lg) in self
            .decoder
            .iter()
            .zip(dec.layers)
            .zip(self.grads.decoder.iter_mut())
            .rev()
        {
            // every layer's cross-attention reads the memory: the gradients add up
            let (d, dm) = layer.backward(&self_ctx, &cross_ctx, memory, la, dx, lg)?;
            add_into(&mut d_memory, &dm);
            dx = d;
        }
        // x₀ = k·tgt_embed[ids] + dec_pos[positions]
        let scale = self.embed_scale();
        embed_backward(
            (&self.tgt_embed, &mut self.grads.tgt_embed),
            scale,
            self.dec_pos.as_ref().zip(self.grads.dec_pos.as_mut()),
            ids,
            &dec_positions,
            &dx.reshape(&[b * t, c])?,
        )?;

        // m = norm_enc(e) (pre-norm) or m = e
        let mut de = match (&self.enc_norm, &enc.final_norm, &mut self.grads.enc_norm) {
            (Some(norm), Some((e, cache)), Some(g)) => norm.backward(&d_memory, e, cache, g)?,
            _ => d_memory,
        };
        let enc_positions = row_positions(b, s);
        let bias = self.enc_bias(s);
        let ctx = setup.ctx(
            AttnKind::Encoder,
            &source.mask,
            bias.as_ref(),
            &enc_positions,
            b,
            s,
            s,
        )?;
        for ((layer, la), lg) in self
            .encoder
            .iter()
            .zip(enc.layers)
            .zip(self.grads.encoder.iter_mut())
            .rev()
        {
            de = layer.backward(&ctx, la, de, lg)?;
        }
        // e₀ = k·src_embed[src] + enc_pos[positions]; a shared table adds into one gradient
        let src = match (&self.src_embed, &mut self.grads.src_embed) {
            (Some(table), Some(g)) => (table, g),
            _ => (&self.tgt_embed, &mut self.grads.tgt_embed),
        };
        embed_backward(
            src,
            scale,
            self.enc_pos.as_ref().zip(self.grads.enc_pos.as_mut()),
            &source.ids,
            &enc_positions,
            &de.reshape(&[b * s, c])?,
        )
    }

    /// Logits `[B,T,V]` of decoder `inputs` (`[B·T]` ids) over `source`, no gradients.
    pub fn forward_logits(
        &self,
        source: &Source,
        inputs: &[usize],
        b: usize,
        t: usize,
    ) -> Result<Tensor> {
        self.check(source, inputs, None, b, t)?;
        let (memory, _) = self.encode(source, b)?;
        Ok(self.decode(source, &memory, inputs, b, t)?.0)
    }

    /// Forward, then backward from the given logits gradient `dlogits` `[B,T,V]`:
    /// **accumulates** d(Σ logits ∘ dlogits)/dθ into the gradients. For losses other
    /// than the built-in cross-entropy, and for gradient checks.
    pub fn backward_from_logits(
        &mut self,
        source: &Source,
        inputs: &[usize],
        b: usize,
        t: usize,
        dlogits: &Tensor,
    ) -> Result<()> {
        self.check(source, inputs, None, b, t)?;
        let (memory, enc) = self.encode(source, b)?;
        let (logits, dec) = self.decode(source, &memory, inputs, b, t)?;
        if dlogits.shape() != logits.shape() {
            return Err(Error::shape(
                "dlogits",
                format!("{:?} like the logits", logits.shape()),
                dlogits.shape(),
            ));
        }
        dlogits.check_finite("dlogits")?;
        self.backward(source, inputs, b, t, &memory, enc, dec, dlogits)
    }

    /// The batch's source, or an error saying an encoder-decoder batch needs one.
    fn source_of(batch: &Batch) -> Result<&Source> {
        batch.source.as_ref().ok_or_else(|| {
            Error::invalid(
                "batch.source",
                "an encoder-decoder model needs a source (see seq2seq::source_target_batch)",
            )
        })
    }

    /// The loss of a batch (mean cross-entropy over scored targets), no gradients.
    pub fn loss(&self, batch: &Batch) -> Result<f32> {
        let source = Self::source_of(batch)?;
        self.check(
            source,
            &batch.inputs,
            Some(&batch.targets),
            batch.batch,
            batch.len,
        )?;
        let mut logits = self.forward_logits(source, &batch.inputs, batch.batch, batch.len)?;
        cross_entropy_in_place(&mut logits, &batch.targets)
    }

    /// Greedy decoding: every row starts from `start` and takes the arg-max token
    /// `steps` times; returns the `[B·steps]` generated tokens (without `start`). The
    /// encoder runs once; the decoder re-reads the whole prefix at each step.
    pub fn generate(&self, source: &Source, start: usize, steps: usize) -> Result<Vec<usize>> {
        let b = source.ids.len() / source.len.max(1);
        self.check(source, &vec![start; b], None, b, 1)?;
        let v = self.config.tgt_vocab;
        let (memory, _) = self.encode(source, b)?;
        let mut rows: Vec<Vec<usize>> = vec![vec![start]; b];
        for _ in 0..steps {
            let t = rows[0].len();
            let ids: Vec<usize> = rows.concat();
            self.check(source, &ids, None, b, t)?;
            let (logits, _) = self.decode(source, &memory, &ids, b, t)?;
            for (r, row) in rows.iter_mut().enumerate() {
                let last = &logits.data()[((r * t) + t - 1) * v..((r * t) + t) * v];
                let best = (0..v).fold(0, |best, i| if last[i] > last[best] { i } else { best });
                row.push(best);
            }
        }
        Ok(rows
            .into_iter()
            .flat_map(|r| r.into_iter().skip(1))
            .collect())
    }

    /// Writes `dir/config.json` and `dir/model.safetensors` (each atomically),
    /// creating `dir` (see the module docs).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        self.visit_ref(&mut |name, p, _| tensors.push((name.to_string(), p.clone())));
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        crate::io::save(&dir.join("model.safetensors"), &refs, Some(meta))?;
        let config = json!({
            "architectures": [ENCODER_DECODER_ARCHITECTURE],
            "model_type": "qkv_encoder_decoder",
            "is_encoder_decoder": true,
            "qkv": self.config,
        });
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serialises");
        write_atomic(&dir.join("config.json"), format!("{text}\n").as_bytes())
    }

    /// Reads a folder written by [`EncoderDecoderLm::save`]. Gradients start at zero.
    pub fn load(dir: &Path) -> Result<Self> {
        #[derive(Deserialize)]
        struct Native {
            #[serde(default)]
            architectures: Vec<String>,
            qkv: EncoderDecoderConfig,
        }
        let native: Native = read_config(dir)?;
        if native.architectures.first().map(String::as_str) != Some(ENCODER_DECODER_ARCHITECTURE) {
            return Err(bad_field(
                dir,
                "architectures",
                format!("expected [\"{ENCODER_DECODER_ARCHITECTURE}\"]"),
            ));
        }
        native
            .qkv
            .validate()
            .map_err(|e| bad_field(dir, "qkv", e.to_string()))?;
        let mut m = EncoderDecoderLm::new(&native.qkv, 0)?;
        let ckpt = Checkpoint::open(dir)?;
        let mut err: Option<Error> = None;
        m.visit_mut(&mut |name, p, _| {
            if err.is_none() {
                match ckpt.tensor_shaped(name, p.shape()) {
                    Ok(t) => *p = t,
                    Err(e) => err = Some(e),
                }
            }
        });
        match err {
            Some(e) => Err(e),
            None => Ok(m),
        }
    }
}

/// What the attention contexts are made of. Borrowed field by field (not through
/// `&self`), so that the backward can hold contexts while it writes the gradients.
struct AttnSetup<'a> {
    config: &'a EncoderDecoderConfig,
    kernel: Kernel,
    rope: Option<&'a Rope>,
    alibi: Option<&'a [f32]>,
}

impl<'a> AttnSetup<'a> {
    /// The attention settings shared by every layer of one kind: the encoder's
    /// self-attention (bidirectional, source padding, symmetric ALiBi `enc_bias`), the
    /// decoder's self-attention (causal, ALiBi) or cross-attention (source padding).
    #[allow(clippy::too_many_arguments)]
    fn ctx(
        &self,
        kind: AttnKind,
        mask: &'a [bool],
        enc_bias: Option<&'a Tensor>,
        positions: &'a [usize],
        b: usize,
        t: usize,
        s: usize,
    ) -> Result<Ctx<'a>> {
        let c = self.config;
        let spec = match kind {
            AttnKind::Encoder => AttentionSpec {
                key_padding: Some(mask),
                bias: enc_bias
                    .map(Tensor::as_broadcast)
                    .transpose()?
                    .map(Bias::Dense),
                kernel: self.kernel,
                ..Default::default()
            },
            AttnKind::DecoderSelf => AttentionSpec {
                causal: Some(CausalAlign::TopLeft),
                bias: self.alibi.map(|slopes| Bias::Alibi { slopes }),
                kernel: self.kernel,
                ..Default::default()
            },
            AttnKind::Cross => AttentionSpec {
                key_padding: Some(mask),
                kernel: self.kernel,
                ..Default::default()
            },
        };
        Ok(Ctx {
            pre_norm: c.pre_norm,
            rope: match kind {
                AttnKind::Cross => None,
                _ => self.rope,
            },
            positions,
            spec,
            b,
            t,
            s,
            h: c.n_heads,
            g: c.n_kv_heads,
            d: c.head_dim(),
        })
    }
}

/// Which attention of the model a context is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttnKind {
    Encoder,
    DecoderSelf,
    Cross,
}

impl TrainableModel for EncoderDecoderLm {
    fn zero_grads(&mut self) {
        self.visit_mut(&mut |_, _, g| g.data_mut().fill(0.0));
    }

    /// A non-finite loss is returned as it is, without a backward (the trainer reports
    /// it); the gradients are then unchanged.
    fn loss_and_backward(&mut self, batch: &Batch) -> Result<f32> {
        let source = Self::source_of(batch)?;
        let (b, t) = (batch.batch, batch.len);
        self.check(source, &batch.inputs, Some(&batch.targets), b, t)?;
        let (memory, enc) = self.encode(source, b)?;
        let (mut logits, dec) = self.decode(source, &memory, &batch.inputs, b, t)?;
        // the logits become d loss / d logits in place
        let loss = cross_entropy_in_place(&mut logits, &batch.targets)?;
        if !loss.is_finite() {
            return Ok(loss);
        }
        self.backward(source, &batch.inputs, b, t, &memory, enc, dec, &logits)?;
        Ok(loss)
    }

    fn logits(&self, batch: &Batch) -> Result<Tensor> {
        let source = Self::source_of(batch)?;
        self.forward_logits(source, &batch.inputs, batch.batch, batch.len)
    }

    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        self.visit_mut(&mut |name, p, g| f(name, p, g));
    }

    fn save(&self, dir: &Path) -> Result<()> {
        EncoderDecoderLm::save(self, dir)
    }
}

/// A decoder-only task batch (prompt, separator, answer in one row, as
/// [`crate::train::tasks`] makes them) as an encoder-decoder batch: each row is split
/// at its first `separator`, which must sit at the same position k in every row.
/// The source is `inputs[..k]` (no padding); the decoder reads `inputs[k..]`, the
/// separator as start token followed by the answer shifted right, and is scored on
/// `targets[k..]`. Errors if a row lacks the separator, rows disagree on k, or a
/// target before k is scored (it would be lost).
///
/// `reverse`, length 3: inputs `3 1 4 | 10 4 1`, targets `−100 ×3, 4 1 3` →
/// source `3 1 4`, decoder inputs `10 4 1`, targets `4 1 3`.
pub fn source_target_batch(batch: &Batch, separator: usize) -> Result<Batch> {
    let (b, t) = (batch.batch, batch.len);
    if b == 0 || t == 0 || batch.inputs.len() != b * t || batch.targets.len() != b * t {
        return Err(Error::invalid(
            "batch",
            format!("needs B, T ≥ 1 and B·T inputs and targets, got B = {b}, T = {t}"),
        ));
    }
    let mut k = None;
    for (r, row) in batch.inputs.chunks_exact(t).enumerate() {
        let at = row.iter().position(|&x| x == separator).ok_or_else(|| {
            Error::invalid(
                "separator",
                format!("row {r} has no separator token {separator}"),
            )
        })?;
        match k {
            None if at == 0 => {
                return Err(Error::invalid(
                    "separator",
                    "the separator opens row 0: the source would be empty",
                ))
            }
            None => k = Some(at),
            Some(k) if k != at => {
                return Err(Error::invalid(
                    "separator",
                    format!("row {r} has it at {at}, row 0 at {k}: rows need equal source lengths"),
                ))
            }
            _ => {}
        }
    }
    let k = k.expect("B ≥ 1");
    let mut source = Vec::with_capacity(b * k);
    let mut inputs = Vec::with_capacity(b * (t - k));
    let mut targets = Vec::with_capacity(b * (t - k));
    for (row, tgt) in batch
        .inputs
        .chunks_exact(t)
        .zip(batch.targets.chunks_exact(t))
    {
        if tgt[..k].iter().any(|&x| x != IGNORE_INDEX) {
            return Err(Error::invalid(
                "targets",
                "a target inside the source part is scored; it has no place in the decoder",
            ));
        }
        source.extend_from_slice(&row[..k]);
        inputs.extend_from_slice(&row[k..]);
        targets.extend_from_slice(&tgt[k..]);
    }
    Ok(Batch {
        inputs,
        targets,
        batch: b,
        len: t - k,
        source: Some(Source {
            mask: vec![true; source.len()],
            ids: source,
            len: k,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_checks_name_fields() {
        let c = EncoderDecoderConfig::vaswani_style(12, 16, 2, 4, 8);
        c.validate().unwrap();
        let mut bad = c.clone();
        bad.src_vocab = 13;
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("share_embeddings"));
        bad.share_embeddings = false;
        bad.tie_embeddings = false;
        bad.validate().unwrap();
        bad.n_encoder_layers = 0;
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("n_encoder_layers"));
        let mut heads = c.clone();
        heads.n_kv_heads = 3;
        assert!(heads
            .validate()
            .unwrap_err()
            .to_string()
            .contains("n_kv_heads"));
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<EncoderDecoderConfig>(&s).unwrap(), c);
    }

    #[test]
    fn symmetric_alibi_is_minus_slope_times_distance() {
        let t = symmetric_alibi(&[0.5, 0.25], 3);
        assert_eq!(t.shape(), &[1, 2, 3, 3]);
        assert_eq!(
            &t.data()[..9],
            &[0.0, -0.5, -1.0, -0.5, 0.0, -0.5, -1.0, -0.5, 0.0]
        );
        assert_eq!(t.data()[9 + 2], -0.5);
    }
}
