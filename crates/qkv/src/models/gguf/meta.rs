//! A GGUF file's metadata read as a model's architecture, as llama.cpp reads it, each
//! error naming the file and the key; and the architectures qkv reads and writes.

use crate::block::Residual;
use crate::error::{Error, Result};
use crate::io::gguf::{Header, Value};
use crate::models::families::Family;
use crate::models::net::arch::{Arch, Head, Position};
use crate::ops::Activation;
use crate::position::rope_scaling::LongRopeScaling;
use crate::position::RopeScaling;

/// A GGUF architecture (`general.architecture`) qkv reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Llama,
    Qwen2,
    Qwen3,
    Gemma,
    Gemma2,
    Gemma3,
    Phi3,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Llama,
        Kind::Qwen2,
        Kind::Qwen3,
        Kind::Gemma,
        Kind::Gemma2,
        Kind::Gemma3,
        Kind::Phi3,
    ];

    /// llama.cpp's name of it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Llama => "llama",
            Kind::Qwen2 => "qwen2",
            Kind::Qwen3 => "qwen3",
            Kind::Gemma => "gemma",
            Kind::Gemma2 => "gemma2",
            Kind::Gemma3 => "gemma3",
            Kind::Phi3 => "phi3",
        }
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The family whose files these are (its file in `families/` names the GGUF
    /// architecture), which reads and writes their tensors.
    pub fn family(self) -> Family {
        Family::in_gguf(self.name()).expect("a family names each GGUF kind")
    }

    /// The Hugging Face architecture a folder of it is saved as.
    pub fn architecture(self) -> &'static str {
        self.family().architecture()
    }

    /// The names qkv reads, for an error.
    pub fn names() -> String {
        Kind::ALL.map(Kind::name).join(", ")
    }

    /// llama.cpp's converter permutes Q's and K's rows for its interleaved RoPE (the
    /// others rotate the halves, as Hugging Face does).
    pub fn permuted(self) -> bool {
        self == Kind::Llama
    }

    /// Norms scale by 1 + w, and the converter stores 1 + w (Gemma's RMSNorm).
    pub fn unit_offset(self) -> bool {
        matches!(self, Kind::Gemma | Kind::Gemma2 | Kind::Gemma3)
    }

    /// llama.cpp's head is the token table, whatever else the file holds.
    pub fn head_is_table(self) -> bool {
        matches!(self, Kind::Gemma | Kind::Gemma2)
    }

    /// Layers of the one size llama.cpp scales the scores of by (C/H)^−½ rather than
    /// D^−½ (Gemma 2 and 3's 27B, whose `query_pre_attn_scalar` is C/H).
    fn wide_scale_layers(self) -> Option<usize> {
        match self {
            Kind::Gemma2 => Some(46),
            Kind::Gemma3 => Some(62),
            _ => None,
        }
    }

    /// The score scale llama.cpp uses for a model of these sizes: Gemma 2's and 3's
    /// (from the sizes alone: the converter writes no `query_pre_attn_scalar`), else
    /// D^−½ (`None`).
    pub fn scale(
        self,
        layers: usize,
        d_model: usize,
        heads: usize,
        head_dim: usize,
    ) -> Option<f32> {
        let by = match self.wide_scale_layers() {
            Some(wide) if wide == layers => d_model / heads,
            Some(_) => head_dim,
            None => return None,
        };
        Some((by as f64).powf(-0.5) as f32)
    }

    /// llama.cpp's period of local and global layers when the file gives none: a
    /// layer l is local when `l % n < n − 1`.
    pub fn default_pattern(self) -> Option<usize> {
        match self {
            Kind::Gemma2 => Some(2),
            Kind::Gemma3 => Some(6),
            _ => None,
        }
    }
}

/// Which of `layers` layers are local for llama.cpp's period `n` (0: every layer).
pub(super) fn pattern_layers(n: usize, layers: usize) -> Vec<bool> {
    (0..layers).map(|l| n == 0 || l % n < n - 1).collect()
}

