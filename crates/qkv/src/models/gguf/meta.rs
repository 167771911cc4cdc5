//! A GGUF file's metadata read as a model's architecture, each error naming the file
//! and the key.

use crate::error::{Error, Result};
use crate::io::gguf::{Header, Value};
use crate::models::net::arch::{Arch, Head, Position};
use crate::position::RopeScaling;

/// The metadata of one file, read with errors naming the file and the key.
pub(super) struct Meta<'a> {
    pub h: &'a Header,
    pub path: &'a str,
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

    pub fn string(&self, key: &str) -> Result<&str> {
        let v = self.value(key)?;
        v.as_str()
            .ok_or_else(|| self.error(key, format!("{v:?} is not a string")))
    }

    pub fn opt_u64(&self, key: &str) -> Option<u64> {
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

    /// The architecture of a `llama`, `qwen2` or `qwen3` file (keys prefixed by `a`):
    /// Llama's layout with the sizes, RoPE base and norm epsilon the file gives; Qwen2
    /// has biases on q, k and v, Qwen3 per-head norms of q and k.
    pub fn arch(&self, a: &str, tied: bool) -> Result<Arch> {
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
        let arch = Sizes {
            vocab,
            d_model,
            layers,
            heads,
            kv_heads,
            max_len,
            head_dim,
            ffn_dim: self.size(&key("feed_forward_length"))?,
            eps: self.number(&key("attention.layer_norm_rms_epsilon"), 1e-5)? as f32,
            theta: self.number(&key("rope.freq_base"), 10_000.0)? as f32,
            qkv_bias: a == "qwen2",
            qk_norm: a == "qwen3",
            tied,
        }
        .arch();
        arch.validate().map_err(|e| Error::Gguf {
            path: self.path.to_string(),
            reason: format!("the architecture its metadata gives: {e}"),
        })?;
        Ok(arch)
    }
}

/// What a `llama`, `qwen2` or `qwen3` file's metadata says of a model: enough to build its
/// [`Arch`] (Llama's layout), and what a model of that layout writes back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Sizes {
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub max_len: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub eps: f32,
    pub theta: f32,
    /// biases on q, k and v: `qwen2`
    pub qkv_bias: bool,
    /// per-head norms of q and k: `qwen3`
    pub qk_norm: bool,
    /// no `output.weight`: the head is the token table
    pub tied: bool,
}

impl Sizes {
    /// Llama's layout with these sizes (RoPE over whole heads, RMSNorm, SwiGLU).
    pub fn arch(&self) -> Arch {
        let mut arch = Arch::llama(
            self.vocab,
            self.d_model,
            self.layers,
            self.heads,
            self.kv_heads,
            self.max_len,
        );
        let stack = arch.decoder.as_mut().expect("a decoder");
        stack.head_dim = self.head_dim;
        stack.ffn_dim = self.ffn_dim;
        arch.norm.eps = self.eps;
        arch.position = Position::Rope {
            theta: self.theta,
            scaling: RopeScaling::None,
            max_len: Some(self.max_len),
            rotary_dim: None,
        };
        arch.attention.qkv_bias = self.qkv_bias;
        arch.attention.qk_norm = self.qk_norm;
        arch.head = Head::lm(self.tied);
        arch
    }

    /// The sizes of `arch` when it is exactly the layout a GGUF `llama`, `qwen2` or `qwen3` file
    /// describes (whatever its padding row), so that the file reads back as the same
    /// model; `None` otherwise.
    pub fn of(arch: &Arch) -> Option<Sizes> {
        let stack = arch.decoder?;
        let Position::Rope {
            theta,
            max_len: Some(max_len),
            ..
        } = arch.position
        else {
            return None;
        };
        let sizes = Sizes {
            vocab: arch.vocab,
            d_model: arch.d_model,
            layers: stack.layers,
            heads: stack.heads,
            kv_heads: stack.kv_heads,
            max_len,
            head_dim: stack.head_dim,
            ffn_dim: stack.ffn_dim,
            eps: arch.norm.eps,
            theta,
            qkv_bias: arch.attention.qkv_bias,
            qk_norm: arch.attention.qk_norm,
            tied: arch.head.tied(),
        };
        let mut built = sizes.arch();
        built.embed.padding_idx = arch.embed.padding_idx;
        (built == *arch).then_some(sizes)
    }
}
