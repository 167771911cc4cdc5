//! Models from GGUF files (llama.cpp's format). The metadata gives the architecture
//! (`llama.block_count`, `llama.embedding_length`, …) and the tensors are read through
//! the family's own name table, seen under Hugging Face's names: `blk.0.attn_q.weight`
//! is `model.layers.0.self_attn.q_proj.weight`. What the model computes is what
//! llama.cpp computes from the file (its defaults where a key is absent).
//!
//! llama.cpp's converter permutes the rows of Q and K of `llama` models for its
//! interleaved RoPE (within each head, rows i and D/2 + i become rows 2i and 2i + 1);
//! they are put back in Hugging Face's half-split order as they are read. It stores
//! Gemma's norm weights as 1 + w; they are read back as w.
//!
//! Architectures: `llama` (Llama, Mistral, SmolLM), `qwen2`, `qwen3`, `gemma`, `gemma2`,
//! `gemma3` and `phi3`. Linear layers stored
//! as Q8_0 run from their blocks through the int8 kernels, those stored as Q4_0, Q4_K,
//! Q5_K or Q6_K from their blocks as stored ([`crate::weights::ggml`]), and those stored
//! as F16 from their f16 values when the load is in f32; F32, BF16 (and F16 in a load
//! in bf16 or int8) are packed in the load's type as they are read. Embedding tables
//! and norms are read as f32.

mod encode;
mod export;
mod hf_config;
mod meta;
mod view;

pub use export::save_gguf;

use std::collections::HashSet;
use std::path::Path;

use super::families::special::SpecialTokens;
use super::families::Family;
use super::reading::{read_weights, sizes_unlike, Loaded};
use super::transformer::Transformer;
use crate::error::{Error, Result};
use crate::io::gguf::GgufFile;
use crate::weights::DType;
use meta::{Kind, Meta, RopeFactors};
use view::HfView;

/// The RoPE frequency factors of a `kind` file, when it holds them: Phi-3's
/// `rope_factors_long` and `rope_factors_short` (both or neither), or a `llama` file's
/// `rope_freqs` (Llama 3's scaling, the same at every length); the names read.
fn rope_factors(file: &GgufFile, kind: Kind) -> Result<(Option<RopeFactors>, Vec<&'static str>)> {
    let h = &file.header;
    let read = |name: &str| -> Result<Vec<f32>> {
        let t = file.tensor(name)?;
        if t.rank() != 1 {
            return Err(Error::Gguf {
                path: file.path().to_string(),
                reason: format!(
                    "tensor `{name}`: {:?} is not a vector of factors",
                    t.shape()
                ),
            });
        }
        Ok(t.data().to_vec())
    };
    const LONG: &str = "rope_factors_long.weight";
    const SHORT: &str = "rope_factors_short.weight";
    const FREQS: &str = "rope_freqs.weight";
    match (h.tensor(LONG), h.tensor(SHORT)) {
        (Some(_), Some(_)) if kind == Kind::Phi3 => {
            let factors = RopeFactors {
                long: read(LONG)?,
                short: read(SHORT)?,
                tensor: LONG,
            };
            return Ok((Some(factors), vec![LONG, SHORT]));
        }
        (Some(_), None) | (None, Some(_)) if kind == Kind::Phi3 => {
            return Err(Error::Gguf {
                path: file.path().to_string(),
                reason: format!("`{LONG}` and `{SHORT}` go together; the file has one"),
            })
        }
        _ => {}
    }
    if kind == Kind::Llama && h.tensor(FREQS).is_some() {
        let f = read(FREQS)?;
        let factors = RopeFactors {
            long: f.clone(),
            short: f,
            tensor: FREQS,
        };
        return Ok((Some(factors), vec![FREQS]));
    }
    Ok((None, Vec::new()))
}

