//! Marian (`MarianMTModel`, the OPUS-MT translation models): the original encoder-decoder
//! Transformer of "Attention Is All You Need", nearly as the paper draws it.
//!
//! - Token embeddings shared by encoder, decoder and LM head (unless the config says
//!   otherwise), multiplied by √d_model when `scale_embedding`, plus fixed sinusoidal
//!   positions in Marian's split layout (all sines, then all cosines), with no offset.
//! - Post-norm layers, `x = LN(x + sublayer(x))`: the encoder has self-attention and a
//!   feed-forward block; the decoder has causal self-attention, cross-attention over the
//!   encoder output, and a feed-forward block. No final stack norm, no embedding norm.
//! - Q/K/V/O projections with biases, scores scaled by 1/√D (Hugging Face multiplies q by
//!   the scale instead, the same up to rounding).
//! - Logits = h · Eᵀ + `final_logits_bias`, a buffer saved with the checkpoint (zeros
//!   when absent, as Hugging Face initialises it).
//!
//! Positions count real tokens (`cumsum(mask) − 1`). Hugging Face numbers the source
//! 0..S whatever the mask; for right padding, the tokenizer's side, the two agree, and
//! for left padding ours equals running each row alone.

use std::path::Path;

use serde::Deserialize;

use super::batch::limit_positions;
use super::head::{lm_logits, load_lm_head};
use super::special::{special_tokens, Ids, TokenIds};
use super::{
    architecture, ffn_label, Encoded, KvCache, Model, ModelInfo, Seq2SeqLm, SpecialTokens,
    TokenBatch, Weights,
};
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::Result;
use crate::io::{bad_field, check_heads, check_positive, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, LayerNorm, Linear};
use crate::ops::Activation;
use crate::position::{sinusoidal_table, SinusoidalLayout};
use crate::tensor::Tensor;
use crate::MultiHeadAttention;

/// Hugging Face `MarianConfig`, with its defaults for absent fields and the
/// `attribute_map` names (`hidden_size`, `num_attention_heads`) as aliases.
#[derive(Deserialize)]
struct MarianConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default = "default_vocab")]
    vocab_size: usize,
    /// Target vocabulary when it differs from the source one (`None`: the same).
    #[serde(default)]
    decoder_vocab_size: Option<usize>,
    #[serde(default = "default_d_model", alias = "hidden_size")]
    d_model: usize,
    #[serde(default = "default_layers")]
    encoder_layers: usize,
    #[serde(default = "default_layers")]
    decoder_layers: usize,
    #[serde(default = "default_heads", alias = "num_attention_heads")]
    encoder_attention_heads: usize,
    #[serde(default = "default_heads")]
    decoder_attention_heads: usize,
    #[serde(default = "default_ffn")]
    encoder_ffn_dim: usize,
    #[serde(default = "default_ffn")]
    decoder_ffn_dim: usize,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_activation")]
    activation_function: String,
    #[serde(default)]
    scale_embedding: bool,
    #[serde(default = "yes")]
    share_encoder_decoder_embeddings: bool,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    /// The special ids default as `MarianConfig` has them (an explicit `null` is unset
    /// and taken from generation_config.json), so they are not the shared flattened
    /// [`TokenIds`].
    #[serde(default = "default_pad")]
    pad_token_id: Option<Ids>,
    #[serde(default = "default_eos")]
    eos_token_id: Option<Ids>,
    #[serde(default)]
    bos_token_id: Option<Ids>,
    #[serde(default = "default_pad")]
    decoder_start_token_id: Option<Ids>,
}

fn default_vocab() -> usize {
    58101
}
fn default_d_model() -> usize {
    1024
}
fn default_layers() -> usize {
    12
}
fn default_heads() -> usize {
    16
}
fn default_ffn() -> usize {
    4096
}
fn default_positions() -> usize {
    1024
}
fn default_activation() -> String {
    "gelu".into()
}
fn yes() -> bool {
    true
}
fn default_pad() -> Option<Ids> {
    Some(Ids::One(58100))
}
fn default_eos() -> Option<Ids> {
    Some(Ids::One(0))
}

/// nn.LayerNorm's default: Marian's config has no epsilon field.
const LN_EPS: f32 = 1e-5;

/// Sizes checked against each other.
struct Dims {
    c: usize,
    src_vocab: usize,
    tgt_vocab: usize,
    max_positions: usize,
    activation: Activation,
}

