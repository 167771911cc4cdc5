//! BERT (`BertModel`, and the encoder inside `BertForMaskedLM` /
//! `BertForSequenceClassification` checkpoints): the Transformer's encoder stack as
//! Devlin et al. trained it.
//!
//! - Embeddings: word + learned absolute position (0..T, padding or not, as HF's
//!   `position_ids = arange(T)`) + token type (segment A/B), summed, then LayerNorm.
//! - Layers are post-norm: x = LN(x + Attn(x)); x = LN(x + FFN(x)).
//! - Attention is bidirectional; padding is removed as keys only, so a padded row's
//!   real tokens see exactly what they would see alone.
//!
//! The output is `last_hidden_state`; the pooler and task heads are not part of it.

use std::path::Path;

use serde::Deserialize;

use super::batch::too_long;
use super::{architecture, ffn_label, Encoder, Model, ModelInfo, TokenBatch, Weights};
use crate::attention::MultiHeadAttention;
use crate::block::{AttendOpts, AttentionLayer};
use crate::error::{Error, Result};
use crate::io::{bad_field, check_heads, check_positive, read_config, Checkpoint};
use crate::layers::{Embedding, FeedForward, LayerNorm};
use crate::ops::Activation;
use crate::position::LearnedPositions;
use crate::tensor::Tensor;

/// `config.json` as `BertConfig` writes it. A missing field takes `BertConfig`'s
/// default (BERT-base), as transformers itself does when loading the file.
#[derive(Deserialize)]
#[serde(default)]
struct BertConfig {
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    hidden_act: String,
    max_position_embeddings: usize,
    type_vocab_size: usize,
    layer_norm_eps: f64,
    /// Dropped from `BertConfig` in transformers 5 (absolute is then the only kind).
    position_embedding_type: Option<String>,
    is_decoder: bool,
}

impl Default for BertConfig {
    fn default() -> Self {
        BertConfig {
            architectures: Vec::new(),
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: "gelu".into(),
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            position_embedding_type: None,
            is_decoder: false,
        }
    }
}

/// One post-norm encoder layer.
struct BertLayer {
    attention: AttentionLayer,
    /// `attention.output.LayerNorm`
    attention_norm: LayerNorm,
    /// `intermediate.dense` → act → `output.dense`
    ffn: FeedForward,
    /// `output.LayerNorm`
    output_norm: LayerNorm,
}

impl BertLayer {
    /// x: [B, T, C] → [B, T, C].
    fn forward(&self, x: &Tensor, opts: &AttendOpts) -> Result<Tensor> {
        let mut h = self.attention.self_attention(x, opts, None)?;
        h.add_assign(x);
        let x = self.attention_norm.forward(&h)?;
        let mut h = self.ffn.forward(&x)?;
        h.add_assign(&x);
        self.output_norm.forward(&h)
    }
}

pub struct Bert {
    info: ModelInfo,
    /// [V, C]
    word: Embedding,
    /// [P, C]
    positions: LearnedPositions,
    /// [type_vocab_size, C]
    token_types: Embedding,
    embeddings_norm: LayerNorm,
    layers: Vec<BertLayer>,
}

/// A LayerNorm stored as `weight`/`bias`, or as `gamma`/`beta` in checkpoints
/// converted from the original TensorFlow release (transformers renames those on load).
fn layer_norm(w: &Weights, name: &str, c: usize, eps: f32) -> Result<LayerNorm> {
    if w.has(&format!("{name}.gamma")) {
        LayerNorm::new(
            w.tensor(&format!("{name}.gamma"), &[c])?,
            Some(w.tensor(&format!("{name}.beta"), &[c])?),
            eps,
        )
    } else {
        w.layer_norm(name, c, eps)
    }
}