/// Phi-3's LongRoPE factors, from the tensors `rope_factors_long` and
/// `rope_factors_short` (or Llama 3's `rope_freqs`, the same for both).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RopeFactors {
    pub long: Vec<f32>,
    pub short: Vec<f32>,
    /// the tensor they came from, for an error
    pub tensor: &'static str,
}

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

    fn unsupported(&self, key: &str, what: impl std::fmt::Display) -> Error {
        Error::Unsupported(format!("{}: {what} (`{key}`)", self.path))
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

    /// A whole number ≥ 0, or `None` when absent.
    fn opt_count(&self, key: &str) -> Result<Option<usize>> {
        match self.h.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= u32::MAX as u64 => Ok(Some(n as usize)),
                _ => Err(self.error(key, format!("{v:?} is not a whole number"))),
            },
        }
    }

    fn number(&self, key: &str, default: f64) -> Result<f64> {
        Ok(self.opt_number(key)?.unwrap_or(default))
    }

    /// A finite number > 0, or `None` when absent.
    fn opt_number(&self, key: &str) -> Result<Option<f64>> {
        match self.h.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| self.error(key, format!("{v:?} is not a positive number"))),
        }
    }

    /// A finite number ≥ 0, or `None` when absent.
    fn opt_nonnegative(&self, key: &str) -> Result<Option<f64>> {
        match self.h.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(Some)
                .ok_or_else(|| self.error(key, format!("{v:?} is not a number ≥ 0"))),
        }
    }

    /// The architecture of a `kind` file (keys prefixed by its name), as llama.cpp
    /// reads it: Llama's layout with the sizes, RoPE and norm epsilon the file gives, and
    /// each kind's own parts (Qwen2's biases on q, k and v; Qwen3's per-head norms;
    /// Gemma's norms scaling by 1 + w, √C embeddings and GeGLU, Gemma 2's and 3's norms
    /// around each sub-layer, soft caps, local layers and score scale; Phi-3's partial
    /// rotary and LongRoPE from `factors`). `tied`: the head is the token table (which the
    /// caller decides: no `output.weight`, or a kind whose head always is).
    pub fn arch(&self, kind: Kind, tied: bool, factors: Option<&RopeFactors>) -> Result<Arch> {
        let a = kind.name();
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
        let rotary_key = key("rope.dimension_count");
        let rotary = self.opt_size(&rotary_key)?.unwrap_or(head_dim);
        if kind == Kind::Llama && rotary != head_dim {
            // llama.cpp refuses it too: its `llama` rotates interleaved pairs of whole heads
            return Err(self.unsupported(
                &rotary_key,
                format!("RoPE over {rotary} of {head_dim} dimensions per head of a `llama` file"),
            ));
        }
        if rotary > head_dim || !rotary.is_multiple_of(2) {
            return Err(self.error(
                &rotary_key,
                format!("{rotary}: RoPE rotates pairs within a head of {head_dim}"),
            ));
        }
        let theta = self.number(&key("rope.freq_base"), 10_000.0)? as f32;
        let scaling = self.scaling(a, max_len, rotary, factors)?;
        let mut arch = Sizes {
            vocab,
            d_model,
            layers,
            heads,
            kv_heads,
            max_len,
            head_dim,
            ffn_dim: self.size(&key("feed_forward_length"))?,
            eps: self.number(&key("attention.layer_norm_rms_epsilon"), 1e-5)? as f32,
            theta,
            qkv_bias: kind == Kind::Qwen2,
            qk_norm: matches!(kind, Kind::Qwen3 | Kind::Gemma3),
            tied,
        }
        .arch();
        arch.position = Position::Rope {
            theta,
            scaling,
            max_len: Some(max_len),
            rotary_dim: (rotary < head_dim).then_some(rotary),
        };
        if kind.unit_offset() {
            self.gemma(kind, &mut arch)?;
        }
        arch.validate().map_err(|e| Error::Gguf {
            path: self.path.to_string(),
            reason: format!("the architecture its metadata gives: {e}"),
        })?;
        Ok(arch)
    }

    /// The RoPE scaling of an `a` file as llama.cpp applies it: a linear factor
    /// (`rope.scaling.factor`, or the older `rope.scale_linear`) unless the type is
    /// `none`; LongRoPE when the file holds frequency factors, with
    /// `rope.scaling.attn_factor` and `rope.scaling.original_context_length`. Other
    /// types are refused by name.
    fn scaling(
        &self,
        a: &str,
        max_len: usize,
        rotary: usize,
        factors: Option<&RopeFactors>,
    ) -> Result<RopeScaling> {
        let key = |k: &str| format!("{a}.{k}");
        let type_key = key("rope.scaling.type");
        let kind = match self.h.get(&type_key) {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or_else(|| self.error(&type_key, format!("{v:?} is not a string")))?,
            ),
        };
        let factor_key = [key("rope.scaling.factor"), key("rope.scale_linear")]
            .into_iter()
            .find(|k| self.h.get(k).is_some());
        let factor = match &factor_key {
            Some(k) => self.opt_nonnegative(k)?.filter(|&f| f != 0.0 && f != 1.0),
            None => None,
        };
        let attn_key = key("rope.scaling.attn_factor");
        let attention_factor = self.opt_number(&attn_key)?;
        let scaling = match (kind, factors) {
            (Some("none"), None) => RopeScaling::None,
            (None | Some("linear"), None) => match factor {
                Some(f) => RopeScaling::Linear { factor: f as f32 },
                None => RopeScaling::None,
            },
            (None | Some("longrope" | "linear"), Some(f)) => {
                if let (Some(k), Some(_)) = (&factor_key, factor) {
                    return Err(self.unsupported(
                        k,
                        format!(
                            "a linear RoPE factor beside the frequency factors of `{}`",
                            f.tensor
                        ),
                    ));
                }
                for (what, v) in [("long", &f.long), ("short", &f.short)] {
                    if v.len() != rotary / 2 {
                        return Err(Error::Gguf {
                            path: self.path.to_string(),
                            reason: format!(
                                "{} {what} RoPE factors (`{}`) for {rotary} rotating dimensions: one a pair, {}",
                                v.len(),
                                f.tensor,
                                rotary / 2
                            ),
                        });
                    }
                    if let Some(bad) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                        return Err(Error::Gguf {
                            path: self.path.to_string(),
                            reason: format!("tensor `{}`: a RoPE factor of {bad}", f.tensor),
                        });
                    }
                }
                let original_max = self
                    .opt_size(&key("rope.scaling.original_context_length"))?
                    .unwrap_or(max_len);
                return Ok(RopeScaling::LongRope(LongRopeScaling {
                    short_factor: f.short.clone(),
                    long_factor: f.long.clone(),
                    original_max,
                    attention_factor: attention_factor.unwrap_or(1.0) as f32,
                }));
            }
            (Some("longrope"), None) => RopeScaling::None,
            (Some(other), _) => {
                return Err(self.unsupported(&type_key, format!("RoPE scaling `{other}`")))
            }
        };
        // llama.cpp multiplies cos and sin by it whatever the scaling
        if attention_factor.is_some_and(|f| f != 1.0) {
            return Err(self.unsupported(
                &attn_key,
                "an attention factor without LongRoPE's frequency factors",
            ));
        }
        Ok(scaling)
    }

    /// Gemma's parts as llama.cpp's `gemma`, `gemma2` and `gemma3` read them (see
    /// [`Meta::arch`]).
    fn gemma(&self, kind: Kind, arch: &mut Arch) -> Result<()> {
        let a = kind.name();
        let key = |k: &str| format!("{a}.{k}");
        arch.norm.unit_offset = true;
        arch.embed.scale = true;
        arch.ffn.activation = Activation::GeluTanh;
        if kind == Kind::Gemma {
            return Ok(());
        }
        let stack = arch.stack();
        arch.residual = Residual::Sandwich;
        arch.attention.scale = kind.scale(stack.layers, arch.d_model, stack.heads, stack.head_dim);
        let theta = match arch.position {
            Position::Rope { theta, .. } => theta,
            _ => unreachable!("built with RoPE"),
        };
        let scaled = !matches!(
            arch.position,
            Position::Rope {
                scaling: RopeScaling::None,
                ..
            }
        );
        let window_key = key("attention.sliding_window");
        let swa_key = key("rope.freq_base_swa");
        if kind == Kind::Gemma2 {
            arch.attention.softcap =
                Some(self.number(&key("attn_logit_softcapping"), 50.0)? as f32);
            arch.logit_softcap = Some(self.number(&key("final_logit_softcapping"), 30.0)? as f32);
            let window = self.opt_size(&window_key)?.unwrap_or(4096);
            let local = self.local_layers(kind, stack.layers)?;
            arch.attention.window = local.contains(&true).then_some(window);
            arch.attention.local_layers = Some(local);
            // llama.cpp's local layers rotate with the global scaling and this base
            let base = self.opt_number(&swa_key)?.map(|b| b as f32);
            if let Some(b) = base.filter(|&b| b != theta) {
                if scaled {
                    return Err(self.unsupported(
                        &swa_key,
                        "a RoPE base of the local layers beside a RoPE scaling",
                    ));
                }
                arch.attention.local_rope_theta = Some(b);
            }
            return Ok(());
        }
        // Gemma 3
        arch.logit_softcap = self
            .opt_nonnegative(&key("final_logit_softcapping"))?
            .filter(|&c| c > 0.0)
            .map(|c| c as f32);
        let window = self.opt_count(&window_key)?.filter(|&w| w > 0);
        let local = match window {
            Some(_) => self.local_layers(kind, stack.layers)?,
            None => vec![false; stack.layers],
        };
        arch.attention.window = window.filter(|_| local.contains(&true));
        arch.attention.local_layers = Some(local);
        // llama.cpp's local layers rotate unscaled with this base (10 000 when absent)
        arch.attention.local_rope_theta = Some(self.number(&swa_key, 10_000.0)? as f32);
        Ok(())
    }

    /// Which layers are local: `attention.sliding_window_pattern` as a flag per layer
    /// (bools or integers), or a period n (a layer l is local when `l % n < n − 1`), or
    /// llama.cpp's period for `kind` when absent.
    fn local_layers(&self, kind: Kind, layers: usize) -> Result<Vec<bool>> {
        let key = format!("{}.attention.sliding_window_pattern", kind.name());
        let default = kind.default_pattern().expect("a kind with local layers");
        let Some(v) = self.h.get(&key) else {
            return Ok(pattern_layers(default, layers));
        };
        if let Some(items) = v.as_array() {
            if items.len() != layers {
                return Err(self.error(&key, format!("{} flags for {layers} layers", items.len())));
            }
            return items
                .iter()
                .map(|x| match x {
                    Value::Bool(b) => Ok(b),
                    x => match x.as_u64() {
                        Some(n) => Ok(n != 0),
                        None => Err(self.error(&key, format!("{x:?} is not a flag"))),
                    },
                })
                .collect();
        }
        match v.as_u64() {
            Some(n) if n <= u32::MAX as u64 => Ok(pattern_layers(n as usize, layers)),
            _ => Err(self.error(&key, format!("{v:?} is neither a period nor flags"))),
        }
    }
}

/// What a GGUF file's metadata says of a Llama-layout model: enough to build its
/// [`Arch`], which each kind then adjusts.
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
    /// per-head norms of q and k: `qwen3`, `gemma3`
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
}

#[cfg(test)]
mod tests {
    use super::Kind;

    /// Each GGUF architecture qkv reads is named by one family's file, whose folders
    /// are the Hugging Face architecture llama.cpp's converter reads for it.
    #[test]
    fn each_kind_is_named_by_one_family() {
        let want = [
            "LlamaForCausalLM",
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
            "GemmaForCausalLM",
            "Gemma2ForCausalLM",
            "Gemma3ForCausalLM",
            "Phi3ForCausalLM",
        ];
        for (kind, want) in Kind::ALL.into_iter().zip(want) {
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
            assert_eq!(kind.architecture(), want, "{kind:?}");
            assert_eq!(kind.family().def().gguf, Some(kind.name()));
        }
    }
}
