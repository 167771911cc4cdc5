//! GPT-2 (Radford et al., 2019): a decoder-only Transformer. Token embeddings plus
//! learned absolute positions (`wpe`), then pre-norm blocks
//! `x += attn(ln_1(x)); x += mlp(ln_2(x))` with causal self-attention, a final `ln_f`,
//! and an LM head tied to the token embeddings.
//!
//! The family's quirk is OpenAI's `Conv1D`: it computes `x·W + b` with W stored
//! `[in, out]`, the transpose of `nn.Linear`. The attention's Q, K and V projections are
//! fused into one `c_attn` of width 3C; at load time its columns are split into the
//! three parallel maps W_Q, W_K, W_V (each `[C, C]` as a [`Linear`]), so GPT-2 runs
//! through exactly the same attention sub-layer as every other family.
//!
//! Checkpoints of `GPT2LMHeadModel` name tensors `transformer.h.0.attn.c_attn.weight`;
//! those saved from the base `GPT2Model` (including OpenAI's original `gpt2`) lack the
//! `transformer.` prefix. Both load.

use std::path::Path;

use serde::Deserialize;

use super::head::{lm_logits, load_lm_head};
use super::special::{special_tokens, TokenIds};
use super::{
    architecture, ffn_label, CausalLm, KvCache, LayerKv, Model, ModelInfo, SpecialTokens,
    TokenBatch, Weights,
};
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::Result;
use crate::io::{
    aliased_size, bad_field, check_heads, check_positive, epsilon, read_config, Checkpoint,
};
use crate::layers::{Embedding, FeedForward, LayerNorm, Linear};
use crate::ops::Activation;
use crate::position::LearnedPositions;
use crate::tensor::Tensor;
use crate::MultiHeadAttention;

