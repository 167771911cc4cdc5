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

use super::head::{lm_logits, load_lm_head};
use super::special::{special_tokens, TokenIds};
use super::{
    architecture, ffn_label, Encoded, KvCache, Model, ModelInfo, Seq2SeqLm, SpecialTokens,
    TokenBatch, Weights,
};
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::Result;
use crate::io::{bad_field, check_positive, epsilon, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, Linear, RmsNorm};
use crate::ops::Activation;
use crate::position::RelativeBias;
use crate::tensor::Tensor;
use crate::{Bias, MultiHeadAttention};

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
        check_positive(
            dir,
            &[
                ("d_model", self.d_model),
                ("d_kv", self.d_kv),
                ("d_ff", self.d_ff),
                ("num_heads", self.num_heads),
                ("vocab_size", self.vocab_size),
                (
                    "relative_attention_max_distance",
                    self.relative_attention_max_distance,
                ),
            ],
        )?;
        if self.relative_attention_num_buckets < 2 {
            return Err(bad_field(
                dir,
                "relative_attention_num_buckets",
                "need at least 2 buckets",
            ));
        }
        let eps = epsilon(dir, "layer_norm_epsilon", self.layer_norm_epsilon)?;
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

/// `{name}.layer_norm.weight` `[C]`.
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
        x.add_assign(&h);
        let h = self.ffn.forward(&self.ffn_norm.forward(x)?)?;
        x.add_assign(&h);
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
    let lm_head = load_lm_head(ckpt, cfg.tie_word_embeddings, d.vocab, d.c)?;
    let mut special = special_tokens(dir, cfg.ids)?;
    // Without a decoder start token, generation starts from BOS, as Hugging Face's
    // `generate` does.
    special.decoder_start = special.decoder_start.or(special.bos);
    let info = ModelInfo {
        family: "t5".into(),
        architecture: architecture(&cfg.architectures, "T5ForConditionalGeneration"),
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
        ffn: ffn_label(d.activation, d.gated),
    };
    Ok(Model::Seq2Seq(Box::new(T5 {
        info,
        special,
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

    /// h: `[B, T, C]` → logits `[B, T, V]`; tied: (h · C^−½) · sharedᵀ.
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let rescale = (self.info.hidden as f32).powf(-0.5);
        lm_logits(h, self.lm_head.as_ref(), &self.shared.table, rescale)
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
        Encoded::from_states(x, &src.mask, self.decoder.iter().map(|l| &l.cross_attn))
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
        enc.check(tgt.batch, self.decoder.len())?;
        cache.check_layers(self.decoder.len())?;
        let step = cache.begin_step(&tgt.mask, tgt.len, None)?;
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
            x.add_assign(&h);
            let h = block.cross_attn.cross_attention(
                &block.cross_attn_norm.forward(&x)?,
                kv,
                Some(&enc.key_padding),
                UNSCALED,
            )?;
            x.add_assign(&h);
            let h = block.ffn.forward(&block.ffn_norm.forward(&x)?)?;
            x.add_assign(&h);
        }
        self.logits(&self.decoder_norm.forward(&x)?)
    }
}
