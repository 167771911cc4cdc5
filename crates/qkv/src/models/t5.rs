//! T5 (`T5ForConditionalGeneration`, Raffel et al. 2020): an encoder-decoder whose only
//! notion of order is a learned bias on the attention scores per relative-distance
//! bucket and head.
//!
//! - One embedding table (`shared`) for encoder and decoder, not scaled, no absolute
//!   positions.
//! - Pre-norm blocks, `x += sublayer(norm(x))`, with T5's LayerNorm: RMSNorm without
//!   mean subtraction or bias. Each stack ends with `final_layer_norm`.
//! - Attention projections without biases, head width `d_kv` (H·d_kv may differ from
//!   d_model), and *unscaled* scores Q·Kᵀ: the 1/√D is folded into the initialisation.
//! - The relative position bias `[num_buckets, H]` lives in the first layer of each
//!   stack and is shared by all its layers: bidirectional buckets in the encoder,
//!   backward-only ones in the decoder's causal self-attention, none in cross-attention.
//! - FFN `wo(act(wi x))` (`relu`) or gated `wo(act(wi_0 x) ⊙ wi_1 x)` (`gated-gelu`,
//!   T5 v1.1 and Flan-T5).
//! - Tied LM head: logits = (h · d_model^−½) · sharedᵀ; an untied `lm_head` is applied
//!   as is.

use std::path::Path;

use serde::Deserialize;

use super::{Encoded, KvCache, Model, ModelInfo, Seq2SeqLm, SpecialTokens, TokenBatch, Weights};
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::{Error, Result};
use crate::io::{bad_field, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, Linear, RmsNorm};
use crate::ops::{gemm, Activation, MatMut, MatRef, Par};
use crate::position::RelativeBias;
use crate::tensor::Tensor;
use crate::{Bias, MultiHeadAttention};

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
    #[serde(default)]
    decoder_start_token_id: Option<usize>,
}

/// Hugging Face `T5Config`, with its defaults for absent fields (early checkpoints such
/// as `t5-small` predate `relative_attention_max_distance`) and the `attribute_map`
/// names as aliases.
#[derive(Deserialize)]
struct T5Config {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default = "default_vocab")]
    vocab_size: usize,
    #[serde(default = "default_d_model", alias = "hidden_size")]
    d_model: usize,
    #[serde(default = "default_d_kv", alias = "head_dim")]
    d_kv: usize,
    #[serde(default = "default_d_ff")]
    d_ff: usize,
    #[serde(default = "default_layers", alias = "num_hidden_layers")]
    num_layers: usize,
    /// Defaults to `num_layers`.
    #[serde(default)]
    num_decoder_layers: Option<usize>,
    #[serde(default = "default_heads", alias = "num_attention_heads")]
    num_heads: usize,
    #[serde(default = "default_buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default = "default_max_distance")]
    relative_attention_max_distance: usize,
    #[serde(default = "default_eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "default_ffn")]
    feed_forward_proj: String,
    /// Written by transformers ≥ 4.23; overrides what `feed_forward_proj` implies, as
    /// `PretrainedConfig` sets saved attributes after `T5Config.__init__` derives them.
    #[serde(default)]
    dense_act_fn: Option<String>,
    #[serde(default)]
    is_gated_act: Option<bool>,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    #[serde(flatten)]
    ids: TokenIds,
}

fn default_vocab() -> usize {
    32128
}
fn default_d_model() -> usize {
    512
}
fn default_d_kv() -> usize {
    64
}
fn default_d_ff() -> usize {
    2048
}
fn default_layers() -> usize {
    6
}
fn default_heads() -> usize {
    8
}
fn default_buckets() -> usize {
    32
}
fn default_max_distance() -> usize {
    128
}
fn default_eps() -> f64 {
    1e-6
}
fn default_ffn() -> String {
    "relu".into()
}
fn yes() -> bool {
    true
}

/// Special tokens from config.json, each filled from generation_config.json (when the
/// folder has one) where config.json leaves it unset. Without a decoder start token,
/// generation starts from BOS, as Hugging Face's `generate` does.
fn special_tokens(dir: &Path, config: TokenIds) -> Result<SpecialTokens> {
    let path = dir.join("generation_config.json");
    let generation: TokenIds = if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.display().to_string(),
            field: e.to_string().split('`').nth(1).unwrap_or("(json)").into(),
            reason: e.to_string(),
        })?
    } else {
        TokenIds::default()
    };
    let bos = config.bos_token_id.or(generation.bos_token_id);
    Ok(SpecialTokens {
        eos: config
            .eos_token_id
            .or(generation.eos_token_id)
            .map_or_else(Vec::new, Ids::into_vec),
        pad: config.pad_token_id.or(generation.pad_token_id),
        bos,
        decoder_start: config
            .decoder_start_token_id
            .or(generation.decoder_start_token_id)
            .or(bos),
    })
}