/// Hugging Face `GPT2Config`. Sizes are required; the alternative names are those of
/// `attribute_map` (`hidden_size` → `n_embd`, …), which some tools write instead.
#[derive(Deserialize)]
pub(crate) struct Gpt2Config {
    #[serde(default)]
    architectures: Vec<String>,
    n_embd: Option<usize>,
    hidden_size: Option<usize>,
    n_layer: Option<usize>,
    num_hidden_layers: Option<usize>,
    n_head: Option<usize>,
    num_attention_heads: Option<usize>,
    n_positions: Option<usize>,
    max_position_embeddings: Option<usize>,
    vocab_size: usize,
    /// `None` (or absent) means 4·C.
    #[serde(default)]
    n_inner: Option<usize>,
    #[serde(default = "default_eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "default_activation")]
    pub(crate) activation_function: String,
    /// Divide scores by √D (always true in released checkpoints).
    #[serde(default = "yes")]
    pub(crate) scale_attn_weights: bool,
    /// Also divide layer l's scores by l + 1 (a training-stability option, off in
    /// OpenAI's checkpoints).
    #[serde(default)]
    pub(crate) scale_attn_by_inverse_layer_idx: bool,
    #[serde(default = "yes")]
    pub(crate) tie_word_embeddings: bool,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_eps() -> f64 {
    1e-5
}

fn default_activation() -> String {
    "gelu_new".into()
}

fn yes() -> bool {
    true
}

/// Runtime sizes, validated.
pub(crate) struct Dims {
    pub(crate) c: usize,
    pub(crate) layers: usize,
    pub(crate) heads: usize,
    pub(crate) positions: usize,
    pub(crate) vocab: usize,
    pub(crate) ffn: usize,
    pub(crate) eps: f32,
    pub(crate) act: Activation,
}

impl Gpt2Config {
    /// The sizes, epsilon and activation of this config, checked; errors name the
    /// field of `dir/config.json` at fault.
    pub(crate) fn validate(&self, dir: &Path) -> Result<Dims> {
        let c = aliased_size(
            dir,
            ("n_embd", self.n_embd),
            ("hidden_size", self.hidden_size),
            1,
        )?;
        let heads = aliased_size(
            dir,
            ("n_head", self.n_head),
            ("num_attention_heads", self.num_attention_heads),
            1,
        )?;
        check_heads(dir, "n_head", heads, "n_embd", c)?;
        let layers = aliased_size(
            dir,
            ("n_layer", self.n_layer),
            ("num_hidden_layers", self.num_hidden_layers),
            0,
        )?;
        let positions = aliased_size(
            dir,
            ("n_positions", self.n_positions),
            ("max_position_embeddings", self.max_position_embeddings),
            1,
        )?;
        let ffn = self.n_inner.unwrap_or(4 * c);
        check_positive(dir, &[("vocab_size", self.vocab_size), ("n_inner", ffn)])?;
        let eps = epsilon(dir, "layer_norm_epsilon", self.layer_norm_epsilon)?;
        let act = Activation::from_hf_name(&self.activation_function)
            .map_err(|e| bad_field(dir, "activation_function", e.to_string()))?;
        Ok(Dims {
            c,
            layers,
            heads,
            positions,
            vocab: self.vocab_size,
            ffn,
            eps,
            act,
        })
    }
}

/// Columns `[col0, col0 + n)` of a Conv1D weight `w`: [in, out_total], transposed into
/// an nn.Linear weight [n, in].
fn conv1d_columns(w: &Tensor, col0: usize, n: usize) -> Tensor {
    let (inp, out) = (w.shape()[0], w.shape()[1]);
    let src = w.data();
    Tensor::from_fn(&[n, inp], |k| {
        let (o, i) = (k / inp, k % inp);
        src[i * out + col0 + o]
    })
}

/// Conv1D `{name}.weight` `[inp, out]` and `{name}.bias` `[out]` as a Linear `[out, inp]`.
fn conv1d(w: &Weights, name: &str, inp: usize, out: usize) -> Result<Linear> {
    let weight = w.tensor(&format!("{name}.weight"), &[inp, out])?;
    let bias = w.tensor(&format!("{name}.bias"), &[out])?;
    Linear::new(conv1d_columns(&weight, 0, out), Some(bias))
}

/// One pre-norm block.
struct Block {
    ln_1: LayerNorm,
    attn: AttentionLayer,
    /// Score scale: 1/√D, or 1 without `scale_attn_weights`, divided by l + 1 under
    /// `scale_attn_by_inverse_layer_idx`.
    scale: f32,
    ln_2: LayerNorm,
    mlp: FeedForward,
}

impl Block {
    fn load(w: &Weights, l: usize, d: &Dims, cfg: &Gpt2Config) -> Result<Self> {
        let p = |s: &str| format!("h.{l}.{s}");
        let c = d.c;
        // c_attn computes [q | k | v] = x·W + b with W: [C, 3C]; its three column
        // blocks are the three independent projections.
        let fused = w.tensor(&p("attn.c_attn.weight"), &[c, 3 * c])?;
        let fused_bias = w.tensor(&p("attn.c_attn.bias"), &[3 * c])?;
        let part = |k: usize| -> Result<Linear> {
            let bias = fused_bias.data()[k * c..(k + 1) * c].to_vec();
            Linear::new(
                conv1d_columns(&fused, k * c, c),
                Some(Tensor::new(&[c], bias)?),
            )
        };
        let mha = MultiHeadAttention::new(
            part(0)?,
            part(1)?,
            part(2)?,
            conv1d(w, &p("attn.c_proj"), c, c)?,
            d.heads,
            d.heads,
        )?;
        let mut scale = if cfg.scale_attn_weights {
            1.0 / ((c / d.heads) as f32).sqrt()
        } else {
            1.0
        };
        if cfg.scale_attn_by_inverse_layer_idx {
            scale /= (l + 1) as f32;
        }
        Ok(Block {
            ln_1: w.layer_norm(&p("ln_1"), c, d.eps)?,
            attn: AttentionLayer { mha, rope: None },
            scale,
            ln_2: w.layer_norm(&p("ln_2"), c, d.eps)?,
            mlp: FeedForward::new(
                conv1d(w, &p("mlp.c_fc"), c, d.ffn)?,
                None,
                conv1d(w, &p("mlp.c_proj"), d.ffn, c)?,
                d.act,
            )?,
        })
    }

