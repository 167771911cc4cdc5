//! Models from GGUF files (llama.cpp's format). The metadata gives the architecture
//! (`llama.block_count`, `llama.embedding_length`, …) and the tensors are read through
//! the family's own name table, seen under Hugging Face's names: `blk.0.attn_q.weight`
//! is `model.layers.0.self_attn.q_proj.weight`.
//!
//! llama.cpp's converter permutes the rows of Q and K of `llama` models for its
//! interleaved RoPE (within each head, rows i and D/2 + i become rows 2i and 2i + 1);
//! they are put back in Hugging Face's half-split order as they are read.
//!
//! Architectures: `llama` (Llama, Mistral, SmolLM) and `qwen2`. Tensors stored as F32,
//! F16 or BF16 load; quantized ones are refused by name for now.

use std::collections::HashSet;
use std::path::Path;

use super::families::special::SpecialTokens;
use super::families::Family;
use super::net::arch::{Arch, Head, Position};
use super::reading::{for_inference_in, read_weights, sizes_unlike, Loaded};
use super::transformer::Transformer;
use crate::error::{Error, Result};
use crate::io::gguf::{GgmlType, GgufFile, Header, Value};
use crate::io::TensorSource;
use crate::ops::DType;
use crate::position::RopeScaling;
use crate::tensor::Tensor;

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
    let (architecture, permuted) = match gguf_arch {
        "llama" => ("LlamaForCausalLM", true),
        "qwen2" => ("Qwen2ForCausalLM", false),
        other => {
            return Err(Error::Unsupported(format!(
                "{}: GGUF architecture `{other}` (qkv reads llama and qwen2)",
                file.path()
            )))
        }
    };
    let family = Family::reading(architecture).expect("a family reads llama and qwen2");
    let id = |key: &str| meta.opt_u64(key).map(|v| v as usize);
    let mut arch = meta.arch(gguf_arch, h.tensor("output.weight").is_none())?;
    // as transformers builds the embedding of a Llama-layout model (its padding row
    // gets no gradient)
    arch.embed.padding_idx = id("tokenizer.ggml.padding_token_id");
    if let Some(reason) = sizes_unlike(&arch, h.tensors.iter().map(|t| t.numel()).sum()) {
        return Err(Error::Gguf {
            path: file.path().to_string(),
            reason: format!("its metadata: {reason}"),
        });
    }
    let view = HfView::new(&file, &arch, permuted);
    let (weights, logits_bias, used) = read_weights(&view, &arch, family, dtype)?;
    let used: HashSet<String> = used
        .iter()
        .filter_map(|hf| view.locate(hf))
        .map(|(g, _)| g)
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
    let model = Transformer::from_parts(
        arch,
        family,
        special,
        weights,
        logits_bias,
        None,
        architecture.to_string(),
    )?;
    Ok(Loaded {
        model: for_inference_in(model, dtype)?,
        parameters: h.tensors.iter().map(|t| t.numel()).sum(),
        dtypes,
        unused,
    })
}

/// The metadata of one file, read with errors naming the file and the key.
struct Meta<'a> {
    h: &'a Header,
    path: &'a str,
}

impl Meta<'_> {
    fn error(&self, key: &str, reason: impl std::fmt::Display) -> Error {
        Error::Gguf {
            path: self.path.to_string(),
            reason: format!("metadata `{key}`: {reason}"),
        }
    }

    fn value(&self, key: &str) -> Result<&Value> {
        self.h.get(key).ok_or_else(|| self.error(key, "missing"))
    }

    fn string(&self, key: &str) -> Result<&str> {
        let v = self.value(key)?;
        v.as_str()
            .ok_or_else(|| self.error(key, format!("{v:?} is not a string")))
    }

    fn opt_u64(&self, key: &str) -> Option<u64> {
        self.h.get(key).and_then(Value::as_u64)
    }

    /// A size: a whole number ≥ 1.
    fn size(&self, key: &str) -> Result<usize> {
        let v = self.value(key)?;
        match v.as_u64() {
            Some(n) if n >= 1 && n <= u32::MAX as u64 => Ok(n as usize),
            _ => Err(self.error(key, format!("{v:?} is not a size"))),
        }
    }

    fn opt_size(&self, key: &str) -> Result<Option<usize>> {
        match self.h.get(key) {
            None => Ok(None),
            Some(_) => self.size(key).map(Some),
        }
    }

    fn number(&self, key: &str, default: f64) -> Result<f64> {
        match self.h.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| self.error(key, format!("{v:?} is not a positive number"))),
        }
    }

    /// The architecture of a `llama` or `qwen2` file (keys prefixed by `a`): Llama's
    /// layout with the sizes, RoPE base and norm epsilon the file gives; Qwen2 has
    /// biases on q, k and v.
    fn arch(&self, a: &str, tied: bool) -> Result<Arch> {
        let key = |k: &str| format!("{a}.{k}");
        let d_model = self.size(&key("embedding_length"))?;
        let layers = self.size(&key("block_count"))?;
        let heads = self.size(&key("attention.head_count"))?;
        let kv_heads = self
            .opt_size(&key("attention.head_count_kv"))?
            .unwrap_or(heads);
        let max_len = self.size(&key("context_length"))?;
        let vocab = match self.h.tensor("token_embd.weight") {
            Some(t) if t.dims.len() == 2 => t.dims[1],
            _ => {
                return Err(Error::Gguf {
                    path: self.path.to_string(),
                    reason: "no 2-dimensional tensor `token_embd.weight`".into(),
                })
            }
        };
        let mut arch = Arch::llama(vocab, d_model, layers, heads, kv_heads, max_len);
        let head_dim = self
            .opt_size(&key("attention.key_length"))?
            .unwrap_or(d_model / heads);
        let value_dim = self
            .opt_size(&key("attention.value_length"))?
            .unwrap_or(head_dim);
        if value_dim != head_dim {
            return Err(self.error(
                &key("attention.value_length"),
                format!("{value_dim}, unlike the key length {head_dim}"),
            ));
        }
        let rotary = self
            .opt_size(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        if rotary != head_dim {
            return Err(Error::Unsupported(format!(
                "{}: RoPE over {rotary} of {head_dim} dimensions per head (`{}`)",
                self.path,
                key("rope.dimension_count")
            )));
        }
        if let Some(v) = self.h.get(&key("rope.scaling.type")) {
            if v.as_str() != Some("none") {
                return Err(Error::Unsupported(format!(
                    "{}: RoPE scaling {v:?} (`{}`)",
                    self.path,
                    key("rope.scaling.type")
                )));
            }
        }
        let stack = arch.decoder.as_mut().expect("a decoder");
        stack.head_dim = head_dim;
        stack.ffn_dim = self.size(&key("feed_forward_length"))?;
        arch.norm.eps = self.number(&key("attention.layer_norm_rms_epsilon"), 1e-5)? as f32;
        arch.position = Position::Rope {
            theta: self.number(&key("rope.freq_base"), 10_000.0)? as f32,
            scaling: RopeScaling::None,
            max_len: Some(max_len),
        };
        arch.attention.qkv_bias = a == "qwen2";
        arch.head = Head::lm(tied);
        arch.validate().map_err(|e| Error::Gguf {
            path: self.path.to_string(),
            reason: format!("the architecture its metadata gives: {e}"),
        })?;
        Ok(arch)
    }
}

