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

use super::{CausalLm, KvCache, LayerKv, Model, ModelInfo, SpecialTokens, TokenBatch, Weights};
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::{Error, Result};
use crate::io::{bad_field, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, LayerNorm, Linear};
use crate::ops::{gemm, Activation, MatMut, MatRef, Par};
use crate::position::LearnedPositions;
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

/// Hugging Face `GPT2Config`. Sizes are required; the alternative names are those of
/// `attribute_map` (`hidden_size` → `n_embd`, …), which some tools write instead.
#[derive(Deserialize)]
struct Gpt2Config {
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
    activation_function: String,
    /// Divide scores by √D (always true in released checkpoints).
    #[serde(default = "yes")]
    scale_attn_weights: bool,
    /// Also divide layer l's scores by l + 1 (a training-stability option, off in
    /// OpenAI's checkpoints).
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
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

/// A required size under its GPT-2 name or its alias; zero is rejected.
fn size(dir: &Path, name: &str, alias: &str, v: Option<usize>, w: Option<usize>) -> Result<usize> {
    match v.or(w) {
        Some(0) => Err(bad_field(dir, name, "must be at least 1")),
        Some(n) => Ok(n),
        None => Err(bad_field(
            dir,
            name,
            format!("missing (nor is `{alias}` set)"),
        )),
    }
}

/// Runtime sizes, validated.
struct Dims {
    c: usize,
    layers: usize,
    heads: usize,
    positions: usize,
    vocab: usize,
    ffn: usize,
    eps: f32,
    act: Activation,
}

impl Gpt2Config {
    fn validate(&self, dir: &Path) -> Result<Dims> {
        let c = size(dir, "n_embd", "hidden_size", self.n_embd, self.hidden_size)?;
        let heads = size(
            dir,
            "n_head",
            "num_attention_heads",
            self.n_head,
            self.num_attention_heads,
        )?;
        if c % heads != 0 {
            return Err(bad_field(
                dir,
                "n_head",
                format!("{heads} heads do not divide n_embd = {c}"),
            ));
        }
        let layers = self
            .n_layer
            .or(self.num_hidden_layers)
            .ok_or_else(|| bad_field(dir, "n_layer", "missing (nor is `num_hidden_layers` set)"))?;
        let positions = size(
            dir,
            "n_positions",
            "max_position_embeddings",
            self.n_positions,
            self.max_position_embeddings,
        )?;
        if self.vocab_size == 0 {
            return Err(bad_field(dir, "vocab_size", "must be at least 1"));
        }
        let ffn = self.n_inner.unwrap_or(4 * c);
        if ffn == 0 {
            return Err(bad_field(dir, "n_inner", "must be at least 1"));
        }
        let eps = self.layer_norm_epsilon as f32;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(bad_field(
                dir,
                "layer_norm_epsilon",
                format!("must be finite and ≥ 0, got {}", self.layer_norm_epsilon),
            ));
        }
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

/// Conv1D `{name}.weight` [inp, out] and `{name}.bias` [out] as a Linear [out, inp].
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
        add_into(&mut x, &a);
        let m = self.mlp.forward(&self.ln_2.forward(&x)?)?;
        add_into(&mut x, &m);
        Ok(x)
    }
}

/// x += y (a residual connection; both have the same shape by construction).
fn add_into(x: &mut Tensor, y: &Tensor) {
    for (a, b) in x.data_mut().iter_mut().zip(y.data()) {
        *a += b;
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

fn describe(act: Activation) -> &'static str {
    match act {
        Activation::Relu => "ReLU",
        Activation::Gelu => "GELU (erf)",
        Activation::GeluTanh => "GELU (tanh approximation)",
        Activation::Silu => "SiLU",
    }
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
    // The head sits outside the `transformer.` prefix.
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(Linear::new(
            ckpt.tensor_shaped("lm_head.weight", &[d.vocab, d.c])?,
            None,
        )?)
    };
    let info = ModelInfo {
        family: "gpt2".into(),
        architecture: cfg
            .architectures
            .first()
            .cloned()
            .unwrap_or_else(|| "GPT2LMHeadModel".into()),
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
        ffn: describe(d.act).into(),
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

impl Gpt2 {
    /// Position ids for `wpe`: real tokens must fit the table ("sequence longer than
    /// the model's positions"); padding may sit one past the last real token, so it
    /// is clamped (its output is never used).
    fn checked_positions(&self, positions: &[usize], mask: &[bool]) -> Result<Vec<usize>> {
        let max = self.wpe.max_positions();
        positions
            .iter()
            .zip(mask)
            .map(|(&p, &real)| match (real, p < max) {
                (_, true) => Ok(p),
                (false, false) => Ok(max - 1),
                (true, false) => Err(Error::OutOfRange {
                    what: "position (sequence longer than the model's positions, n_positions)"
                        .into(),
                    index: p,
                    size: max,
                }),
            })
            .collect()
    }

    /// h: [B, T, C] → logits [B, T, V].
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        if let Some(head) = &self.lm_head {
            return head.forward(h);
        }
        let (c, v) = (self.wte.dim(), self.wte.vocab_size());
        let rows = h.numel() / c;
        let mut shape = h.shape().to_vec();
        *shape.last_mut().expect("[B, T, C]") = v;
        let mut out = Tensor::zeros(&shape);
        // logits = h · wteᵀ, reading the [V, C] table transposed in place.
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
}

impl CausalLm for Gpt2 {
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

    /// tokens: [B, T] → logits [B, T, V], appending to `cache`.
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
        let positions = self.checked_positions(&step.positions, &tokens.mask)?;
        let mut x = self.wte.forward(&tokens.ids)?;
        self.wpe.add_to(&mut x, &positions)?;
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
        self.logits(&self.ln_f.forward(&x)?)
    }
}
