//! Real checkpoints: Hugging Face model folders (`config.json` + safetensors) loaded into
//! the shared layers, one file per family for its quirks.
//!
//! | family | architectures | what it exercises |
//! |---|---|---|
//! | [`bert`] | `BertModel`, `BertForMaskedLM`, … | encoder, learned positions, token types, post-norm |
//! | [`gpt2`] | `GPT2LMHeadModel` | decoder-only, causal, learned positions, pre-norm, Conv1D weights |
//! | [`llama`] | `LlamaForCausalLM`, `MistralForCausalLM` | RoPE, RMSNorm, SwiGLU, GQA, sliding window |
//! | [`bloom`] | `BloomForCausalLM` | ALiBi, fused QKV, embedding LayerNorm |
//! | [`marian`] | `MarianMTModel` | the original encoder-decoder: sinusoidal, post-norm, cross-attention |
//! | [`t5`] | `T5ForConditionalGeneration` | relative position buckets, unscaled scores, gated FFN |

pub mod batch;
pub mod bert;
pub mod bloom;
pub mod cache;
pub mod generate;
pub mod gpt2;
pub(crate) mod head;
pub mod llama;
pub mod marian;
pub mod sentence;
mod special;
pub mod t5;
pub mod weights;

use std::path::Path;

pub use batch::TokenBatch;
pub use cache::{KvCache, LayerKv, Step};
pub use weights::Weights;

use crate::block::{AttentionLayer, CrossKv};
use crate::error::{Error, Result};
use crate::io::Checkpoint;
use crate::ops::Activation;
use crate::tensor::Tensor;

/// What `qkv inspect` reports about an architecture.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelInfo {
    /// `bert`, `gpt2`, `llama`, `mistral`, `bloom`, `marian`, `t5`
    pub family: String,
    /// `architectures[0]` from config.json
    pub architecture: String,
    /// Encoder layers for encoders and encoder-decoders, decoder layers otherwise.
    pub layers: usize,
    /// Decoder layers of an encoder-decoder.
    pub decoder_layers: Option<usize>,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    /// Longest sequence the position scheme allows, if it has a limit.
    pub max_positions: Option<usize>,
    /// e.g. "learned absolute", "RoPE (half-split, θ=10000)", "ALiBi"
    pub position: String,
    /// e.g. "LayerNorm, post-norm, eps 1e-12"
    pub norm: String,
    /// e.g. "GELU (erf)", "SwiGLU"
    pub ffn: String,
}

/// [`ModelInfo::ffn`] for a feed-forward block with activation `act`, gated
/// (`act(x·W₁) ⊙ x·W₂`) or not: "GELU (erf)", "SwiGLU", "gated GELU (tanh
/// approximation)".
pub(crate) fn ffn_label(act: Activation, gated: bool) -> String {
    match (gated, act) {
        (false, act) => act.to_string(),
        (true, Activation::Silu) => "SwiGLU".into(),
        (true, act) => format!("gated {act}"),
    }
}

/// `architectures[0]` of a config, or `default` when the list is empty.
pub(crate) fn architecture(listed: &[String], default: &str) -> String {
    listed.first().map_or_else(|| default.into(), Clone::clone)
}

/// Token ids with special meaning for generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub eos: Vec<usize>,
    pub pad: Option<usize>,
    pub bos: Option<usize>,
    /// First decoder token of an encoder-decoder.
    pub decoder_start: Option<usize>,
}

/// An encoder: tokens → hidden states (BERT).
pub trait Encoder: Send + Sync {
    fn info(&self) -> &ModelInfo;
    /// tokens: [B, T]; token_types: [B·T] segment ids or `None` for all 0 → [B, T, C].
    fn forward(&self, tokens: &TokenBatch, token_types: Option<&[usize]>) -> Result<Tensor>;
}

/// A decoder-only language model (GPT-2, Llama, Mistral, BLOOM).
pub trait CausalLm: Send + Sync {
    fn info(&self) -> &ModelInfo;
    fn special_tokens(&self) -> &SpecialTokens;
    /// An empty cache for `batch` rows: one layer per [`ModelInfo::layers`], each with
    /// [`ModelInfo::kv_heads`] heads of width [`ModelInfo::head_dim`].
    fn new_cache(&self, batch: usize) -> KvCache {
        let i = self.info();
        KvCache::new(i.layers, batch, i.kv_heads, i.head_dim, i.head_dim)
    }
    /// tokens: [B, T] placed after everything in `cache` (which grows by T) → logits
    /// [B, T, V]. A whole sequence is one call on an empty cache.
    fn forward_cached(&self, tokens: &TokenBatch, cache: &mut KvCache) -> Result<Tensor>;
}