/// Sizes checked against each other.
struct Dims {
    c: usize,
    heads: usize,
    d_kv: usize,
    ffn: usize,
    vocab: usize,
    eps: f32,
    activation: Activation,
    gated: bool,
}

impl T5Config {
    fn validate(&self, dir: &Path) -> Result<Dims> {
        for (field, v) in [
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_heads", self.num_heads),
            ("vocab_size", self.vocab_size),
            (
                "relative_attention_max_distance",
                self.relative_attention_max_distance,
            ),
        ] {
            if v == 0 {
                return Err(bad_field(dir, field, "must be positive"));
            }
        }
        if self.relative_attention_num_buckets < 2 {
            return Err(bad_field(
                dir,
                "relative_attention_num_buckets",
                "need at least 2 buckets",
            ));
        }
        let eps = self.layer_norm_epsilon as f32;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(bad_field(
                dir,
                "layer_norm_epsilon",
                format!("must be finite and ≥ 0, got {}", self.layer_norm_epsilon),
            ));
        }
        // T5Config: "gated-<act>" or "<act>"; "gated-gelu" means the tanh GELU.
        let parts: Vec<&str> = self.feed_forward_proj.split('-').collect();
        let derived_gated = match parts.as_slice() {
            [_] => false,
            ["gated", _] => true,
            _ => {
                return Err(bad_field(
                    dir,
                    "feed_forward_proj",
                    format!(
                        "`{}` is not `<act>` or `gated-<act>`",
                        self.feed_forward_proj
                    ),
                ))
            }
        };
        let derived_act = if self.feed_forward_proj == "gated-gelu" {
            "gelu_new"
        } else {
            parts[parts.len() - 1]
        };
        let (field, act) = match &self.dense_act_fn {
            Some(a) => ("dense_act_fn", a.as_str()),
            None => ("feed_forward_proj", derived_act),
        };
        let activation =
            Activation::from_hf_name(act).map_err(|e| bad_field(dir, field, e.to_string()))?;
        Ok(Dims {
            c: self.d_model,
            heads: self.num_heads,
            d_kv: self.d_kv,
            ffn: self.d_ff,
            vocab: self.vocab_size,
            eps,
            activation,
            gated: self.is_gated_act.unwrap_or(derived_gated),
        })
    }
}

/// q/k/v: [H·D, C] and o: [C, H·D], no biases.
fn attention(w: &Weights, name: &str, d: &Dims) -> Result<AttentionLayer> {
    let inner = d.heads * d.d_kv;
    let proj = |p: &str, out, inp| w.linear(&format!("{name}.{p}"), out, inp, false);
    Ok(AttentionLayer {
        mha: MultiHeadAttention::new(
            proj("q", inner, d.c)?,
            proj("k", inner, d.c)?,
            proj("v", inner, d.c)?,
            proj("o", d.c, inner)?,
            d.heads,
            d.heads,
        )?,
        rope: None,
    })
}

/// `DenseReluDense`: wo(act(wi x)), or wo(act(wi_0 x) ⊙ wi_1 x) when gated.
fn feed_forward(w: &Weights, name: &str, d: &Dims) -> Result<FeedForward> {
    let lin = |p: &str, out, inp| w.linear(&format!("{name}.DenseReluDense.{p}"), out, inp, false);
    let wo = lin("wo", d.c, d.ffn)?;
    if d.gated {
        FeedForward::new(
            lin("wi_0", d.ffn, d.c)?,
            Some(lin("wi_1", d.ffn, d.c)?),
            wo,
            d.activation,
        )
    } else {
        FeedForward::new(lin("wi", d.ffn, d.c)?, None, wo, d.activation)
    }
}

/// x += y: the residual connection.
fn add_into(x: &mut Tensor, y: &Tensor) {
    for (a, b) in x.data_mut().iter_mut().zip(y.data()) {
        *a += b;
    }
}

struct EncoderBlock {
    self_attn_norm: RmsNorm,
    self_attn: AttentionLayer,
    ffn_norm: RmsNorm,
    ffn: FeedForward,
}

struct DecoderBlock {
    self_attn_norm: RmsNorm,
    self_attn: AttentionLayer,
    cross_attn_norm: RmsNorm,
    cross_attn: AttentionLayer,
    ffn_norm: RmsNorm,
    ffn: FeedForward,
}

/// `{name}.layer_norm.weight` [C].
fn norm(w: &Weights, name: &str, d: &Dims) -> Result<RmsNorm> {
    w.rms_norm(&format!("{name}.layer_norm"), d.c, d.eps)
}