/// A GGUF file's tensors under the Hugging Face names of a Llama-layout model.
struct HfView<'f> {
    file: &'f GgufFile,
    /// Q's and K's heads when llama.cpp permuted their rows (weights and biases)
    permuted: Option<(usize, usize)>,
}

/// Hugging Face's name of a layer's tensor (after `model.layers.{l}.`) → llama.cpp's
/// (after `blk.{l}.`).
const LAYER_NAMES: [(&str, &str); 9] = [
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

impl<'f> HfView<'f> {
    fn new(file: &'f GgufFile, arch: &Arch, permuted: bool) -> Self {
        let stack = arch.stack();
        HfView {
            file,
            permuted: permuted.then_some((stack.heads, stack.kv_heads)),
        }
    }

    /// The GGUF name of the Hugging Face tensor `hf`, and the heads whose rows to put
    /// back when llama.cpp permuted them.
    fn locate(&self, hf: &str) -> Option<(String, Option<usize>)> {
        let whole = match hf {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(name) = whole {
            return Some((name.to_string(), None));
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let (module, part) = rest.rsplit_once('.')?;
        if !matches!(part, "weight" | "bias") || layer.parse::<usize>().is_err() {
            return None;
        }
        let (_, gguf) = LAYER_NAMES.iter().find(|(h, _)| *h == module)?;
        let heads = match (*gguf, self.permuted) {
            ("attn_q", Some((q, _))) => Some(q),
            ("attn_k", Some((_, k))) => Some(k),
            _ => None,
        };
        Some((format!("blk.{layer}.{gguf}.{part}"), heads))
    }
}

impl TensorSource for HfView<'_> {
    fn has(&self, name: &str) -> bool {
        self.locate(name)
            .is_some_and(|(g, _)| self.file.header.tensor(&g).is_some())
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        let (gguf, heads) = self.locate(name).ok_or_else(|| Error::Gguf {
            path: self.file.path().to_string(),
            reason: format!("no tensor stands for `{name}`"),
        })?;
        let gguf = gguf.as_str();
        let info = self.file.header.tensor(gguf).ok_or_else(|| Error::Gguf {
            path: self.file.path().to_string(),
            reason: format!("missing tensor `{gguf}`"),
        })?;
        if ![GgmlType::F32, GgmlType::F16, GgmlType::BF16].contains(&info.ty) {
            return Err(Error::Unsupported(format!(
                "{}: tensor `{gguf}` is {}; models load from F32, F16 and BF16 tensors (quantized blocks are not run yet)",
                self.file.path(),
                info.ty
            )));
        }
        let t = self.file.tensor(gguf)?;
        t.check_finite(gguf)?;
        match heads {
            Some(heads) => unpermute_rows(t, heads, gguf),
            None => Ok(t),
        }
    }
}

/// Undoes llama.cpp's permutation of a Q or K weight `[heads·D, C]` (or bias
/// `[heads·D]`): within each head, its row 2i + j (j = 0, 1) goes back to row
/// j·D/2 + i.
fn unpermute_rows(t: Tensor, heads: usize, name: &str) -> Result<Tensor> {
    let rows = t.shape()[0];
    if t.rank() > 2 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(Error::shape(
            name,
            format!("[{heads} heads × an even width, columns]"),
            t.shape(),
        ));
    }
    let (d, c) = (rows / heads, t.numel() / rows);
    let mut out = vec![0.0; t.numel()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for j in 0..2 {
                let from = h * d + 2 * i + j;
                let to = h * d + j * d / 2 + i;
                out[to * c..][..c].copy_from_slice(&t.data()[from * c..][..c]);
            }
        }
    }
    Tensor::new(t.shape(), out)
}