/// An encoder's output as the decoder consumes it.
#[derive(Clone, Debug)]
pub struct Encoded {
    /// [B, S, C]
    pub hidden: Tensor,
    /// [B, S] real source tokens
    pub key_padding: Vec<bool>,
    /// Cross-attention K/V for each decoder layer, computed once per source.
    pub cross: Vec<CrossKv>,
}

impl Encoded {
    /// Encoder states `[B, S, C]` with their mask `[B, S]`, and the cross-attention K/V
    /// that each of `cross_layers` (the decoder's, in order) computes from them, once
    /// per source.
    pub(crate) fn from_states<'a>(
        hidden: Tensor,
        key_padding: &[bool],
        cross_layers: impl Iterator<Item = &'a AttentionLayer>,
    ) -> Result<Self> {
        let cross = cross_layers
            .map(|layer| layer.cross_kv(&hidden))
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoded {
            hidden,
            key_padding: key_padding.to_vec(),
            cross,
        })
    }

    /// Errors unless this encoder output fits a decoder of `layers` layers run on a
    /// batch of `batch` rows (it came from this model and this batch).
    pub fn check(&self, batch: usize, layers: usize) -> Result<()> {
        if self.hidden.shape().first() != Some(&batch) || self.cross.len() != layers {
            return Err(Error::invalid(
                "encoder output",
                format!(
                    "holds {:?} states and {} cross K/V; the decoder needs batch {batch} and {layers} layers",
                    self.hidden.shape(),
                    self.cross.len()
                ),
            ));
        }
        Ok(())
    }
}

/// An encoder-decoder (Marian, T5).
pub trait Seq2SeqLm: Send + Sync {
    fn info(&self) -> &ModelInfo;
    fn special_tokens(&self) -> &SpecialTokens;
    /// src: [B, S] → encoder states and per-layer cross K/V.
    fn encode(&self, src: &TokenBatch) -> Result<Encoded>;
    fn new_cache(&self, batch: usize) -> KvCache;
    /// tgt: [B, T] decoder tokens after those in `cache` → logits [B, T, V].
    fn decode_cached(&self, tgt: &TokenBatch, enc: &Encoded, cache: &mut KvCache)
        -> Result<Tensor>;
}

/// Any supported model, by kind.
pub enum Model {
    Encoder(Box<dyn Encoder>),
    Causal(Box<dyn CausalLm>),
    Seq2Seq(Box<dyn Seq2SeqLm>),
}

/// The architectures [`load`] accepts, for error messages and `--help`.
pub const SUPPORTED: &[&str] = &[
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "GPT2LMHeadModel",
    "GPT2Model",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "BloomForCausalLM",
    "MarianMTModel",
    "T5ForConditionalGeneration",
];

#[derive(serde::Deserialize)]
struct ArchitectureOnly {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
}

/// A loaded model with what its checkpoint says about itself.
pub struct Loaded {
    pub model: Model,
    /// Elements stored in the checkpoint (a tied matrix counts once).
    pub parameters: usize,
    /// Dtypes on disk with their element counts.
    pub dtypes: Vec<(String, usize)>,
}

impl Model {
    pub fn info(&self) -> &ModelInfo {
        match self {
            Model::Encoder(m) => m.info(),
            Model::Causal(m) => m.info(),
            Model::Seq2Seq(m) => m.info(),
        }
    }
}

/// Loads the model in folder `dir`, dispatching on `architectures` (or `model_type`).
pub fn load(dir: &Path) -> Result<Loaded> {
    if !dir.is_dir() {
        return Err(Error::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a local model folder (qkv reads Hugging Face folders from disk; it does not download from the hub)",
            ),
        ));
    }
    let arch: ArchitectureOnly = crate::io::read_config(dir)?;
    let name = arch
        .architectures
        .first()
        .cloned()
        .or_else(|| arch.model_type.clone())
        .unwrap_or_default();
    let ckpt = Checkpoint::open(dir)?;
    let model = match name.as_str() {
        "BertModel" | "BertForMaskedLM" | "BertForSequenceClassification" | "bert" => {
            bert::load(dir, &ckpt)?
        }
        "GPT2LMHeadModel" | "GPT2Model" | "gpt2" => gpt2::load(dir, &ckpt)?,
        "LlamaForCausalLM" | "MistralForCausalLM" | "llama" | "mistral" => llama::load(dir, &ckpt)?,
        "BloomForCausalLM" | "bloom" => bloom::load(dir, &ckpt)?,
        "MarianMTModel" | "marian" => marian::load(dir, &ckpt)?,
        "T5ForConditionalGeneration" | "t5" => t5::load(dir, &ckpt)?,
        other => {
            return Err(Error::Unsupported(format!(
                "architecture `{other}` in {}; supported: {}",
                dir.join("config.json").display(),
                SUPPORTED.join(", ")
            )))
        }
    };
    let dtypes = ckpt.dtypes()?;
    Ok(Loaded {
        model,
        parameters: dtypes.iter().map(|(_, n)| n).sum(),
        dtypes,
    })
}