impl EncoderBlock {
    fn load(w: &Weights, l: usize, d: &Dims) -> Result<Self> {
        let p = format!("encoder.block.{l}.layer");
        Ok(EncoderBlock {
            self_attn_norm: norm(w, &format!("{p}.0"), d)?,
            self_attn: attention(w, &format!("{p}.0.SelfAttention"), d)?,
            ffn_norm: norm(w, &format!("{p}.1"), d)?,
            ffn: feed_forward(w, &format!("{p}.1"), d)?,
        })
    }

    /// x: [B, S, C] updated in place.
    fn forward(&self, x: &mut Tensor, opts: &AttendOpts) -> Result<()> {
        let h = self
            .self_attn
            .self_attention(&self.self_attn_norm.forward(x)?, opts, None)?;
        add_into(x, &h);
        let h = self.ffn.forward(&self.ffn_norm.forward(x)?)?;
        add_into(x, &h);
        Ok(())
    }
}

impl DecoderBlock {
    fn load(w: &Weights, l: usize, d: &Dims) -> Result<Self> {
        let p = format!("decoder.block.{l}.layer");
        Ok(DecoderBlock {
            self_attn_norm: norm(w, &format!("{p}.0"), d)?,
            self_attn: attention(w, &format!("{p}.0.SelfAttention"), d)?,
            cross_attn_norm: norm(w, &format!("{p}.1"), d)?,
            cross_attn: attention(w, &format!("{p}.1.EncDecAttention"), d)?,
            ffn_norm: norm(w, &format!("{p}.2"), d)?,
            ffn: feed_forward(w, &format!("{p}.2"), d)?,
        })
    }
}

pub struct T5 {
    info: ModelInfo,
    special: SpecialTokens,
    /// [V, C] token embeddings of both stacks.
    shared: Embedding,
    encoder: Vec<EncoderBlock>,
    encoder_bias: RelativeBias,
    encoder_norm: RmsNorm,
    decoder: Vec<DecoderBlock>,
    decoder_bias: RelativeBias,
    decoder_norm: RmsNorm,
    /// `None`: tied to `shared`, with the d_model^−½ rescale.
    lm_head: Option<Linear>,
}

fn describe(act: Activation, gated: bool) -> String {
    let name = match act {
        Activation::Relu => "ReLU",
        Activation::Gelu => "GELU (erf)",
        Activation::GeluTanh => "GELU (tanh)",
        Activation::Silu => "SiLU",
    };
    if gated {
        format!("gated {name}")
    } else {
        name.into()
    }
}

/// Loads a `T5ForConditionalGeneration` folder.
pub fn load(dir: &Path, ckpt: &Checkpoint) -> Result<Model> {
    let cfg: T5Config = read_config(dir)?;
    let d = cfg.validate(dir)?;
    let w = Weights::detect(ckpt, &[""], "shared.weight");
    let dec_layers = cfg.num_decoder_layers.unwrap_or(cfg.num_layers);
    let buckets = cfg.relative_attention_num_buckets;
    let max_distance = cfg.relative_attention_max_distance;
    let bias = |stack: &str, bidirectional| -> Result<RelativeBias> {
        let name = format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
        RelativeBias::new(
            w.tensor(&name, &[buckets, d.heads])?,
            bidirectional,
            max_distance,
        )
    };
    let encoder = (0..cfg.num_layers)
        .map(|l| EncoderBlock::load(&w, l, &d))
        .collect::<Result<Vec<_>>>()?;
    let decoder = (0..dec_layers)
        .map(|l| DecoderBlock::load(&w, l, &d))
        .collect::<Result<Vec<_>>>()?;
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(w.linear("lm_head", d.vocab, d.c, false)?)
    };
    let info = ModelInfo {
        family: "t5".into(),
        architecture: cfg
            .architectures
            .first()
            .cloned()
            .unwrap_or_else(|| "T5ForConditionalGeneration".into()),
        layers: cfg.num_layers,
        decoder_layers: Some(dec_layers),
        hidden: d.c,
        heads: d.heads,
        kv_heads: d.heads,
        head_dim: d.d_kv,
        ffn_dim: d.ffn,
        vocab: d.vocab,
        max_positions: None,
        position: format!(
            "relative bias ({buckets} buckets, max distance {max_distance}, unscaled scores)"
        ),
        norm: format!("RMSNorm (T5LayerNorm), pre-norm, eps {:e}", d.eps),
        ffn: describe(d.activation, d.gated),
    };
    Ok(Model::Seq2Seq(Box::new(T5 {
        info,
        special: special_tokens(dir, cfg.ids)?,
        shared: w.embedding("shared", d.vocab, d.c)?,
        encoder_bias: bias("encoder", true)?,
        encoder_norm: w.rms_norm("encoder.final_layer_norm", d.c, d.eps)?,
        encoder,
        decoder_bias: bias("decoder", false)?,
        decoder_norm: w.rms_norm("decoder.final_layer_norm", d.c, d.eps)?,
        decoder,
        lm_head,
    })))
}

