//! [`DecoderLm`] folders on disk: Hugging Face `GPT2LMHeadModel` and `LlamaForCausalLM`
//! (read and written), and qkv's own `QkvDecoderLM` for every other configuration.
//!
//! Tensors are found by the names [`DecoderLm::visit_mut`] gives them, so the load
//! and save paths cannot disagree with the training path about names or order. The
//! only conversion is GPT-2's `Conv1D`, which stores `[in, out]`: its four weights
//! are transposed on the way in and out.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{DecoderLm, FfnKind, HfFamily, LmConfig, NormKind, PositionKind, Tree};
use crate::error::{Error, Result};
use crate::io::{bad_field, read_config, write_atomic, Checkpoint};
use crate::models::{gpt2, llama};
use crate::ops::Activation;
use crate::tensor::Tensor;

/// `architectures[0]` of a folder written for a configuration no Hugging Face family has.
pub const NATIVE_ARCHITECTURE: &str = "QkvDecoderLM";

/// The special-token ids carried through load and save.
const SPECIAL_KEYS: [&str; 3] = ["bos_token_id", "eos_token_id", "pad_token_id"];

/// Whether `name` (GPT-2 tree) is a Conv1D weight, which the file stores `[in, out]`.
pub(super) fn is_conv1d_weight(name: &str) -> bool {
    name.ends_with(".weight")
        && [
            ".attn.c_attn.",
            ".attn.c_proj.",
            ".mlp.c_fc.",
            ".mlp.c_proj.",
        ]
        .iter()
        .any(|s| name.contains(s))
}

/// The transpose of a matrix `[r, c]` → `[c, r]`.
pub(super) fn transpose(t: &Tensor) -> Tensor {
    let (r, c) = (t.shape()[0], t.shape()[1]);
    let src = t.data();
    Tensor::from_fn(&[c, r], |k| src[(k % r) * c + k / r])
}

/// A float as JSON without f32 → f64 noise (1e-5, not 9.999999747378752e-6).
fn json_f32(x: f32) -> Value {
    let shortest: f64 = x.to_string().parse().expect("f32 Display parses as f64");
    json!(shortest)
}

fn config_json(m: &DecoderLm) -> Value {
    let c = m.config();
    let mut j = match c.hf_family() {
        Some(HfFamily::Gpt2) => json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": c.vocab,
            "n_positions": c.max_len,
            "n_embd": c.d_model,
            "n_layer": c.n_layers,
            "n_head": c.n_heads,
            "n_inner": c.ffn_dim,
            "activation_function": match c.ffn {
                FfnKind::Relu => "relu",
                FfnKind::Gelu => "gelu",
                FfnKind::GeluTanh | FfnKind::SwiGlu => "gelu_new",
            },
            "layer_norm_epsilon": json_f32(c.norm.eps()),
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "summary_first_dropout": 0.0,
            "scale_attn_weights": true,
            "scale_attn_by_inverse_layer_idx": false,
            "reorder_and_upcast_attn": false,
            "tie_word_embeddings": c.tie_embeddings,
            "initializer_range": 0.02,
            "use_cache": true,
            "torch_dtype": "float32",
        }),
        Some(HfFamily::Llama) => json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": c.vocab,
            "hidden_size": c.d_model,
            "intermediate_size": c.ffn_dim,
            "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.n_kv_heads,
            "head_dim": c.head_dim(),
            "hidden_act": "silu",
            "max_position_embeddings": c.max_len,
            "rms_norm_eps": json_f32(c.norm.eps()),
            "rope_theta": match c.position {
                PositionKind::Rope { theta } => json_f32(theta),
                _ => Value::Null,
            },
            "rope_scaling": null,
            "attention_bias": c.bias,
            "mlp_bias": c.bias,
            "attention_dropout": 0.0,
            "tie_word_embeddings": c.tie_embeddings,
            "initializer_range": 0.02,
            "pretraining_tp": 1,
            "use_cache": true,
            "torch_dtype": "float32",
        }),
        None => json!({
            "architectures": [NATIVE_ARCHITECTURE],
            "model_type": "qkv_decoder",
            "qkv": c,
        }),
    };
    for key in SPECIAL_KEYS {
        j[key] = m.special.get(key).cloned().unwrap_or(Value::Null);
    }
    j
}

