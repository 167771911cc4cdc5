//! The Hugging Face `config.json` of a model read from a GGUF file: what
//! `Transformer::save` writes beside its tensors, so that the folder reads back (in qkv
//! and transformers) as the model the file held.

use serde_json::{json, Map, Value};

use super::meta::Kind;
use crate::io::json_f32 as f;
use crate::models::net::arch::{Arch, Position};
use crate::position::RopeScaling;

/// `config.json` of `arch` read from a `kind` file, in its family's keys.
pub(super) fn config(kind: Kind, arch: &Arch) -> Map<String, Value> {
    let s = arch.stack();
    let (theta, scaling, max_len, rotary) = match &arch.position {
        Position::Rope {
            theta,
            scaling,
            max_len,
            rotary_dim,
        } => (
            *theta,
            scaling,
            max_len.unwrap_or(0),
            rotary_dim.unwrap_or(s.head_dim),
        ),
        _ => unreachable!("GGUF models rotate"),
    };
    let model_type = match kind {
        Kind::Gemma3 => "gemma3_text",
        k => k.name(),
    };
    let mut c = json!({
        "architectures": [kind.architecture()],
        "model_type": model_type,
        "vocab_size": arch.vocab,
        "hidden_size": arch.d_model,
        "intermediate_size": s.ffn_dim,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "max_position_embeddings": max_len,
        "rms_norm_eps": f(arch.norm.eps),
        "rope_theta": f(theta),
        "tie_word_embeddings": arch.head.tied(),
        "attention_bias": arch.attention.qkv_bias,
        "torch_dtype": "float32",
    });
    let c = c.as_object_mut().expect("an object");
    let rope_scaling = match scaling {
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": f(*factor)}),
        RopeScaling::LongRope(l) => {
            c.insert(
                "original_max_position_embeddings".into(),
                json!(l.original_max),
            );
            let mut entry = json!({
                "type": "longrope",
                "short_factor": l.short_factor.iter().map(|x| f(*x)).collect::<Vec<_>>(),
                "long_factor": l.long_factor.iter().map(|x| f(*x)).collect::<Vec<_>>(),
            });
            // transformers 4.x's Phi3Config takes exactly these three keys, and derives
            // the attention factor from the two lengths: given only when it differs
            let (max, original) = (max_len as f64, l.original_max as f64);
            let derived = match max > original {
                true => (1.0 + (max / original).ln() / original.ln()).sqrt(),
                false => 1.0,
            };
            if derived as f32 != l.attention_factor {
                entry["attention_factor"] = f(l.attention_factor);
            }
            entry
        }
        _ => Value::Null,
    };
    c.insert("rope_scaling".into(), rope_scaling);
    let at = &arch.attention;
    let layer_types = at.local_layers.as_ref().map(|flags| {
        flags
            .iter()
            .map(|&l| match l {
                true => "sliding_attention",
                false => "full_attention",
            })
            .collect::<Vec<_>>()
    });
    let gelu = json!("gelu_pytorch_tanh");
    let extra = match kind {
        Kind::Llama | Kind::Qwen2 | Kind::Qwen3 => json!({"hidden_act": "silu"}),
        Kind::Gemma => json!({"hidden_act": gelu}),
        Kind::Gemma2 | Kind::Gemma3 => json!({
            "hidden_activation": gelu,
            "query_pre_attn_scalar": at.scale.map(|x| (1.0 / (x as f64).powi(2)).round() as usize),
            "attn_logit_softcapping": at.softcap.map(f),
            "final_logit_softcapping": arch.logit_softcap.map(f),
            "sliding_window": at.window.unwrap_or(4096),
            "layer_types": layer_types,
            "rope_local_base_freq": at.local_rope_theta.map(f),
        }),
        Kind::Phi3 => json!({
            "hidden_act": "silu",
            "partial_rotary_factor": rotary as f64 / s.head_dim as f64,
            "sliding_window": null,
        }),
    };
    for (k, v) in extra.as_object().expect("an object") {
        if !(v.is_null() && k == "rope_local_base_freq") {
            c.insert(k.clone(), v.clone());
        }
    }
    c.clone()
}
