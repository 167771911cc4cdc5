//! A model written as a GGUF file that llama.cpp loads: a Llama-layout decoder (a
//! Hugging Face Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 or Phi-3 folder,
//! or one `qkv train` made in Llama's layout) as the architecture of that name, with
//! llama.cpp's tensor names, Q and K of `llama` permuted and Gemma's norms as 1 + w as
//! its converter stores them, and the metadata its converter writes. Weights (2-D) are
//! stored in the type asked for, norms and biases in F32, as llama.cpp's converter and
//! quantizer store them.
//!
//! A model is written only when llama.cpp reads the file back as the same model: the
//! metadata about to be written is read as the reader reads it (`meta.rs`, llama.cpp's
//! rules and defaults), and any difference is refused, naming the field. Two things the
//! converter loses are kept another way: Gemma 2's and 3's `query_pre_attn_scalar`, which
//! llama.cpp does not read (it derives the scale from the sizes), is multiplied into Q's
//! weights (or Gemma 3's Q norm) when it differs; and local and global layers that
//! differ from llama.cpp's default period are written as a flag per layer
//! (`attention.sliding_window_pattern`, which llama.cpp reads).

use std::path::Path;

use serde_json::Value as Json;

use super::encode::encode;
use super::meta::{pattern_layers, Kind, Meta, RopeFactors};
use super::view::{gguf_name, offset_norm, permuted_row};
use crate::error::{Error, Result};
use crate::io::gguf::{self, Array, GgmlType, Header, OutTensor, TensorInfo, Value, ValueType};
use crate::models::families::names;
use crate::models::net::arch::{Arch, ModelKind, Position};
use crate::models::transformer::Transformer;
use crate::position::RopeScaling;
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

/// What GGUF holds, for the errors.
const HOLDS: &str = "GGUF files hold Llama-layout decoders (llama, qwen2, qwen3, gemma, gemma2, gemma3 and phi3, as llama.cpp reads them)";

/// The GGUF architecture `model` is written as: its family's when that is one (Gemma's,
/// Phi-3's, the Qwens'), else `llama`, or the Qwen whose parts it has (biases on q, k
/// and v; per-head q/k norms).
fn kind_of(model: &Transformer) -> Kind {
    let family = model.family.architecture();
    if let Some(kind) = Kind::ALL.into_iter().find(|k| k.architecture() == family) {
        return kind;
    }
    match (model.arch.attention.qkv_bias, model.arch.attention.qk_norm) {
        (true, _) => Kind::Qwen2,
        (false, true) => Kind::Qwen3,
        (false, false) => Kind::Llama,
    }
}

