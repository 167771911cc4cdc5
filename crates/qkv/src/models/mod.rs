//! Models: one [`Transformer`] built from one [`Arch`], for every family, for inference
//! and for training. A family file is only what is truly its own: reading `config.json`
//! into an [`Arch`], its tensor-name table, and its quirks.
//!
//! | family | architectures | what it exercises |
//! |---|---|---|
//! | [`bert`] | `BertModel`, `BertForMaskedLM`, … | encoder, learned positions, token types, post-norm, masked-LM head |
//! | [`gpt2`] | `GPT2LMHeadModel` | decoder-only, causal, learned positions, pre-norm, Conv1D weights |
//! | [`llama`] | `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM` | RoPE (and its scalings), RMSNorm, SwiGLU, GQA, sliding window, Q/K/V biases |
//! | [`bloom`] | `BloomForCausalLM` | ALiBi, fused per-head QKV, embedding LayerNorm |
//! | [`marian`] | `MarianMTModel` | the original encoder-decoder: sinusoidal, post-norm, cross-attention |
//! | [`t5`] | `T5ForConditionalGeneration` | relative position buckets, unscaled scores, gated FFN |
//! | qkv | `QkvTransformer` | any [`Arch`] no Hugging Face class has (ALiBi + post-norm, …) |

pub mod arch;
mod backward;
mod beam;
pub mod bert;
pub mod bloom;
mod footprint;
mod forward;
pub mod generate;
pub mod generation_config;
pub mod gpt2;
mod info;
pub mod llama;
pub mod marian;
mod names;
pub mod request;
pub mod sentence;
mod special;
pub mod t5;
mod transformer;
pub mod weights;

use std::path::Path;

use serde_json::{json, Map, Value};

pub use arch::{Arch, Head, ModelKind, Position, StackDims};
pub use backward::Tape;
pub use forward::Encoded;
pub use info::ModelInfo;
pub use names::Loc;
pub use special::SpecialTokens;
pub use transformer::{Attentions, Input, Output, Transformer};
pub use weights::{HeadWeights, Stack, Weights};

pub use crate::attention::{KvCache, LayerKv, Step};
pub use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::io::{read_config, Checkpoint};
use llama::Variant;

/// How a model is named and laid out on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Bert,
    Gpt2,
    Llama,
    Mistral,
    Qwen2,
    Bloom,
    Marian,
    T5,
    /// qkv's own folder: the [`Arch`] in `config.json`, tensors under qkv's names.
    Qkv,
}

/// `architectures[0]` of a qkv folder.
pub const NATIVE_ARCHITECTURE: &str = "QkvTransformer";

/// The architectures [`load`] accepts, for error messages and `--help`.
pub const SUPPORTED: &[&str] = &[
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "GPT2LMHeadModel",
    "GPT2Model",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "BloomForCausalLM",
    "MarianMTModel",
    "T5ForConditionalGeneration",
    NATIVE_ARCHITECTURE,
];

impl Family {
    /// `bert`, `gpt2`, `llama`, `mistral`, `qwen2`, `bloom`, `marian`, `t5`, `qkv`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Bloom => "bloom",
            Family::Marian => "marian",
            Family::T5 => "t5",
            Family::Qkv => "qkv",
        }
    }

    /// The architecture a folder of this family is saved as.
    fn architecture(self) -> &'static str {
        match self {
            Family::Bert => "BertForMaskedLM",
            Family::Gpt2 => "GPT2LMHeadModel",
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Bloom => "BloomForCausalLM",
            Family::Marian => "MarianMTModel",
            Family::T5 => "T5ForConditionalGeneration",
            Family::Qkv => NATIVE_ARCHITECTURE,
        }
    }

    /// The family a freshly built `arch` saves as: GPT-2 or Llama when it is exactly
    /// one, else qkv's own.
    fn of_fresh(arch: &Arch) -> Family {
        if gpt2::fits(arch) {
            Family::Gpt2
        } else if llama::fits(arch) {
            Family::Llama
        } else {
            Family::Qkv
        }
    }

    /// This family's name table for `arch` (see [`names::Name`]); qkv's own folders
    /// store every tensor under its path.
    fn names(self, arch: &Arch) -> Vec<names::Name> {
        match self {
            Family::Bert => bert::names(arch),
            Family::Gpt2 => gpt2::names(),
            Family::Llama | Family::Mistral | Family::Qwen2 => llama::names(),
            Family::Bloom => bloom::names(arch),
            Family::Marian => marian::names(arch),
            Family::T5 => t5::names(arch),
            Family::Qkv => Vec::new(),
        }
    }

    /// Where each parameter path lives in this family's checkpoints.
    fn locator(self, arch: &Arch) -> impl Fn(&str) -> Result<Loc> {
        let table = self.names(arch);
        move |path: &str| match self {
            Family::Qkv => Ok(Loc::Same(path.to_string())),
            f => names::locate(&table, f.name(), path),
        }
    }

    /// Other names a checkpoint may store the tensor `name` under: without the task
    /// model's prefix (checkpoints saved from the base model) or with it, and old
    /// spellings.
    fn aliases(self, name: &str) -> Vec<String> {
        let prefix = match self {
            Family::Gpt2 | Family::Bloom => "transformer.",
            Family::Llama | Family::Mistral | Family::Qwen2 | Family::Marian => "model.",
            Family::Bert => "bert.",
            Family::T5 | Family::Qkv => "",
        };
        let other = match name.strip_prefix(prefix) {
            _ if prefix.is_empty() => None,
            Some(bare) => Some(bare.to_string()),
            None => Some(format!("{prefix}{name}")),
        };
        let mut out: Vec<String> = other.into_iter().collect();
        // TensorFlow conversions of BERT name LayerNorm parameters gamma and beta
        if self == Family::Bert && name.contains("LayerNorm.") {
            let tf = |n: &str| n.replace(".weight", ".gamma").replace(".bias", ".beta");
            let tfs: Vec<String> = std::iter::once(name)
                .chain(out.iter().map(String::as_str))
                .map(tf)
                .collect();
            out.extend(tfs);
        }
        // older Marian checkpoints keep the shared table under the encoder
        if self == Family::Marian && name == "model.shared.weight" {
            out.extend([
                "model.encoder.embed_tokens.weight".into(),
                "encoder.embed_tokens.weight".into(),
            ]);
        }
        out
    }

    /// `config.json` for a model of this family built from scratch (GPT-2, Llama, qkv).
    fn config_json(self, arch: &Arch) -> Value {
        match self {
            Family::Gpt2 => gpt2::config_json(arch),
            Family::Llama => llama::config_json(arch),
            _ => json!({
                "architectures": [NATIVE_ARCHITECTURE],
                "model_type": "qkv",
                "qkv": arch,
            }),
        }
    }
}

