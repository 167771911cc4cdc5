//! A model written as a GGUF file that llama.cpp loads: a Llama-layout decoder (a
//! Hugging Face Llama, Mistral, Qwen2 or Qwen3 folder, or one `qkv train` made in that
//! layout) as the `llama`, `qwen2` or `qwen3` architecture, with llama.cpp's tensor names, Q and K of
//! `llama` permuted as its converter permutes them, and the metadata its converter
//! writes. Weights (2-D) are stored in the type asked for, norms and biases in F32, as
//! llama.cpp's converter and quantizer store them.

use std::path::Path;

use super::encode::encode;
use super::meta::Sizes;
use super::view::{gguf_name, permuted_row};
use crate::error::{Error, Result};
use crate::io::gguf::{self, GgmlType, OutTensor, Value};
use crate::models::families::{names, Family};
use crate::models::transformer::Transformer;
use crate::tensor::Tensor;

/// llama.cpp's `general.file_type` of a file whose weights are `ty`
/// (`LLAMA_FTYPE_ALL_F32`, `MOSTLY_F16`, `MOSTLY_Q4_0`, `MOSTLY_Q8_0`, `MOSTLY_BF16`).
fn file_type(ty: GgmlType) -> Option<u32> {
    [
        (GgmlType::F32, 0),
        (GgmlType::F16, 1),
        (GgmlType::Q4_0, 2),
        (GgmlType::Q8_0, 7),
        (GgmlType::BF16, 32),
    ]
    .into_iter()
    .find(|(t, _)| *t == ty)
    .map(|(_, c)| c)
}

/// Writes `model` as the GGUF file `path` with its weights in `ty` (F32, F16, BF16,
/// Q8_0 or Q4_0), named `name`, with `vocab` (the tokenizer's metadata, from
/// [`crate::text::folder_gguf_metadata`]) when given.
pub fn save_gguf(
    model: &Transformer,
    path: &Path,
    ty: GgmlType,
    name: &str,
    vocab: Vec<(String, Value)>,
) -> Result<()> {
    model.expect_f32_weights(&format!("write {}", path.display()))?;
    let file_type = file_type(ty).ok_or_else(|| {
        Error::Unsupported(format!(
            "GGUF weights in {ty} (qkv writes F32, F16, BF16, Q8_0 and Q4_0)"
        ))
    })?;
    let sizes = Sizes::of(&model.arch).ok_or_else(|| {
        Error::Unsupported(format!(
            "{}: GGUF files hold Llama-layout decoders (RoPE over whole heads, RMSNorm, SwiGLU, no biases but Qwen2's on q, k and v, per-head q/k norms only as Qwen3's), which this {} is not",
            path.display(),
            model.info().architecture
        ))
    })?;
    let (arch_name, family) = match (sizes.qkv_bias, sizes.qk_norm) {
        (true, false) => ("qwen2", "Qwen2ForCausalLM"),
        (false, true) => ("qwen3", "Qwen3ForCausalLM"),
        (false, false) => ("llama", "LlamaForCausalLM"),
        (true, true) => {
            return Err(Error::Unsupported(format!(
                "{}: biases on q, k and v beside per-head q/k norms: no GGUF architecture has both",
                path.display()
            )))
        }
    };
    let family = Family::reading(family).expect("a family reads llama and the qwens");
    let hf = names::export(&model.weights, &family.locator(&model.arch))?;
    let mut tensors: Vec<(String, Tensor, GgmlType)> = Vec::with_capacity(hf.len());
    for (hf_name, t) in hf {
        let (gguf, rotated) = gguf_name(&hf_name).ok_or_else(|| {
            Error::invalid(
                hf_name.as_str(),
                "a tensor with no GGUF name in Llama's layout",
            )
        })?;
        let t = match (rotated, arch_name) {
            (Some(_), "llama") => permute_rows(&t, sizes.head_dim, &gguf)?,
            _ => t,
        };
        let stored = stored_type(&gguf, &t, ty);
        tensors.push((gguf, t, stored));
    }
    let infos: Vec<(String, Vec<usize>, GgmlType)> = tensors
        .iter()
        .map(|(n, t, ty)| (n.clone(), t.shape().to_vec(), *ty))
        .collect();
    let mut metadata = model_metadata(arch_name, name, &sizes, file_type);
    let special = model.special_tokens();
    let ids = [
        ("tokenizer.ggml.bos_token_id", special.bos),
        ("tokenizer.ggml.eos_token_id", special.eos.first().copied()),
        ("tokenizer.ggml.padding_token_id", special.pad),
    ];
    for (key, id) in ids {
        if let Some(id) = id.filter(|_| !vocab.iter().any(|(k, _)| k == key)) {
            metadata.push((key.to_string(), Value::U32(id as u32)));
        }
    }
    metadata.extend(vocab);
    gguf::write(path, &metadata, &infos, &mut |i| {
        let (name, t, ty) = &tensors[i];
        Ok(OutTensor {
            name: name.clone(),
            shape: t.shape().to_vec(),
            ty: *ty,
            bytes: encode(*ty, t.data(), name)?,
        })
    })
}