/// Writes `model` as the GGUF file `path` with its weights in `ty` (F32, F16, BF16,
/// Q8_0 or Q4_0), named `name`, with `vocab` (the tokenizer's metadata, from
/// [`crate::text::folder_gguf_metadata`]) when given. Returns notes on what was
/// written otherwise than llama.cpp's converter writes it, or what llama.cpp does not
/// apply (for the caller to show).
pub fn save_gguf(
    model: &Transformer,
    path: &Path,
    ty: GgmlType,
    name: &str,
    vocab: Vec<(String, Value)>,
) -> Result<Vec<String>> {
    model.expect_f32_weights(&format!("write {}", path.display()))?;
    let file_type = file_type(ty).ok_or_else(|| {
        Error::Unsupported(format!(
            "GGUF weights in {ty} (qkv writes F32, F16, BF16, Q8_0 and Q4_0)"
        ))
    })?;
    let arch = &model.arch;
    let architecture = &model.info().architecture;
    let rope = matches!(
        arch.position,
        Position::Rope {
            max_len: Some(_),
            ..
        }
    );
    if arch.kind() != ModelKind::Decoder || !rope {
        return Err(Error::Unsupported(format!(
            "{}: {HOLDS}, which this {architecture} is not",
            path.display()
        )));
    }
    let kind = kind_of(model);
    let family = kind.family();
    let stack = arch.stack();
    let mut notes = Vec::new();

    // the score scale llama.cpp applies, and the factor that brings the model's to it
    let theirs = kind.scale(stack.layers, arch.d_model, stack.heads, stack.head_dim);
    let fold = (arch.attention.scale != theirs).then(|| {
        let effective = |s: Option<f32>| s.map_or((stack.head_dim as f64).powf(-0.5), f64::from);
        (effective(arch.attention.scale) / effective(theirs)) as f32
    });
    let folded_into = match arch.attention.qk_norm {
        true => "attn_q_norm",
        false => "attn_q",
    };
    if let Some(f) = fold {
        notes.push(format!(
            "{}: llama.cpp scales a `{}` model's scores by {} for its sizes, this one's by {}: Q's weights (`{folded_into}`) are multiplied by {f} so that it computes the same",
            path.display(),
            kind.name(),
            theirs.map_or_else(|| format!("1/√{}", stack.head_dim), |s| s.to_string()),
            arch.attention.scale.map_or_else(|| format!("1/√{}", stack.head_dim), |s| s.to_string()),
        ));
    }

    let factors = match (&arch.position, kind) {
        (
            Position::Rope {
                scaling: RopeScaling::LongRope(l),
                ..
            },
            Kind::Phi3,
        ) => Some(RopeFactors {
            long: l.long_factor.clone(),
            short: l.short_factor.clone(),
            tensor: "rope_factors_long.weight",
        }),
        _ => None,
    };
    let mut tensors: Vec<(String, Tensor, GgmlType)> = Vec::new();
    if let Some(f) = &factors {
        // first, as the converter's generated tensors come
        for (n, v) in [
            ("rope_factors_long.weight", &f.long),
            ("rope_factors_short.weight", &f.short),
        ] {
            tensors.push((n.into(), Tensor::new(&[v.len()], v.clone())?, GgmlType::F32));
        }
    }
    let hf = names::export(&model.weights, &family.locator(arch))?;
    for (hf_name, t) in hf {
        let (gguf, rotated) = gguf_name(kind, &hf_name).ok_or_else(|| {
            Error::invalid(
                hf_name.as_str(),
                format!("a tensor with no GGUF name in a `{}` file", kind.name()),
            )
        })?;
        let mut t = match rotated {
            Some(_) => permute_rows(&t, stack.head_dim, &gguf)?,
            None => t,
        };
        let is_q = gguf.ends_with(&format!("{folded_into}.weight"))
            || (folded_into == "attn_q" && gguf.ends_with("attn_q.bias"));
        let offset = offset_norm(kind, &gguf);
        if offset || (is_q && fold.is_some()) {
            let f = if is_q { fold.unwrap_or(1.0) } else { 1.0 };
            t.data_mut().iter_mut().for_each(|w| {
                let v = if offset { 1.0 + *w } else { *w };
                *w = if is_q && fold.is_some() { v * f } else { v };
            });
        }
        let stored = stored_type(&gguf, &t, ty);
        tensors.push((gguf, t, stored));
    }
    let infos: Vec<(String, Vec<usize>, GgmlType)> = tensors
        .iter()
        .map(|(n, t, ty)| (n.clone(), t.shape().to_vec(), *ty))
        .collect();
    let mut metadata = model_metadata(kind, name, arch, file_type);

    // what llama.cpp reads back from this metadata and these tensors
    let header = Header {
        version: 3,
        alignment: 32,
        metadata: metadata.clone(),
        tensors: infos
            .iter()
            .map(|(n, shape, ty)| TensorInfo {
                name: n.clone(),
                dims: shape.iter().rev().copied().collect(),
                ty: *ty,
                offset: 0,
                size: 0,
            })
            .collect(),
        data_start: 0,
    };
    let shown = path.display().to_string();
    let tied = header.tensor("output.weight").is_none() || kind.head_is_table();
    let back = Meta {
        h: &header,
        path: &shown,
    }
    .arch(kind, tied, factors.as_ref())?;
    let mut want = arch.clone();
    want.embed.padding_idx = back.embed.padding_idx;
    if fold.is_some() {
        want.attention.scale = back.attention.scale;
    }
    if let (Kind::Phi3, Some(w)) = (kind, arch.attention.window) {
        // the converter writes it; llama.cpp does not apply it
        want.attention.window = None;
        notes.push(format!(
            "{}: the sliding window of {w} is written as llama.cpp's converter writes it, but llama.cpp runs Phi-3 without one (as if every position were within it)",
            path.display()
        ));
    }
    if back != want {
        let (field, here, there) = first_difference(&json(&want), &json(&back), "")
            .unwrap_or_else(|| ("the architecture".into(), Json::Null, Json::Null));
        return Err(Error::Unsupported(format!(
            "{shown}: {HOLDS}; written as `{}`, this {architecture} would read back otherwise: `{field}` is {here} here, {there} as llama.cpp reads the file",
            kind.name()
        )));
    }

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
    })?;
    Ok(notes)
}

fn json(arch: &Arch) -> Json {
    serde_json::to_value(arch).expect("an architecture serialises")
}

/// The first field where `a` and `b` differ (a dotted path from `at`), and the two
/// values there.
fn first_difference(a: &Json, b: &Json, at: &str) -> Option<(String, Json, Json)> {
    let join = |k: &str| match at {
        "" => k.to_string(),
        _ => format!("{at}.{k}"),
    };
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let (u, v) = (
                    x.get(k).unwrap_or(&Json::Null),
                    y.get(k).unwrap_or(&Json::Null),
                );
                if let Some(d) = first_difference(u, v, &join(k)) {
                    return Some(d);
                }
            }
            None
        }
        _ if a == b => None,
        _ => Some((at.to_string(), a.clone(), b.clone())),
    }
}

