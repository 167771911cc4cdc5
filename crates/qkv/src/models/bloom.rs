//! BLOOM (BigScience, 2022): a decoder-only Transformer with no position vectors at
//! all. Position enters only through ALiBi, a per-head linear penalty on the scores,
//! so there is no maximum length. Token embeddings pass through their own LayerNorm
//! (`word_embeddings_layernorm`), then pre-norm blocks, a final `ln_f` and an LM head
//! tied to the embeddings.
//!
//! Quirks handled here: the fused `query_key_value` projection interleaves Q, K and V
//! per head (rows `[H, 3, D]`), split at load time into the three parallel maps;
//! `apply_residual_connection_post_layernorm` takes the residual after the norm; the
//! MLP's GELU is the tanh approximation.

use std::path::Path;

use serde::Deserialize;

use super::head::{lm_logits, load_lm_head};
use super::special::{special_tokens, TokenIds};
use super::{
    architecture, ffn_label, CausalLm, KvCache, LayerKv, Model, ModelInfo, SpecialTokens,
    TokenBatch, Weights,
};
use crate::attention::Bias;
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::Result;
use crate::io::{aliased_size, check_heads, check_positive, epsilon, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, LayerNorm, Linear};
use crate::ops::Activation;
use crate::position::alibi_slopes;
use crate::tensor::Tensor;
use crate::MultiHeadAttention;

/// Hugging Face `BloomConfig`. Released configs disagree on names (`bloom-560m` writes
/// `hidden_size` and `n_head`, the 176B model `n_embed` and `num_attention_heads`), so
/// each size is read under every name and the first present wins.
#[derive(Deserialize)]
struct BloomConfig {
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: Option<usize>,
    n_embed: Option<usize>,
    n_layer: Option<usize>,
    num_hidden_layers: Option<usize>,
    n_head: Option<usize>,
    num_attention_heads: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_epsilon: f64,
    #[serde(default)]
    apply_residual_connection_post_layernorm: bool,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    #[serde(flatten)]
    tokens: TokenIds,
}

fn default_eps() -> f64 {
    1e-5
}

fn yes() -> bool {
    true
}

/// Runtime sizes, validated.
struct Dims {
    c: usize,
    layers: usize,
    heads: usize,
    vocab: usize,
    eps: f32,
}

impl BloomConfig {
    fn validate(&self, dir: &Path) -> Result<Dims> {
        let c = aliased_size(
            dir,
            ("hidden_size", self.hidden_size),
            ("n_embed", self.n_embed),
            1,
        )?;
        let heads = aliased_size(
            dir,
            ("n_head", self.n_head),
            ("num_attention_heads", self.num_attention_heads),
            1,
        )?;
        check_heads(dir, "n_head", heads, "hidden_size", c)?;
        let layers = aliased_size(
            dir,
            ("n_layer", self.n_layer),
            ("num_hidden_layers", self.num_hidden_layers),
            0,
        )?;
        check_positive(dir, &[("vocab_size", self.vocab_size)])?;
        let eps = epsilon(dir, "layer_norm_epsilon", self.layer_norm_epsilon)?;
        Ok(Dims {
            c,
            layers,
            heads,
            vocab: self.vocab_size,
            eps,
        })
    }
}

/// One of Q (k = 0), K (1), V (2) out of the fused `query_key_value` weight `[3C, C]`
/// and bias `[3C]`. Hugging Face's `_reshape` views the fused output as
/// `[.., H, 3, D]` and takes `[..., k, :]`, so output row `(h·3 + k)·D + d` belongs to
/// projection k, head h. Returns a Linear `[H·D, C]` whose rows are in the usual
/// head-major order.
fn split_fused(weight: &Tensor, bias: &Tensor, k: usize, heads: usize) -> Result<Linear> {
    let c = weight.shape()[1];
    let d = c / heads;
    let src_row = |r: usize| (r / d * 3 + k) * d + r % d;
    let w = Tensor::from_fn(&[c, c], |i| weight.data()[src_row(i / c) * c + i % c]);
    let b = Tensor::from_fn(&[c], |r| bias.data()[src_row(r)]);
    Linear::new(w, Some(b))
}

/// One block: `input_layernorm` → attention → (+ residual) → `post_attention_layernorm`
/// → MLP → (+ residual).
struct Block {
    input_layernorm: LayerNorm,
    attn: AttentionLayer,
    post_attention_layernorm: LayerNorm,
    mlp: FeedForward,
}

impl Block {
    fn load(w: &Weights, l: usize, d: &Dims) -> Result<Self> {
        let p = |s: &str| format!("h.{l}.{s}");
        let c = d.c;
        let fused = w.tensor(&p("self_attention.query_key_value.weight"), &[3 * c, c])?;
        let fused_bias = w.tensor(&p("self_attention.query_key_value.bias"), &[3 * c])?;
        let mha = MultiHeadAttention::new(
            split_fused(&fused, &fused_bias, 0, d.heads)?,
            split_fused(&fused, &fused_bias, 1, d.heads)?,
            split_fused(&fused, &fused_bias, 2, d.heads)?,
            w.linear(&p("self_attention.dense"), c, c, true)?,
            d.heads,
            d.heads,
        )?;
        Ok(Block {
            input_layernorm: w.layer_norm(&p("input_layernorm"), c, d.eps)?,
            attn: AttentionLayer { mha, rope: None },
            post_attention_layernorm: w.layer_norm(&p("post_attention_layernorm"), c, d.eps)?,
            // BLOOM's `bloom_gelu_forward` is x·½·(1 + tanh(0.79788456·x·(1 + 0.044715·x²))),
            // the tanh approximation.
            mlp: FeedForward::new(
                w.linear(&p("mlp.dense_h_to_4h"), 4 * c, c, true)?,
                None,
                w.linear(&p("mlp.dense_4h_to_h"), c, 4 * c, true)?,
                Activation::GeluTanh,
            )?,
        })
    }