/// See [`DecoderLm::save`].
pub(super) fn save(m: &DecoderLm, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tensors = m.hf_tensors();
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    // transformers refuses safetensors files whose metadata lacks format = pt
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    crate::io::save(&dir.join("model.safetensors"), &refs, Some(meta))?;
    let text = serde_json::to_string_pretty(&config_json(m)).expect("a JSON value serialises");
    write_atomic(&dir.join("config.json"), format!("{text}\n").as_bytes())
}

#[derive(Deserialize)]
struct Architecture {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
}

#[derive(Deserialize)]
struct NativeJson {
    qkv: LmConfig,
}

/// A GPT-2 folder's configuration as [`LmConfig`]: the inference side's parsing and
/// validation ([`gpt2::Gpt2Config::validate`]), then what training adds: an activation
/// the FFN can differentiate and the plain 1/√D score scale.
fn gpt2_config(dir: &Path) -> Result<LmConfig> {
    let j: gpt2::Gpt2Config = read_config(dir)?;
    let d = j.validate(dir)?;
    let ffn = match d.act {
        Activation::Relu => FfnKind::Relu,
        Activation::Gelu => FfnKind::Gelu,
        Activation::GeluTanh => FfnKind::GeluTanh,
        _ => {
            return Err(bad_field(
                dir,
                "activation_function",
                format!(
                    "`{}` is not trainable here (relu, gelu, gelu_new, gelu_pytorch_tanh)",
                    j.activation_function
                ),
            ))
        }
    };
    if !j.scale_attn_weights || j.scale_attn_by_inverse_layer_idx {
        return Err(bad_field(
            dir,
            "scale_attn_weights",
            "trainable GPT-2 models scale scores by 1/√D only (scale_attn_weights = true, scale_attn_by_inverse_layer_idx = false)",
        ));
    }
    Ok(LmConfig {
        vocab: d.vocab,
        d_model: d.c,
        n_layers: d.layers,
        n_heads: d.heads,
        n_kv_heads: d.heads,
        ffn_dim: d.ffn,
        max_len: d.positions,
        position: PositionKind::Learned,
        norm: NormKind::LayerNorm { eps: d.eps },
        pre_norm: true,
        ffn,
        bias: true,
        tie_embeddings: j.tie_word_embeddings,
    })
}

/// A Llama folder's configuration as [`LmConfig`]: the inference side's parsing and
/// validation ([`llama::validate`], [`llama::rope_settings`]), then what training
/// adds: head_dim = C / H, SwiGLU, biases everywhere or nowhere, unscaled RoPE.
fn llama_config(dir: &Path) -> Result<LmConfig> {
    let j: llama::LlamaConfig = read_config(dir)?;
    let d = llama::validate(&j, dir)?;
    if d.head_dim * d.heads != d.hidden {
        return Err(bad_field(
            dir,
            "head_dim",
            format!(
                "trainable models need head_dim = hidden_size / num_attention_heads = {}, got {}",
                d.hidden / d.heads,
                d.head_dim
            ),
        ));
    }
    if !matches!(j.hidden_act.as_str(), "silu" | "swish") {
        return Err(bad_field(
            dir,
            "hidden_act",
            format!(
                "trainable Llama models use SwiGLU (silu), got `{}`",
                j.hidden_act
            ),
        ));
    }
    if j.attention_bias != j.mlp_bias {
        return Err(bad_field(
            dir,
            "attention_bias",
            "trainable models have biases on every projection or none (attention_bias = mlp_bias)",
        ));
    }
    let (theta, scaling) = llama::rope_settings(&j, dir)?;
    if let llama::RopeScaling::Linear(_) = scaling {
        let field = if j.rope_parameters.is_some() {
            "rope_parameters"
        } else {
            "rope_scaling"
        };
        return Err(bad_field(
            dir,
            field,
            "RoPE scaling `linear` is not trainable here (plain RoPE only)",
        ));
    }
    Ok(LmConfig {
        vocab: d.vocab,
        d_model: d.hidden,
        n_layers: j.num_hidden_layers,
        n_heads: d.heads,
        n_kv_heads: d.kv_heads,
        ffn_dim: d.ffn,
        max_len: j.max_position_embeddings.unwrap_or(2048),
        position: PositionKind::Rope { theta },
        norm: NormKind::RmsNorm { eps: d.eps },
        pre_norm: true,
        ffn: FfnKind::SwiGlu,
        bias: j.attention_bias,
        tie_embeddings: j.tie_word_embeddings,
    })
}