/// The type tensor `name` is stored in when the weights are `ty`: F32 for a vector
/// (norms, biases, RoPE factors); F16 for a weight whose rows are not whole blocks of a
/// quantized `ty`, as llama.cpp's converter falls back; with Q4_0, the token table and
/// the head in Q8_0 (llama.cpp's quantizer keeps them at more bits too).
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

/// llama.cpp's converter's metadata for `arch` as a `kind` file, and the keys llama.cpp
/// reads where the converter loses what the model holds (Gemma's local layers when they
/// are not llama.cpp's default period, the RoPE base of Gemma 2 and Gemma's).
fn model_metadata(kind: Kind, name: &str, arch: &Arch, file_type: u32) -> Vec<(String, Value)> {
    let a = kind.name();
    let key = |k: &str| format!("{a}.{k}");
    let size = |n: usize| Value::U32(n as u32);
    let s = arch.stack();
    let Position::Rope {
        theta,
        ref scaling,
        max_len,
        rotary_dim,
    } = arch.position
    else {
        unreachable!("checked by the caller: RoPE")
    };
    let mut out = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name.into())),
        ("general.file_type".into(), Value::U32(file_type)),
        ("general.quantization_version".into(), Value::U32(2)),
        (key("block_count"), size(s.layers)),
        (key("context_length"), size(max_len.unwrap_or(0))),
        (key("embedding_length"), size(arch.d_model)),
        (key("feed_forward_length"), size(s.ffn_dim)),
        (key("attention.head_count"), size(s.heads)),
        (key("attention.head_count_kv"), size(s.kv_heads)),
        (key("rope.freq_base"), Value::F32(theta)),
        (
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(arch.norm.eps),
        ),
        (
            key("rope.dimension_count"),
            size(rotary_dim.unwrap_or(s.head_dim)),
        ),
        (key("attention.key_length"), size(s.head_dim)),
        (key("attention.value_length"), size(s.head_dim)),
        (key("vocab_size"), size(arch.vocab)),
    ];
    match scaling {
        RopeScaling::Linear { factor } => {
            out.push((key("rope.scaling.type"), Value::String("linear".into())));
            out.push((key("rope.scaling.factor"), Value::F32(*factor)));
        }
        // the factors are tensors; the converter writes no type
        RopeScaling::LongRope(l) if kind == Kind::Phi3 => {
            out.push((
                key("rope.scaling.attn_factor"),
                Value::F32(l.attention_factor),
            ));
            out.push((
                key("rope.scaling.original_context_length"),
                size(l.original_max),
            ));
        }
        // nothing llama.cpp reads: the reading back refuses it
        _ => {}
    }
    let at = &arch.attention;
    let local = at.local_layers.clone().unwrap_or_default();
    let any_local = local.contains(&true);
    let pattern = |out: &mut Vec<(String, Value)>| {
        let default = kind.default_pattern().expect("a kind with local layers");
        if !local.is_empty() && local != pattern_layers(default, s.layers) {
            let flags = local.iter().map(|&b| Value::Bool(b));
            out.push((
                key("attention.sliding_window_pattern"),
                Value::Array(Array::from_values(ValueType::Bool, flags)),
            ));
        }
    };
    match kind {
        Kind::Gemma2 => {
            if let Some(c) = at.softcap {
                out.push((key("attn_logit_softcapping"), Value::F32(c)));
            }
            if let Some(c) = arch.logit_softcap {
                out.push((key("final_logit_softcapping"), Value::F32(c)));
            }
            if let Some(w) = at.window {
                out.push((key("attention.sliding_window"), size(w)));
            }
            pattern(&mut out);
            if let Some(b) = at.local_rope_theta {
                out.push((key("rope.freq_base_swa"), Value::F32(b)));
            }
        }
        Kind::Gemma3 => {
            if let Some(c) = arch.logit_softcap {
                out.push((key("final_logit_softcapping"), Value::F32(c)));
            }
            if let (true, Some(w)) = (any_local, at.window) {
                out.push((key("attention.sliding_window"), size(w)));
                pattern(&mut out);
            }
            if let Some(b) = at.local_rope_theta {
                out.push((key("rope.freq_base_swa"), Value::F32(b)));
            }
        }
        Kind::Phi3 => out.push((
            key("attention.sliding_window"),
            size(at.window.unwrap_or(0)),
        )),
        _ => {}
    }
    out
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