/// Tensors checkpoints carry that no qkv output reads: causal-mask and RoPE buffers
/// saved by older transformers, position-id buffers, and BERT's pooler and
/// next-sentence head (they feed only `pooler_output` and pre-training losses).
fn needless(name: &str) -> bool {
    const ENDINGS: [&str; 4] = [
        ".attn.bias",
        ".attn.masked_bias",
        "rotary_emb.inv_freq",
        "position_ids",
    ];
    ENDINGS.iter().any(|e| name.ends_with(e))
        || name.contains("pooler.")
        || name.starts_with("cls.seq_relationship")
}

/// The checkpoint's tensors `used` leaves out, apart from [`needless`] ones. A tensor
/// of a layer beyond the config's layer count is an error: the config describes fewer
/// layers than were trained (`n_layer: 0`, say), and the model would run without them.
fn unused_tensors(
    dir: &Path,
    arch: &Arch,
    ckpt: &Checkpoint,
    used: &std::collections::HashSet<String>,
) -> Result<Vec<String>> {
    let mut unused: Vec<String> = ckpt
        .names()
        .filter(|n| !used.contains(*n) && !needless(n))
        .map(String::from)
        .collect();
    unused.sort();
    let layers = [arch.encoder, arch.decoder]
        .iter()
        .flatten()
        .map(|s| s.layers)
        .max()
        .unwrap_or(0);
    // the index after the families' layer list names: `h.3`, `layers.3`, `layer.3`,
    // `block.3` (T5's `block.3.layer.1` is block 3)
    let layer_of = |name: &str| {
        let parts: Vec<&str> = name.split('.').collect();
        parts.windows(2).find_map(|w| match w[0] {
            "h" | "layers" | "layer" | "block" | "blocks" => w[1].parse::<usize>().ok(),
            _ => None,
        })
    };
    if let Some(name) = unused
        .iter()
        .find(|n| layer_of(n).is_some_and(|l| l >= layers))
    {
        return Err(crate::io::bad_field(
            dir,
            "(layers)",
            format!(
                "the checkpoint holds `{name}`, a weight of layer {}, but config.json has {layers} layers",
                layer_of(name).unwrap_or(0)
            ),
        ));
    }
    Ok(unused)
}

/// Refuses a config whose sizes describe far more parameters than the checkpoint
/// stores, before any is allocated: every parameter is read from the checkpoint, so a
/// larger model cannot be right, and its sizes (a `head_dim` of 2^40, say) could ask
/// for terabytes and abort the process.
fn check_size(dir: &Path, arch: &Arch, stored: usize) -> Result<()> {
    // Up to twice what is stored (plus 16 M values) is left to the loader, whose error
    // names the missing or misshapen tensor; a config far beyond is refused here.
    let count = Weights::count(arch);
    if count.is_some_and(|n| n <= stored.saturating_mul(2).saturating_add(1 << 24)) {
        return Ok(());
    }
    let first = arch.encoder.or(arch.decoder).expect("validated: a stack");
    let described = match count {
        Some(n) => format!("{n} parameters"),
        None => "more parameters than a machine can address".into(),
    };
    Err(crate::io::bad_field(
        dir,
        "(sizes)",
        format!(
            "the sizes describe {described} (hidden {}, {} layers, {} heads of width {}, FFN {}, vocabulary {}) but the checkpoint stores {stored} values: one of them does not match the weights",
            arch.d_model, first.layers, first.heads, first.head_dim, first.ffn_dim, arch.vocab
        ),
    ))
}