    /// x: [B, T, C] → [B, T, C]; appends this layer's K/V to `kv`. With
    /// `post_ln_residual` the residual branches start from the normed input rather
    /// than from x (`apply_residual_connection_post_layernorm`).
    fn forward(
        &self,
        x: Tensor,
        opts: &AttendOpts,
        kv: &mut LayerKv,
        post_ln_residual: bool,
    ) -> Result<Tensor> {
        let ln = self.input_layernorm.forward(&x)?;
        let a = self.attn.self_attention(&ln, opts, Some(kv))?;
        let mut h = if post_ln_residual { ln } else { x };
        h.add_assign(&a);
        let ln = self.post_attention_layernorm.forward(&h)?;
        let m = self.mlp.forward(&ln)?;
        let mut out = if post_ln_residual { ln } else { h };
        out.add_assign(&m);
        Ok(out)
    }
}

/// A loaded BLOOM.
pub struct Bloom {
    info: ModelInfo,
    special: SpecialTokens,
    /// [V, C]
    word_embeddings: Embedding,
    word_embeddings_layernorm: LayerNorm,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    /// [V, C] for an untied head; `None` when tied to `word_embeddings`, whose table is
    /// then read in place rather than copied.
    lm_head: Option<Linear>,
    /// `[H]` ALiBi slope per head
    slopes: Vec<f32>,
    post_ln_residual: bool,
}

/// Loads a `BloomForCausalLM` (or base `BloomModel`) folder.
pub fn load(dir: &Path, ckpt: &Checkpoint) -> Result<Model> {
    let cfg: BloomConfig = read_config(dir)?;
    let d = cfg.validate(dir)?;
    // Checkpoints saved from the base model (the bigscience releases) lack the prefix.
    let w = Weights::detect(ckpt, &["transformer.", ""], "word_embeddings.weight");
    let word_embeddings = w.embedding("word_embeddings", d.vocab, d.c)?;
    let word_embeddings_layernorm = w.layer_norm("word_embeddings_layernorm", d.c, d.eps)?;
    let blocks = (0..d.layers)
        .map(|l| Block::load(&w, l, &d))
        .collect::<Result<Vec<_>>>()?;
    let ln_f = w.layer_norm("ln_f", d.c, d.eps)?;
    let lm_head = load_lm_head(ckpt, cfg.tie_word_embeddings, d.vocab, d.c)?;
    let info = ModelInfo {
        family: "bloom".into(),
        architecture: architecture(&cfg.architectures, "BloomForCausalLM"),
        layers: d.layers,
        decoder_layers: None,
        hidden: d.c,
        heads: d.heads,
        kv_heads: d.heads,
        head_dim: d.c / d.heads,
        ffn_dim: 4 * d.c,
        vocab: d.vocab,
        max_positions: None,
        position: "ALiBi".into(),
        norm: format!(
            "LayerNorm, pre-norm{}, embedding LayerNorm, eps {:e}",
            if cfg.apply_residual_connection_post_layernorm {
                " (residual after the norm)"
            } else {
                ""
            },
            d.eps
        ),
        ffn: ffn_label(Activation::GeluTanh, false),
    };
    let special = special_tokens(dir, cfg.tokens)?;
    Ok(Model::Causal(Box::new(Bloom {
        info,
        special,
        word_embeddings,
        word_embeddings_layernorm,
        blocks,
        ln_f,
        lm_head,
        slopes: alibi_slopes(d.heads),
        post_ln_residual: cfg.apply_residual_connection_post_layernorm,
    })))
}

impl CausalLm for Bloom {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// tokens: [B, T] → logits [B, T, V], appending to `cache`. No length limit: ALiBi
    /// has no table of positions to run out of.
    fn forward_cached(&self, tokens: &TokenBatch, cache: &mut KvCache) -> Result<Tensor> {
        tokens.check_vocab(self.info.vocab)?;
        cache.check_layers(self.blocks.len())?;
        let (b, t, c) = (tokens.batch, tokens.len, self.info.hidden);
        let step = cache.begin_step(&tokens.mask, t, None)?;
        let x = self.word_embeddings.forward(&tokens.ids)?;
        let mut x = self
            .word_embeddings_layernorm
            .forward(&x)?
            .reshape(&[b, t, c])?;
        // Hugging Face adds slope_h · q_j to the score of key j, where q_j is j's position
        // among its row's real tokens (cumsum(mask) − 1). `Bias::Alibi` adds
        // slope_h · (j − i) instead, i and j being cache slots. For a query at slot i the
        // two differ by slope_h · (i − (padding slots before key j)), and softmax ignores
        // a term that is the same for every key of the row. Padding before j is the same
        // for all real keys whenever no padding lies between two real tokens: with left
        // padding every real key has all of the row's padding before it, with right
        // padding none. (Padding keys themselves are masked out, so their bias is moot.)
        // Only a row with a hole in the middle (generation marks finished rows as padding
        // and discards their further outputs) would see different scores.
        let opts = AttendOpts {
            positions: &step.positions,
            key_padding: Some(&step.key_padding),
            causal: true,
            bias: Some(Bias::Alibi {
                slopes: &self.slopes,
            }),
            ..Default::default()
        };
        for (block, kv) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = block.forward(x, &opts, kv, self.post_ln_residual)?;
        }
        let h = self.ln_f.forward(&x)?;
        lm_logits(&h, self.lm_head.as_ref(), &self.word_embeddings.table, 1.0)
    }
}