/// See [`DecoderLm::load`].
pub(super) fn load(dir: &Path) -> Result<DecoderLm> {
    if !dir.is_dir() {
        return Err(Error::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a model folder (config.json + model.safetensors)",
            ),
        ));
    }
    let arch: Architecture = read_config(dir)?;
    let name = arch
        .architectures
        .first()
        .cloned()
        .or(arch.model_type)
        .unwrap_or_default();
    let (config, family) = match name.as_str() {
        "GPT2LMHeadModel" | "GPT2Model" | "gpt2" => (gpt2_config(dir)?, Some(HfFamily::Gpt2)),
        "LlamaForCausalLM" | "llama" => (llama_config(dir)?, Some(HfFamily::Llama)),
        NATIVE_ARCHITECTURE | "qkv_decoder" => (read_config::<NativeJson>(dir)?.qkv, None),
        other => {
            return Err(Error::Unsupported(format!(
                "architecture `{other}` in {}: trainable models load GPT2LMHeadModel, GPT2Model, LlamaForCausalLM or {NATIVE_ARCHITECTURE}",
                dir.join("config.json").display()
            )))
        }
    };
    config
        .validate()
        .map_err(|e| bad_field(dir, "(architecture)", e.to_string()))?;
    if family.is_some() && config.hf_family() != family {
        return Err(bad_field(
            dir,
            "(architecture)",
            "the configuration does not describe a trainable model of this family",
        ));
    }
    let mut m = DecoderLm::new(&config, 0)?;
    let ckpt = Checkpoint::open(dir)?;
    let gpt2 = m.tree == Tree::Gpt2;
    let mut err: Option<Error> = None;
    m.visit_mut(&mut |name, p, _| {
        if err.is_some() {
            return;
        }
        let conv = gpt2 && is_conv1d_weight(name);
        let shape: Vec<usize> = if conv {
            vec![p.shape()[1], p.shape()[0]]
        } else {
            p.shape().to_vec()
        };
        // GPT2Model checkpoints (OpenAI's `gpt2`) lack the `transformer.` prefix
        let file_name = match name.strip_prefix("transformer.") {
            Some(bare) if gpt2 && !ckpt.has(name) && ckpt.has(bare) => bare,
            _ => name,
        };
        match ckpt.tensor_shaped(file_name, &shape) {
            Ok(t) => *p = if conv { transpose(&t) } else { t },
            Err(e) => err = Some(e),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    let raw: Map<String, Value> = read_config(dir)?;
    for key in SPECIAL_KEYS {
        if let Some(v) = raw.get(key).filter(|v| !v.is_null()) {
            m.special.insert(key.to_string(), v.clone());
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv1d_names_and_transpose() {
        assert!(is_conv1d_weight("transformer.h.3.attn.c_attn.weight"));
        assert!(is_conv1d_weight("transformer.h.0.mlp.c_proj.weight"));
        assert!(!is_conv1d_weight("transformer.h.0.mlp.c_proj.bias"));
        assert!(!is_conv1d_weight("transformer.h.0.ln_1.weight"));
        let t = Tensor::from_fn(&[2, 3], |i| i as f32);
        let tt = transpose(&t);
        assert_eq!(tt.shape(), &[3, 2]);
        assert_eq!(tt.data(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(transpose(&tt), t);
    }

    #[test]
    fn json_floats_are_shortest() {
        // the decimal the f32 stands for, not its exact binary value 9.99999974737875e-6
        assert_eq!(json_f32(1e-5).as_f64(), Some(1e-5));
        assert_eq!(json_f32(1e-6).as_f64(), Some(1e-6));
        assert_eq!(json_f32(10000.0).to_string(), "10000.0");
    }
}