/// Loads the GGUF file `path` as a model, its linear layers in `dtype`
/// (as [`super::load_in`]).
pub fn load_gguf(path: &Path, dtype: DType) -> Result<Loaded> {
    let file = GgufFile::open(path)?;
    let h = &file.header;
    let meta = Meta {
        h,
        path: file.path(),
    };
    let gguf_arch = meta.string("general.architecture")?;
    let kind = Kind::from_name(gguf_arch).ok_or_else(|| {
        Error::Unsupported(format!(
            "{}: GGUF architecture `{gguf_arch}` (qkv reads {})",
            file.path(),
            Kind::names()
        ))
    })?;
    let architecture = kind.architecture();
    let family = kind.family();
    let id = |key: &str| meta.opt_u64(key).map(|v| v as usize);
    // a tied head over a table stored in blocks computes from those blocks, as
    // llama.cpp's does: a head of its own that reads the table's blocks
    let tied = h.tensor("output.weight").is_none() || kind.head_is_table();
    let head_from_table = tied
        && h.tensor("token_embd.weight")
            .is_some_and(|t| view::runs_as_stored(t.ty, dtype));
    let (factors, factor_tensors) = rope_factors(&file, kind)?;
    let mut arch = meta.arch(kind, tied && !head_from_table, factors.as_ref())?;
    // as transformers builds the embedding of a Llama-layout model (its padding row
    // gets no gradient)
    arch.embed.padding_idx = id("tokenizer.ggml.padding_token_id");
    if let Some(reason) = sizes_unlike(&arch, h.tensors.iter().map(|t| t.numel()).sum()) {
        return Err(Error::Gguf {
            path: file.path().to_string(),
            reason: format!("its metadata: {reason}"),
        });
    }
    let view = HfView::new(&file, &arch, kind, head_from_table, dtype);
    let stored = |hf: &str, shape: &[usize]| view.stored_linear(hf, shape);
    // Phi-3's projections are read under Llama's names, each the rows of the fused
    // tensor that holds it, so that they run from its blocks as stored
    let names = match kind {
        Kind::Phi3 => Family::reading("LlamaForCausalLM").expect("the Llama family"),
        _ => family,
    };
    let (weights, logits_bias, used) = read_weights(&view, &arch, names, dtype, &stored)?;
    let used: HashSet<String> = used
        .iter()
        .filter_map(|hf| view.locate(hf))
        .map(|at| at.name)
        .chain(factor_tensors.iter().map(|n| n.to_string()))
        .collect();
    let mut unused: Vec<String> = h
        .tensors
        .iter()
        .filter(|t| !used.contains(&t.name))
        .map(|t| t.name.clone())
        .collect();
    unused.sort();
    let mut dtypes: Vec<(String, usize)> = Vec::new();
    for t in &h.tensors {
        match dtypes.iter_mut().find(|(n, _)| n == t.ty.name) {
            Some((_, count)) => *count += t.numel(),
            None => dtypes.push((t.ty.name.to_string(), t.numel())),
        }
    }
    dtypes.sort();
    let special = SpecialTokens {
        eos: id("tokenizer.ggml.eos_token_id").into_iter().collect(),
        bos: id("tokenizer.ggml.bos_token_id"),
        pad: id("tokenizer.ggml.padding_token_id"),
        decoder_start: None,
    };
    // what `save` writes as config.json: the family's keys for this architecture
    let config = hf_config::config(kind, &arch);
    let mut model = Transformer::from_parts(
        arch,
        family,
        special,
        weights,
        logits_bias,
        Some(config),
        architecture.to_string(),
    )?;
    model.adopt_layer_types();
    model.load_warnings.extend(ignored(&meta, kind));
    Ok(Loaded {
        model,
        parameters: h.tensors.iter().map(|t| t.numel()).sum(),
        dtypes,
        unused,
    })
}

/// What the file says that llama.cpp does not apply, so neither does qkv: Phi-3's
/// sliding window (llama.cpp runs every layer over all positions).
fn ignored(meta: &Meta, kind: Kind) -> Vec<String> {
    let key = "phi3.attention.sliding_window";
    match meta.opt_u64(key) {
        Some(w) if kind == Kind::Phi3 && w > 0 => vec![format!(
            "{}: `{key}` = {w} is not applied: llama.cpp runs Phi-3 without its sliding window, and so does qkv on this file",
            meta.path
        )],
        _ => Vec::new(),
    }
}