/// A float as JSON without f32 → f64 noise (1e-5, not 9.999999747378752e-6).
fn json_f32(x: f32) -> Value {
    let shortest: f64 = x.to_string().parse().expect("f32 Display parses as f64");
    json!(shortest)
}

#[derive(serde::Deserialize)]
struct ArchitectureOnly {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
}

#[derive(serde::Deserialize)]
struct Native {
    qkv: Arch,
    #[serde(flatten)]
    tokens: special::TokenIds,
}

/// A loaded model with what its checkpoint says about itself.
pub struct Loaded {
    pub model: Transformer,
    /// Elements stored in the checkpoint (a tied matrix counts once).
    pub parameters: usize,
    /// Dtypes on disk with their element counts.
    pub dtypes: Vec<(String, usize)>,
    /// Checkpoint tensors the model does not read (sorted), besides the buffers and
    /// heads no qkv output needs (see `unused_tensors`).
    pub unused: Vec<String>,
}

/// Loads the model in folder `dir` (a Hugging Face folder or one qkv saved),
/// dispatching on `architectures` (or `model_type`).
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
    let only: ArchitectureOnly = read_config(dir)?;
    let name = only
        .architectures
        .first()
        .cloned()
        .or_else(|| only.model_type.clone())
        .unwrap_or_default();
    let ckpt = Checkpoint::open(dir)?;
    let (family, (arch, tokens)) = match name.as_str() {
        "BertModel" | "BertForSequenceClassification" | "bert" => {
            (Family::Bert, bert::read(dir, false)?)
        }
        "BertForMaskedLM" => {
            let head = ckpt.has("cls.predictions.transform.dense.weight");
            (Family::Bert, bert::read(dir, head)?)
        }
        "GPT2LMHeadModel" | "GPT2Model" | "gpt2" => (Family::Gpt2, gpt2::read(dir)?),
        "LlamaForCausalLM" | "llama" => (Family::Llama, llama::read(dir, Variant::Llama)?),
        "MistralForCausalLM" | "mistral" => (Family::Mistral, llama::read(dir, Variant::Mistral)?),
        "Qwen2ForCausalLM" | "qwen2" => (Family::Qwen2, llama::read(dir, Variant::Qwen2)?),
        "BloomForCausalLM" | "bloom" => (Family::Bloom, bloom::read(dir)?),
        "MarianMTModel" | "marian" => (Family::Marian, marian::read(dir)?),
        "T5ForConditionalGeneration" | "t5" => (Family::T5, t5::read(dir, &ckpt)?),
        NATIVE_ARCHITECTURE | "qkv" => {
            let n: Native = read_config(dir)?;
            (Family::Qkv, (n.qkv, n.tokens))
        }
        other => {
            return Err(Error::Unsupported(format!(
                "architecture `{other}` in {}; supported: {}",
                dir.join("config.json").display(),
                SUPPORTED.join(", ")
            )))
        }
    };
    arch.validate()
        .map_err(|e| crate::io::bad_field(dir, "(architecture)", e.to_string()))?;
    let dtypes = ckpt.dtypes()?;
    check_size(dir, &arch, dtypes.iter().map(|(_, n)| n).sum())?;
    let (weights, logits_bias, used) = Transformer::read_weights(&ckpt, &arch, family)?;
    let unused = unused_tensors(dir, &arch, &ckpt, &used)?;
    let mut special = special::special_tokens(dir, tokens, arch.vocab)?;
    if family == Family::T5 {
        // Without a decoder start token, generation starts from BOS, as Hugging Face's
        // `generate` does.
        special.decoder_start = special.decoder_start.or(special.bos);
    }
    let source_config = match family {
        Family::Qkv => None,
        _ => Some(read_config::<Map<String, Value>>(dir)?),
    };
    let architecture = match (family, name.as_str()) {
        (Family::Qkv, _) => NATIVE_ARCHITECTURE.to_string(),
        (_, n) if !only.architectures.is_empty() => n.to_string(),
        (f, _) => f.architecture().to_string(),
    };
    let model = Transformer::from_parts(
        arch,
        family,
        special,
        weights,
        logits_bias,
        source_config,
        architecture,
    )?;
    Ok(Loaded {
        model,
        parameters: dtypes.iter().map(|(_, n)| n).sum(),
        dtypes,
        unused,
    })
}
