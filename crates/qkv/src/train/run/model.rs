//! The model a run trains: one loaded from a folder (`init`, `resume`), or a new one
//! built from the request's model settings: a Transformer decoder ([`arch`]) or a
//! recurrent model.

use std::path::Path;

use super::request::{FfnChoice, Network, NormChoice, PositionChoice, RunRequest, Style};
use crate::block::Residual;
use crate::error::{Error, Result};
use crate::layers::NormKind;
use crate::models::arch::NormSpec;
use crate::models::{Arch, Head, Position, Transformer};
use crate::ops::Activation;
use crate::position::{RopeScaling, SinusoidalLayout};
use crate::train::recurrent::{RecurrentKind, RecurrentModel, RecurrentSpec};
use crate::train::trainable::TrainableModel;

/// A Transformer of any family, or a recurrent model.
pub enum Model {
    Transformer(Box<Transformer>),
    Recurrent(Box<RecurrentModel>),
}

impl Model {
    pub fn trainable(&mut self) -> &mut dyn TrainableModel {
        match self {
            Model::Transformer(m) => m.as_mut(),
            Model::Recurrent(m) => m.as_mut(),
        }
    }

    /// The vocabulary and the position limit (None: unlimited) batches must fit.
    pub fn limits(&self) -> (usize, Option<usize>) {
        match self {
            Model::Transformer(m) => (m.arch.vocab, m.arch.max_positions()),
            Model::Recurrent(m) => (m.spec().vocab, None),
        }
    }

    /// The model saved in the checkpoint folder `dir`.
    pub fn load(dir: &Path) -> Result<Model> {
        let within = |e: Error| e.within(format!("loading the model of {}", dir.display()));
        Ok(match RecurrentModel::is_saved_in(dir) {
            true => Model::Recurrent(Box::new(RecurrentModel::load(dir).map_err(within)?)),
            false => Model::Transformer(Box::new(Transformer::load(dir).map_err(within)?)),
        })
    }

    /// The `init` folder's model, which must have a head to train.
    pub fn init(dir: &Path) -> Result<Model> {
        let model = Transformer::load(dir)
            .map_err(|e| e.within(format!("loading `init` {}", dir.display())))?;
        if model.arch.head == Head::None {
            return Err(Error::request(format!(
                "`init` {}: {} has no head to train (BERT trains as BertForMaskedLM, with its cls.predictions weights)",
                dir.display(),
                model.info().architecture
            )));
        }
        Ok(Model::Transformer(Box::new(model)))
    }
}

/// The Transformer decoder a fresh `request` describes, for `vocab` tokens and
/// sequences of `len`: its style's preset with the model settings applied.
pub fn arch(request: &RunRequest, vocab: usize, len: usize) -> Result<Arch> {
    let r = request;
    let style = r.style.unwrap_or(Style::Gpt2);
    let d_model = r.d_model.unwrap_or(64);
    let layers = r.layers.unwrap_or(2);
    let heads = r.heads.unwrap_or(4);
    if heads == 0 || !d_model.is_multiple_of(heads) {
        return Err(Error::request(format!(
            "model options: invalid n_heads: {heads} heads do not divide d_model = {d_model}"
        )));
    }
    let mut a = match style {
        Style::Gpt2 => Arch::gpt2(vocab, d_model, layers, heads, len),
        Style::Llama => Arch::llama(vocab, d_model, layers, heads, heads, len),
    };
    let mut stack = a.stack();
    stack.kv_heads = r.kv_heads.unwrap_or(heads);
    if let Some(kind) = r.ffn_kind {
        (a.ffn.activation, a.ffn.gated) = match kind {
            FfnChoice::Relu => (Activation::Relu, false),
            FfnChoice::Gelu => (Activation::Gelu, false),
            FfnChoice::GeluTanh => (Activation::GeluTanh, false),
            FfnChoice::Swiglu => (Activation::Silu, true),
        };
        if r.ffn.is_none() && a.ffn.gated != (style == Style::Llama) {
            // keep the parameter count of the style's FFN: 3 matrices of 8C/3 ≈ 2 of 4C
            stack.ffn_dim = match a.ffn.gated {
                true => (8 * d_model).div_ceil(3).div_ceil(8) * 8,
                false => 4 * d_model,
            };
        }
    }
    if let Some(f) = r.ffn {
        stack.ffn_dim = f;
    }
    a.decoder = Some(stack);
    if let Some(p) = r.position {
        a.position = match p {
            PositionChoice::None => Position::None,
            PositionChoice::Sinusoidal => Position::Sinusoidal {
                max_len: len,
                layout: SinusoidalLayout::Interleaved,
            },
            PositionChoice::Learned => Position::Learned { max_len: len },
            PositionChoice::Rope => Position::Rope {
                theta: 10_000.0,
                scaling: RopeScaling::None,
                max_len: Some(len),
                rotary_dim: None,
            },
            PositionChoice::Alibi => Position::Alibi,
        };
    }
    if let Some(n) = r.norm {
        // a LayerNorm has a bias exactly when the projections do
        a.norm = match n {
            NormChoice::LayerNorm => NormSpec {
                kind: NormKind::LayerNorm,
                eps: 1e-5,
                bias: a.attention.qkv_bias,
                unit_offset: false,
            },
            NormChoice::RmsNorm => NormSpec {
                kind: NormKind::RmsNorm,
                eps: 1e-6,
                bias: false,
                unit_offset: false,
            },
        };
    }
    if r.post_norm {
        a.residual = Residual::PostNorm;
    }
    a.validate().map_err(|e| e.within("model options"))?;
    Ok(a)
}

/// The recurrent model `kind` a fresh `request` describes, for `vocab` tokens: width
/// `d_model` (embedding, state and attention), `layers` Elman layers; the
/// encoder-decoders split rows at `separator` (a task's).
pub fn recurrent(
    request: &RunRequest,
    network: Network,
    vocab: usize,
    separator: Option<usize>,
    seed: u64,
) -> Result<Model> {
    let kind = match network {
        Network::Rnn => RecurrentKind::Lm,
        Network::RnnSeq2seq => RecurrentKind::Seq2Seq,
        _ => RecurrentKind::Seq2SeqAttention,
    };
    let width = request.d_model.unwrap_or(64);
    let spec = RecurrentSpec {
        kind,
        vocab,
        embedding: width,
        hidden: width,
        layers: request.layers.unwrap_or(1),
        attention_width: width,
        separator,
    };
    let model = RecurrentModel::new(&spec, seed).map_err(|e| e.within("model options"))?;
    Ok(Model::Recurrent(Box::new(model)))
}