pub fn load(dir: &Path, ckpt: &Checkpoint) -> Result<Model> {
    let cfg: BertConfig = read_config(dir)?;
    let (c, n_heads) = (cfg.hidden_size, cfg.num_attention_heads);
    check_heads(dir, "num_attention_heads", n_heads, "hidden_size", c)?;
    check_positive(
        dir,
        &[
            ("max_position_embeddings", cfg.max_position_embeddings),
            ("type_vocab_size", cfg.type_vocab_size),
        ],
    )?;
    match cfg.position_embedding_type.as_deref() {
        None | Some("absolute") => {}
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "{}: field `position_embedding_type` is `{other}`; only `absolute` BERT positions are implemented",
                dir.join("config.json").display()
            )))
        }
    }
    if cfg.is_decoder {
        return Err(Error::Unsupported(format!(
            "{}: field `is_decoder` is true; BERT is loaded as a bidirectional encoder only",
            dir.join("config.json").display()
        )));
    }
    let activation = Activation::from_hf_name(&cfg.hidden_act)
        .map_err(|e| bad_field(dir, "hidden_act", e.to_string()))?;
    let eps = cfg.layer_norm_eps as f32;

    // Task models (`BertForMaskedLM`, ...) keep the encoder under `bert.`.
    let w = Weights::detect(ckpt, &["", "bert."], "embeddings.word_embeddings.weight");
    let word = w.embedding("embeddings.word_embeddings", cfg.vocab_size, c)?;
    let positions = LearnedPositions::new(w.tensor(
        "embeddings.position_embeddings.weight",
        &[cfg.max_position_embeddings, c],
    )?)?;
    let token_types = w.embedding("embeddings.token_type_embeddings", cfg.type_vocab_size, c)?;
    let embeddings_norm = layer_norm(&w, "embeddings.LayerNorm", c, eps)?;

    let f = cfg.intermediate_size;
    let layers = (0..cfg.num_hidden_layers)
        .map(|l| {
            let p = format!("encoder.layer.{l}");
            let mha = MultiHeadAttention::new(
                w.linear(&format!("{p}.attention.self.query"), c, c, true)?,
                w.linear(&format!("{p}.attention.self.key"), c, c, true)?,
                w.linear(&format!("{p}.attention.self.value"), c, c, true)?,
                w.linear(&format!("{p}.attention.output.dense"), c, c, true)?,
                n_heads,
                n_heads,
            )?;
            Ok(BertLayer {
                attention: AttentionLayer { mha, rope: None },
                attention_norm: layer_norm(&w, &format!("{p}.attention.output.LayerNorm"), c, eps)?,
                ffn: FeedForward::new(
                    w.linear(&format!("{p}.intermediate.dense"), f, c, true)?,
                    None,
                    w.linear(&format!("{p}.output.dense"), c, f, true)?,
                    activation,
                )?,
                output_norm: layer_norm(&w, &format!("{p}.output.LayerNorm"), c, eps)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;

    let info = ModelInfo {
        family: "bert".into(),
        architecture: architecture(&cfg.architectures, "BertModel"),
        layers: cfg.num_hidden_layers,
        decoder_layers: None,
        hidden: c,
        heads: n_heads,
        kv_heads: n_heads,
        head_dim: c / n_heads,
        ffn_dim: f,
        vocab: cfg.vocab_size,
        max_positions: Some(cfg.max_position_embeddings),
        position: format!("learned absolute + {} token types", cfg.type_vocab_size),
        norm: format!("LayerNorm, post-norm, eps {:e}", cfg.layer_norm_eps),
        ffn: ffn_label(activation, false),
    };
    Ok(Model::Encoder(Box::new(Bert {
        info,
        word,
        positions,
        token_types,
        embeddings_norm,
        layers,
    })))
}

impl Bert {
    /// Embeddings before the encoder: LN(word + position + token type): [B·T, C].
    fn embed(&self, tokens: &TokenBatch, token_types: Option<&[usize]>) -> Result<Tensor> {
        let (b, t) = (tokens.batch, tokens.len);
        let mut x = self.word.forward(&tokens.ids)?;
        let positions: Vec<usize> = (0..b).flat_map(|_| 0..t).collect();
        self.positions.add_to(&mut x, &positions)?;
        let types = match token_types {
            Some(types) => {
                if types.len() != b * t {
                    return Err(Error::shape(
                        "token_type_ids",
                        format!("[{b}, {t}] like input_ids"),
                        &[types.len()],
                    ));
                }
                let n = self.token_types.vocab_size();
                if let Some(&bad) = types.iter().find(|&&ty| ty >= n) {
                    return Err(Error::OutOfRange {
                        what: "token type id (type_vocab_size)".into(),
                        index: bad,
                        size: n,
                    });
                }
                self.token_types.forward(types)?
            }
            // HF's default token_type_ids are all segment 0: one row, added everywhere.
            None => self.token_types.forward(&[0])?,
        };
        let c = self.word.dim();
        for (row, ty) in x
            .data_mut()
            .chunks_exact_mut(c)
            .zip(types.data().chunks_exact(c).cycle())
        {
            for (a, e) in row.iter_mut().zip(ty) {
                *a += e;
            }
        }
        self.embeddings_norm.forward(&x)
    }
}

impl Encoder for Bert {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// tokens: [B, T]; token_types: [B·T] or `None` for segment 0 → last_hidden_state
    /// [B, T, C]. Outputs at padding positions are unspecified.
    fn forward(&self, tokens: &TokenBatch, token_types: Option<&[usize]>) -> Result<Tensor> {
        let (b, t) = (tokens.batch, tokens.len);
        tokens.check_vocab(self.info.vocab)?;
        let max = self.positions.max_positions();
        // Positions are 0..T in every row, padding or not.
        if t > max {
            return Err(too_long(t - 1, max));
        }
        let mut x = self
            .embed(tokens, token_types)?
            .reshape(&[b, t, self.word.dim()])?;
        let opts = AttendOpts {
            key_padding: Some(&tokens.mask),
            ..Default::default()
        };
        for layer in &self.layers {
            x = layer.forward(&x, &opts)?;
        }
        Ok(x)
    }
}