/// The type tensor `name` is stored in when the weights are `ty`: F32 for a vector
/// (norms, biases); F16 for a weight whose rows are not whole blocks of a quantized
/// `ty`, as llama.cpp's converter falls back; with Q4_0, the token table and the head
/// in Q8_0 (llama.cpp's quantizer keeps them at more bits too).
fn stored_type(name: &str, t: &Tensor, ty: GgmlType) -> GgmlType {
    if t.rank() < 2 {
        return GgmlType::F32;
    }
    let ty = match (ty, name) {
        (GgmlType::Q4_0, "token_embd.weight" | "output.weight") => GgmlType::Q8_0,
        _ => ty,
    };
    match t.last_dim().is_multiple_of(ty.block) {
        true => ty,
        false => GgmlType::F16,
    }
}

/// llama.cpp's converter's metadata for a Llama-layout model.
fn model_metadata(arch: &str, name: &str, s: &Sizes, file_type: u32) -> Vec<(String, Value)> {
    let key = |k: &str| format!("{arch}.{k}");
    let size = |n: usize| Value::U32(n as u32);
    vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(name.into())),
        ("general.file_type".into(), Value::U32(file_type)),
        (key("block_count"), size(s.layers)),
        (key("context_length"), size(s.max_len)),
        (key("embedding_length"), size(s.d_model)),
        (key("feed_forward_length"), size(s.ffn_dim)),
        (key("attention.head_count"), size(s.heads)),
        (key("attention.head_count_kv"), size(s.kv_heads)),
        (key("rope.freq_base"), Value::F32(s.theta)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(s.eps)),
        (key("rope.dimension_count"), size(s.head_dim)),
        (key("attention.key_length"), size(s.head_dim)),
        (key("attention.value_length"), size(s.head_dim)),
        (key("vocab_size"), size(s.vocab)),
    ]
}

/// Q or K in llama.cpp's interleaved row order: stored row `permuted_row(r)` holds
/// Hugging Face's row r, within heads of `head_dim` rows.
fn permute_rows(t: &Tensor, head_dim: usize, name: &str) -> Result<Tensor> {
    let rows = t.shape()[0];
    if !rows.is_multiple_of(head_dim) || !head_dim.is_multiple_of(2) {
        return Err(Error::shape(
            name,
            "[heads × an even head width, columns]",
            t.shape(),
        ));
    }
    let c = t.numel() / rows;
    let mut out = vec![0.0; t.numel()];
    for (r, row) in t.data().chunks_exact(c).enumerate() {
        out[permuted_row(r, head_dim) * c..][..c].copy_from_slice(row);
    }
    Tensor::new(t.shape(), out)
}