/// T5's scores are Q·Kᵀ without the 1/√D.
const UNSCALED: Option<f32> = Some(1.0);

impl T5 {
    /// tokens: [B, T] → [B, T, C].
    fn embed(&self, tokens: &TokenBatch) -> Result<Tensor> {
        self.shared
            .forward(&tokens.ids)?
            .reshape(&[tokens.batch, tokens.len, self.info.hidden])
    }

    /// h: [B, T, C] → logits [B, T, V].
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        if let Some(head) = &self.lm_head {
            return head.forward(h);
        }
        let (c, v) = (self.info.hidden, self.info.vocab);
        let rows = h.numel() / c;
        let mut out = Tensor::zeros(&[h.shape()[0], h.shape()[1], v]);
        // (h · C^−½) · sharedᵀ, the rescale as gemm's alpha and the [V, C] table read
        // transposed in place.
        gemm(
            MatMut::row_major(out.data_mut(), rows, v),
            MatRef::row_major(h.data(), rows, c),
            MatRef::row_major(self.shared.table.data(), v, c).t(),
            (c as f32).powf(-0.5),
            false,
            Par::Auto,
        );
        Ok(out)
    }
}

impl Seq2SeqLm for T5 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// src: [B, S] → encoder states [B, S, C] and each decoder layer's cross K/V.
    fn encode(&self, src: &TokenBatch) -> Result<Encoded> {
        src.check_vocab(self.info.vocab)?;
        let mut x = self.embed(src)?;
        let s = src.len;
        // [1, H, S, S], computed once for the stack.
        let bias = self.encoder_bias.compute(s, s, 0);
        let opts = AttendOpts {
            key_padding: Some(&src.mask),
            bias: Some(Bias::Dense(bias.as_broadcast()?)),
            scale: UNSCALED,
            ..Default::default()
        };
        for block in &self.encoder {
            block.forward(&mut x, &opts)?;
        }
        let x = self.encoder_norm.forward(&x)?;
        let cross = self
            .decoder
            .iter()
            .map(|l| l.cross_attn.cross_kv(&x))
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoded {
            hidden: x,
            key_padding: src.mask.clone(),
            cross,
        })
    }

    fn new_cache(&self, batch: usize) -> KvCache {
        let (h, d) = (self.info.heads, self.info.head_dim);
        KvCache::new(self.decoder.len(), batch, h, d, d)
    }

    /// tgt: [B, T] after the tokens in `cache` → logits [B, T, V].
    fn decode_cached(
        &self,
        tgt: &TokenBatch,
        enc: &Encoded,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        tgt.check_vocab(self.info.vocab)?;
        check_state(enc, cache, tgt.batch, self.decoder.len())?;
        let step = cache.begin_step(&tgt.mask, tgt.len)?;
        let t = tgt.len;
        // Queries sit at past..past + T, as Hugging Face's cache_position places them.
        let bias = self.decoder_bias.compute(t, step.past + t, step.past);
        let opts = AttendOpts {
            positions: &step.positions,
            key_padding: Some(&step.key_padding),
            causal: true,
            bias: Some(Bias::Dense(bias.as_broadcast()?)),
            scale: UNSCALED,
            ..Default::default()
        };
        let mut x = self.embed(tgt)?;
        for ((block, kv), lc) in self.decoder.iter().zip(&enc.cross).zip(&mut cache.layers) {
            let h = block.self_attn.self_attention(
                &block.self_attn_norm.forward(&x)?,
                &opts,
                Some(lc),
            )?;
            add_into(&mut x, &h);
            let h = block.cross_attn.cross_attention(
                &block.cross_attn_norm.forward(&x)?,
                kv,
                Some(&enc.key_padding),
                UNSCALED,
            )?;
            add_into(&mut x, &h);
            let h = block.ffn.forward(&block.ffn_norm.forward(&x)?)?;
            add_into(&mut x, &h);
        }
        self.logits(&self.decoder_norm.forward(&x)?)
    }
}

/// The encoder output and the cache must belong to this model and this batch.
fn check_state(enc: &Encoded, cache: &KvCache, batch: usize, layers: usize) -> Result<()> {
    if enc.hidden.shape().first() != Some(&batch) || enc.cross.len() != layers {
        return Err(Error::invalid(
            "encoder output",
            format!(
                "holds {:?} states and {} cross K/V; the decoder needs batch {batch} and {layers} layers",
                enc.hidden.shape(),
                enc.cross.len()
            ),
        ));
    }
    if cache.layers.len() != layers {
        return Err(Error::invalid(
            "kv cache",
            format!("has {} layers, the decoder {layers}", cache.layers.len()),
        ));
    }
    Ok(())
}