impl MarianConfig {
    fn validate(&self, dir: &Path) -> Result<Dims> {
        let c = self.d_model;
        check_positive(dir, &[("d_model", c)])?;
        for (field, heads) in [
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
        ] {
            check_heads(dir, field, heads, "d_model", c)?;
        }
        check_positive(
            dir,
            &[
                ("encoder_ffn_dim", self.encoder_ffn_dim),
                ("decoder_ffn_dim", self.decoder_ffn_dim),
                ("vocab_size", self.vocab_size),
                ("max_position_embeddings", self.max_position_embeddings),
            ],
        )?;
        let tgt_vocab = self.decoder_vocab_size.unwrap_or(self.vocab_size);
        if self.share_encoder_decoder_embeddings && tgt_vocab != self.vocab_size {
            return Err(bad_field(
                dir,
                "decoder_vocab_size",
                format!(
                    "{tgt_vocab} differs from vocab_size = {} while share_encoder_decoder_embeddings is true",
                    self.vocab_size
                ),
            ));
        }
        let activation = Activation::from_hf_name(&self.activation_function)
            .map_err(|e| bad_field(dir, "activation_function", e.to_string()))?;
        Ok(Dims {
            c,
            src_vocab: self.vocab_size,
            tgt_vocab,
            max_positions: self.max_position_embeddings,
            activation,
        })
    }

    fn token_ids(&self) -> TokenIds {
        TokenIds {
            eos_token_id: self.eos_token_id.clone(),
            bos_token_id: self.bos_token_id.clone(),
            pad_token_id: self.pad_token_id.clone(),
            decoder_start_token_id: self.decoder_start_token_id.clone(),
        }
    }
}

/// q/k/v/out_proj with biases, all `[C, C]`.
fn attention(w: &Weights, name: &str, c: usize, heads: usize) -> Result<AttentionLayer> {
    let proj = |p: &str| w.linear(&format!("{name}.{p}"), c, c, true);
    Ok(AttentionLayer {
        mha: MultiHeadAttention::new(
            proj("q_proj")?,
            proj("k_proj")?,
            proj("v_proj")?,
            proj("out_proj")?,
            heads,
            heads,
        )?,
        rope: None,
    })
}

/// fc2(act(fc1(x))) with biases.
fn feed_forward(
    w: &Weights,
    name: &str,
    c: usize,
    f: usize,
    act: Activation,
) -> Result<FeedForward> {
    FeedForward::new(
        w.linear(&format!("{name}.fc1"), f, c, true)?,
        None,
        w.linear(&format!("{name}.fc2"), c, f, true)?,
        act,
    )
}

/// y ← LN(x + y): the post-norm residual step, in place on the sub-layer output y.
fn add_norm(x: &Tensor, mut y: Tensor, norm: &LayerNorm) -> Result<Tensor> {
    y.add_assign(x);
    norm.forward(&y)
}

struct EncoderLayer {
    self_attn: AttentionLayer,
    self_attn_norm: LayerNorm,
    ffn: FeedForward,
    final_norm: LayerNorm,
}

impl EncoderLayer {
    fn load(w: &Weights, l: usize, d: &Dims, cfg: &MarianConfig) -> Result<Self> {
        let p = format!("encoder.layers.{l}");
        Ok(EncoderLayer {
            self_attn: attention(
                w,
                &format!("{p}.self_attn"),
                d.c,
                cfg.encoder_attention_heads,
            )?,
            self_attn_norm: w.layer_norm(&format!("{p}.self_attn_layer_norm"), d.c, LN_EPS)?,
            ffn: feed_forward(w, &p, d.c, cfg.encoder_ffn_dim, d.activation)?,
            final_norm: w.layer_norm(&format!("{p}.final_layer_norm"), d.c, LN_EPS)?,
        })
    }

    /// x: [B, S, C] → [B, S, C].
    fn forward(&self, x: &Tensor, opts: &AttendOpts) -> Result<Tensor> {
        let h = self.self_attn.self_attention(x, opts, None)?;
        let x = add_norm(x, h, &self.self_attn_norm)?;
        let h = self.ffn.forward(&x)?;
        add_norm(&x, h, &self.final_norm)
    }
}

struct DecoderLayer {
    self_attn: AttentionLayer,
    self_attn_norm: LayerNorm,
    cross_attn: AttentionLayer,
    cross_attn_norm: LayerNorm,
    ffn: FeedForward,
    final_norm: LayerNorm,
}

