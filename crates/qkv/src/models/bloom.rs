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

use super::{CausalLm, KvCache, LayerKv, Model, ModelInfo, SpecialTokens, TokenBatch, Weights};
use crate::attention::Bias;
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::{Error, Result};
use crate::io::{bad_field, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, LayerNorm, Linear};
use crate::ops::{gemm, Activation, MatMut, MatRef, Par};
use crate::position::alibi_slopes;
use crate::tensor::Tensor;
use crate::MultiHeadAttention;

/// `eos_token_id` is one id or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Ids {
    One(usize),
    Many(Vec<usize>),
}

impl Ids {
    fn into_vec(self) -> Vec<usize> {
        match self {
            Ids::One(id) => vec![id],
            Ids::Many(ids) => ids,
        }
    }
}

/// The special-token fields shared by config.json and generation_config.json.
#[derive(Deserialize, Default)]
struct TokenIds {
    #[serde(default)]
    eos_token_id: Option<Ids>,
    #[serde(default)]
    bos_token_id: Option<usize>,
    #[serde(default)]
    pad_token_id: Option<usize>,
}

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
        let c = match self.hidden_size.or(self.n_embed) {
            Some(0) => return Err(bad_field(dir, "hidden_size", "must be at least 1")),
            Some(c) => c,
            None => {
                return Err(bad_field(
                    dir,
                    "hidden_size",
                    "missing (nor is `n_embed` set)",
                ))
            }
        };
        let heads = match self.n_head.or(self.num_attention_heads) {
            Some(0) => return Err(bad_field(dir, "n_head", "must be at least 1")),
            Some(h) => h,
            None => {
                return Err(bad_field(
                    dir,
                    "n_head",
                    "missing (nor is `num_attention_heads` set)",
                ))
            }
        };
        if c % heads != 0 {
            return Err(bad_field(
                dir,
                "n_head",
                format!("{heads} heads do not divide hidden_size = {c}"),
            ));
        }
        let layers = self
            .n_layer
            .or(self.num_hidden_layers)
            .ok_or_else(|| bad_field(dir, "n_layer", "missing (nor is `num_hidden_layers` set)"))?;
        if self.vocab_size == 0 {
            return Err(bad_field(dir, "vocab_size", "must be at least 1"));
        }
        let eps = self.layer_norm_epsilon as f32;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(bad_field(
                dir,
                "layer_norm_epsilon",
                format!("must be finite and ≥ 0, got {}", self.layer_norm_epsilon),
            ));
        }
        Ok(Dims {
            c,
            layers,
            heads,
            vocab: self.vocab_size,
            eps,
        })
    }
}

/// `eos`, `bos` and `pad` from config.json, each filled from generation_config.json
/// (when the folder has one) where config.json leaves it unset.
fn special_tokens(dir: &Path, config: TokenIds) -> Result<SpecialTokens> {
    let path = dir.join("generation_config.json");
    let generation: TokenIds = if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.display().to_string(),
            field: "eos_token_id / bos_token_id / pad_token_id".into(),
            reason: e.to_string(),
        })?
    } else {
        TokenIds::default()
    };
    Ok(SpecialTokens {
        eos: config
            .eos_token_id
            .or(generation.eos_token_id)
            .map_or_else(Vec::new, Ids::into_vec),
        bos: config.bos_token_id.or(generation.bos_token_id),
        pad: config.pad_token_id.or(generation.pad_token_id),
        decoder_start: None,
    })
}

/// One of Q (k = 0), K (1), V (2) out of the fused `query_key_value` weight [3C, C] and
/// bias [3C]. Hugging Face's `_reshape` views the fused output as [.., H, 3, D] and takes
/// `[..., k, :]`, so output row `(h·3 + k)·D + d` belongs to projection k, head h.
/// Returns a Linear [H·D, C] whose rows are in the usual head-major order.
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
        add_into(&mut h, &a);
        let ln = self.post_attention_layernorm.forward(&h)?;
        let m = self.mlp.forward(&ln)?;
        let mut out = if post_ln_residual { ln } else { h };
        add_into(&mut out, &m);
        Ok(out)
    }
}

/// x += y (a residual connection; both have the same shape by construction).
fn add_into(x: &mut Tensor, y: &Tensor) {
    for (a, b) in x.data_mut().iter_mut().zip(y.data()) {
        *a += b;
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
    /// [H] ALiBi slope per head
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
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(Linear::new(
            ckpt.tensor_shaped("lm_head.weight", &[d.vocab, d.c])?,
            None,
        )?)
    };
    let info = ModelInfo {
        family: "bloom".into(),
        architecture: cfg
            .architectures
            .first()
            .cloned()
            .unwrap_or_else(|| "BloomForCausalLM".into()),
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
        ffn: "GELU (tanh approximation)".into(),
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

impl Bloom {
    /// h: [B, T, C] → logits [B, T, V].
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        if let Some(head) = &self.lm_head {
            return head.forward(h);
        }
        let table = &self.word_embeddings.table;
        let (v, c) = (table.shape()[0], table.shape()[1]);
        let rows = h.numel() / c;
        let mut shape = h.shape().to_vec();
        *shape.last_mut().expect("[B, T, C]") = v;
        let mut out = Tensor::zeros(&shape);
        // logits = h · tableᵀ, reading the [V, C] table transposed in place.
        gemm(
            MatMut::row_major(out.data_mut(), rows, v),
            MatRef::row_major(h.data(), rows, c),
            MatRef::row_major(table.data(), v, c).t(),
            1.0,
            false,
            Par::Auto,
        );
        Ok(out)
    }
}

impl CausalLm for Bloom {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    fn new_cache(&self, batch: usize) -> KvCache {
        let hd = self.info.head_dim;
        KvCache::new(self.blocks.len(), batch, self.info.heads, hd, hd)
    }

    /// tokens: [B, T] → logits [B, T, V], appending to `cache`. No length limit: ALiBi
    /// has no table of positions to run out of.
    fn forward_cached(&self, tokens: &TokenBatch, cache: &mut KvCache) -> Result<Tensor> {
        tokens.check_vocab(self.info.vocab)?;
        if cache.layers.len() != self.blocks.len() {
            return Err(Error::invalid(
                "kv cache",
                format!(
                    "has {} layers, the model {}",
                    cache.layers.len(),
                    self.blocks.len()
                ),
            ));
        }
        let (b, t, c) = (tokens.batch, tokens.len, self.info.hidden);
        let step = cache.begin_step(&tokens.mask, t)?;
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
        self.logits(&self.ln_f.forward(&x)?)
    }
}