    /// x: [B, T, C] → [B, T, C]; appends this layer's K/V to `kv`.
    fn forward(&self, mut x: Tensor, opts: &AttendOpts, kv: &mut LayerKv) -> Result<Tensor> {
        let opts = AttendOpts {
            scale: Some(self.scale),
            ..*opts
        };
        let a = self
            .attn
            .self_attention(&self.ln_1.forward(&x)?, &opts, Some(kv))?;
        x.add_assign(&a);
        let m = self.mlp.forward(&self.ln_2.forward(&x)?)?;
        x.add_assign(&m);
        Ok(x)
    }
}

/// A loaded GPT-2.
pub struct Gpt2 {
    info: ModelInfo,
    special: SpecialTokens,
    /// [V, C]
    wte: Embedding,
    /// [P, C]
    wpe: LearnedPositions,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    /// [V, C] when the checkpoint has its own head; `None` when tied to `wte`, whose
    /// table is then read in place rather than copied.
    lm_head: Option<Linear>,
}

/// Loads a `GPT2LMHeadModel` or `GPT2Model` folder.
pub fn load(dir: &Path, ckpt: &Checkpoint) -> Result<Model> {
    let cfg: Gpt2Config = read_config(dir)?;
    let d = cfg.validate(dir)?;
    let w = Weights::detect(ckpt, &["transformer.", ""], "wte.weight");
    let wte = w.embedding("wte", d.vocab, d.c)?;
    let wpe = LearnedPositions::new(w.tensor("wpe.weight", &[d.positions, d.c])?)?;
    let blocks = (0..d.layers)
        .map(|l| Block::load(&w, l, &d, &cfg))
        .collect::<Result<Vec<_>>>()?;
    let ln_f = w.layer_norm("ln_f", d.c, d.eps)?;
    let lm_head = load_lm_head(ckpt, cfg.tie_word_embeddings, d.vocab, d.c)?;
    let info = ModelInfo {
        family: "gpt2".into(),
        architecture: architecture(&cfg.architectures, "GPT2LMHeadModel"),
        layers: d.layers,
        decoder_layers: None,
        hidden: d.c,
        heads: d.heads,
        kv_heads: d.heads,
        head_dim: d.c / d.heads,
        ffn_dim: d.ffn,
        vocab: d.vocab,
        max_positions: Some(d.positions),
        position: "learned absolute".into(),
        norm: format!("LayerNorm, pre-norm, eps {:e}", d.eps),
        ffn: ffn_label(d.act, false),
    };
    let special = special_tokens(dir, cfg.tokens)?;
    Ok(Model::Causal(Box::new(Gpt2 {
        info,
        special,
        wte,
        wpe,
        blocks,
        ln_f,
        lm_head,
    })))
}

impl CausalLm for Gpt2 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// tokens: [B, T] → logits [B, T, V], appending to `cache`.
    fn forward_cached(&self, tokens: &TokenBatch, cache: &mut KvCache) -> Result<Tensor> {
        tokens.check_vocab(self.info.vocab)?;
        cache.check_layers(self.blocks.len())?;
        let (b, t, c) = (tokens.batch, tokens.len, self.info.hidden);
        // Real tokens must fit `wpe`; padding positions come back clamped into it.
        let step = cache.begin_step(&tokens.mask, t, Some(self.wpe.max_positions()))?;
        let mut x = self.wte.forward(&tokens.ids)?;
        self.wpe.add_to(&mut x, &step.positions)?;
        let mut x = x.reshape(&[b, t, c])?;
        let opts = AttendOpts {
            positions: &step.positions,
            key_padding: Some(&step.key_padding),
            causal: true,
            ..Default::default()
        };
        for (block, kv) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = block.forward(x, &opts, kv)?;
        }
        let h = self.ln_f.forward(&x)?;
        lm_logits(&h, self.lm_head.as_ref(), &self.wte.table, 1.0)
    }
}