impl DecoderLayer {
    fn load(w: &Weights, l: usize, d: &Dims, cfg: &MarianConfig) -> Result<Self> {
        let p = format!("decoder.layers.{l}");
        let heads = cfg.decoder_attention_heads;
        Ok(DecoderLayer {
            self_attn: attention(w, &format!("{p}.self_attn"), d.c, heads)?,
            self_attn_norm: w.layer_norm(&format!("{p}.self_attn_layer_norm"), d.c, LN_EPS)?,
            cross_attn: attention(w, &format!("{p}.encoder_attn"), d.c, heads)?,
            cross_attn_norm: w.layer_norm(&format!("{p}.encoder_attn_layer_norm"), d.c, LN_EPS)?,
            ffn: feed_forward(w, &p, d.c, cfg.decoder_ffn_dim, d.activation)?,
            final_norm: w.layer_norm(&format!("{p}.final_layer_norm"), d.c, LN_EPS)?,
        })
    }
}

pub struct Marian {
    info: ModelInfo,
    special: SpecialTokens,
    src_embed: Embedding,
    /// `None`: the decoder reads `src_embed` (shared embeddings).
    tgt_embed: Option<Embedding>,
    /// √C or 1.
    embed_scale: f32,
    /// [P, C] sinusoidal encodings, split layout.
    positions: Tensor,
    encoder: Vec<EncoderLayer>,
    decoder: Vec<DecoderLayer>,
    /// [V, C]; `None` when tied to the decoder's input embedding.
    lm_head: Option<Linear>,
    /// `[V]` added to every row of logits.
    final_logits_bias: Vec<f32>,
}

/// An embedding table `{name}.weight`: [v, c], taken from the first name present.
fn embedding(w: &Weights, names: &[&str], v: usize, c: usize) -> Result<Embedding> {
    let name = names
        .iter()
        .find(|n| w.has(&format!("{n}.weight")))
        .unwrap_or(&names[0]);
    w.embedding(name, v, c)
}

/// Loads a `MarianMTModel` folder.
pub fn load(dir: &Path, ckpt: &Checkpoint) -> Result<Model> {
    let cfg: MarianConfig = read_config(dir)?;
    let d = cfg.validate(dir)?;
    let special = special_tokens(dir, cfg.token_ids())?;
    // MarianMTModel nests the encoder-decoder under `model.`; a bare MarianModel does not.
    let w = Weights::detect(ckpt, &["model.", ""], "encoder.layers.0.fc1.weight");
    let (c, p) = (d.c, d.max_positions);
    let (src_embed, tgt_embed) = if cfg.share_encoder_decoder_embeddings {
        let shared = embedding(&w, &["shared", "encoder.embed_tokens"], d.src_vocab, c)?;
        (shared, None)
    } else {
        (
            w.embedding("encoder.embed_tokens", d.src_vocab, c)?,
            Some(w.embedding("decoder.embed_tokens", d.tgt_vocab, c)?),
        )
    };
    // The table is fixed; a checkpoint that stored it is read so its exact values are
    // used, as Hugging Face would load them.
    let positions = if w.has("encoder.embed_positions.weight") {
        w.tensor("encoder.embed_positions.weight", &[p, c])?
    } else {
        sinusoidal_table(p, c, SinusoidalLayout::Split)
    };
    let encoder = (0..cfg.encoder_layers)
        .map(|l| EncoderLayer::load(&w, l, &d, &cfg))
        .collect::<Result<Vec<_>>>()?;
    let decoder = (0..cfg.decoder_layers)
        .map(|l| DecoderLayer::load(&w, l, &d, &cfg))
        .collect::<Result<Vec<_>>>()?;
    // The LM head and its bias live outside `model.`.
    let lm_head = load_lm_head(ckpt, cfg.tie_word_embeddings, d.tgt_vocab, c)?;
    let final_logits_bias = if ckpt.has("final_logits_bias") {
        ckpt.tensor_shaped("final_logits_bias", &[1, d.tgt_vocab])?
            .into_data()
    } else {
        vec![0.0; d.tgt_vocab]
    };
    let heads = cfg.encoder_attention_heads;
    let info = ModelInfo {
        family: "marian".into(),
        architecture: architecture(&cfg.architectures, "MarianMTModel"),
        layers: cfg.encoder_layers,
        decoder_layers: Some(cfg.decoder_layers),
        hidden: c,
        heads,
        kv_heads: heads,
        head_dim: c / heads,
        ffn_dim: cfg.encoder_ffn_dim,
        vocab: d.tgt_vocab,
        max_positions: Some(p),
        position: "sinusoidal (fixed, split sin | cos)".into(),
        norm: format!("LayerNorm, post-norm, eps {LN_EPS:e}"),
        ffn: ffn_label(d.activation, false),
    };
    Ok(Model::Seq2Seq(Box::new(Marian {
        info,
        special,
        src_embed,
        tgt_embed,
        embed_scale: if cfg.scale_embedding {
            (c as f32).sqrt()
        } else {
            1.0
        },
        positions,
        encoder,
        decoder,
        lm_head,
        final_logits_bias,
    })))
}

impl Marian {
    fn tgt_embed(&self) -> &Embedding {
        self.tgt_embed.as_ref().unwrap_or(&self.src_embed)
    }

    /// Rows of the position table.
    fn max_positions(&self) -> usize {
        self.positions.shape()[0]
    }

    /// tokens: `[B, T]` at `positions` (B·T, each inside the table, as
    /// [`limit_positions`] and [`KvCache::begin_step`] leave them) →
    /// embed(ids)·scale + PE(positions): `[B, T, C]`.
    fn embed(&self, table: &Embedding, tokens: &TokenBatch, positions: &[usize]) -> Result<Tensor> {
        let c = self.info.hidden;
        let mut x = table.forward(&tokens.ids)?;
        for (row, &pos) in x.data_mut().chunks_exact_mut(c).zip(positions) {
            let pe = &self.positions.data()[pos * c..][..c];
            for (v, p) in row.iter_mut().zip(pe) {
                *v = *v * self.embed_scale + p;
            }
        }
        x.reshape(&[tokens.batch, tokens.len, c])
    }

    /// h: `[B, T, C]` → h · Eᵀ + final_logits_bias: `[B, T, V]`.
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let mut out = lm_logits(h, self.lm_head.as_ref(), &self.tgt_embed().table, 1.0)?;
        for row in out
            .data_mut()
            .chunks_exact_mut(self.final_logits_bias.len())
        {
            for (x, b) in row.iter_mut().zip(&self.final_logits_bias) {
                *x += b;
            }
        }
        Ok(out)
    }
}

impl Seq2SeqLm for Marian {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// src: [B, S] → encoder states [B, S, C] and each decoder layer's cross K/V.
    fn encode(&self, src: &TokenBatch) -> Result<Encoded> {
        src.check_vocab(self.src_embed.vocab_size())?;
        let mut positions = src.positions(&vec![0; src.batch]);
        limit_positions(&mut positions, &src.mask, self.max_positions())?;
        let mut x = self.embed(&self.src_embed, src, &positions)?;
        let opts = AttendOpts {
            positions: &positions,
            key_padding: Some(&src.mask),
            ..Default::default()
        };
        for layer in &self.encoder {
            x = layer.forward(&x, &opts)?;
        }
        Encoded::from_states(x, &src.mask, self.decoder.iter().map(|l| &l.cross_attn))
    }

    fn new_cache(&self, batch: usize) -> KvCache {
        let heads = self.decoder.first().map_or(1, |l| l.self_attn.mha.n_heads);
        let hd = self.info.hidden / heads;
        KvCache::new(self.decoder.len(), batch, heads, hd, hd)
    }

    /// tgt: [B, T] after the tokens in `cache` → logits [B, T, V].
    fn decode_cached(
        &self,
        tgt: &TokenBatch,
        enc: &Encoded,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        tgt.check_vocab(self.tgt_embed().vocab_size())?;
        enc.check(tgt.batch, self.decoder.len())?;
        cache.check_layers(self.decoder.len())?;
        // Real tokens must fit the position table; padding comes back clamped into it.
        let step = cache.begin_step(&tgt.mask, tgt.len, Some(self.max_positions()))?;
        let mut x = self.embed(self.tgt_embed(), tgt, &step.positions)?;
        let opts = AttendOpts {
            positions: &step.positions,
            key_padding: Some(&step.key_padding),
            causal: true,
            ..Default::default()
        };
        for ((layer, kv), lc) in self.decoder.iter().zip(&enc.cross).zip(&mut cache.layers) {
            let h = layer.self_attn.self_attention(&x, &opts, Some(lc))?;
            x = add_norm(&x, h, &layer.self_attn_norm)?;
            let h = layer
                .cross_attn
                .cross_attention(&x, kv, Some(&enc.key_padding), None)?;
            x = add_norm(&x, h, &layer.cross_attn_norm)?;
            let h = layer.ffn.forward(&x)?;
            x = add_norm(&x, h, &layer.final_norm)?;
        }
        self.logits(&x)
    }
}
