//! ModernBERT (`ModernBertModel`, `ModernBertForMaskedLM`): an encoder rebuilt with
//! the decoders' parts.
//!
//! - Embeddings: the token table and a LayerNorm; no positions added (RoPE), no token
//!   types.
//! - Pre-norm layers without biases (LayerNorm without bias either); the first layer
//!   has no attention norm of its own (`attn_norm` is the identity there: the
//!   embeddings' norm serves), and the stack ends with `final_norm`.
//! - Every `global_attn_every_n_layers`-th layer from 0 is global, with RoPE base
//!   `global_rope_theta`; the others are local: they see keys within
//!   `local_attention / 2` positions on either side (|i − j| ≤ 64 by default) and
//!   rotate with `local_rope_theta`.
//! - `Wqkv` fuses Q, K and V one block after another; the MLP is GeGLU with `Wi`
//!   fusing the activated half first, then the gate.
//! - `ModernBertForMaskedLM`: `head` (dense without bias, activation, norm), then
//!   `decoder`, the token table tied, with a bias. The encoder is under `model.`.

use std::path::Path;

use serde::Deserialize;

use super::def::{hf_family, ClassifierLayout, FamilyDef, PoolActivation};
use super::keys::{KeyTable, Rule::*, DROPOUT, INIT, TRAINING};
use super::llama::sliding_layers;
use super::names::{fused_gated_rows, fused_qkv_rows, layer_rows, same, Name};
use super::special::TokenIds;
use crate::error::{Error, Result};
use crate::io::{bad_field, check_heads, epsilon, read_config, Checkpoint};
use crate::models::net::arch::{Arch, Head, Position};
use crate::ops::Activation;
use crate::position::rope_scaling::{HfRopeConfig, RopeParameters};
use crate::position::RopeScaling;

pub(crate) static MODERNBERT: FamilyDef = hf_family(
    "modernbert",
    &[
        "ModernBertForMaskedLM",
        "ModernBertModel",
        "ModernBertForSequenceClassification",
    ],
    read_folder,
    names,
    "model.",
)
.with_keys(KEYS)
.classifying(ClassifierLayout {
    dense: "head.dense",
    activation: PoolActivation::Configured,
    norm: Some("head.norm"),
    out: "classifier",
});

/// `ModernBertConfig`, with its defaults (ModernBERT-base) where the file is silent.
#[derive(Deserialize)]
#[serde(default)]
struct ModernBertConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    hidden_activation: String,
    max_position_embeddings: usize,
    norm_eps: f64,
    norm_bias: bool,
    /// 4.57 (`rope_theta` is its alias there)
    #[serde(alias = "rope_theta")]
    global_rope_theta: f64,
    /// 4.57
    local_rope_theta: Option<f64>,
    /// 5.x: the base of each layer type, `{"full_attention": {…}, "sliding_attention": {…}}`
    rope_parameters: Option<RopeParameters>,
    /// 5.x: each layer's kind, in place of `global_attn_every_n_layers`
    layer_types: Option<Vec<String>>,
    attention_bias: bool,
    mlp_bias: bool,
    global_attn_every_n_layers: usize,
    local_attention: usize,
    decoder_bias: bool,
    classifier_bias: bool,
    classifier_activation: String,
    rope_scaling: Option<serde_json::Value>,
    #[serde(flatten)]
    tokens: TokenIds,
}

impl Default for ModernBertConfig {
    fn default() -> Self {
        ModernBertConfig {
            vocab_size: 50368,
            hidden_size: 768,
            intermediate_size: 1152,
            num_hidden_layers: 22,
            num_attention_heads: 12,
            hidden_activation: "gelu".into(),
            max_position_embeddings: 8192,
            norm_eps: 1e-5,
            norm_bias: false,
            global_rope_theta: 160_000.0,
            local_rope_theta: Some(10_000.0),
            rope_parameters: None,
            layer_types: None,
            attention_bias: false,
            mlp_bias: false,
            global_attn_every_n_layers: 3,
            local_attention: 128,
            decoder_bias: true,
            classifier_bias: false,
            classifier_activation: "gelu".into(),
            rope_scaling: None,
            tokens: TokenIds::default(),
        }
    }
}

/// A masked-LM folder keeps its head when the checkpoint has it.
fn read_folder(dir: &Path, architecture: &str, ckpt: &Checkpoint) -> Result<(Arch, TokenIds)> {
    let cfg: ModernBertConfig = read_config(dir)?;
    let (c, heads) = (cfg.hidden_size, cfg.num_attention_heads);
    check_heads(dir, "num_attention_heads", heads, "hidden_size", c)?;
    crate::positive!(dir, cfg; vocab_size, intermediate_size, num_hidden_layers, global_attn_every_n_layers)?;
    if cfg.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(Error::Unsupported(format!(
            "{}: field `rope_scaling`: ModernBERT is read with plain RoPE only",
            dir.join("config.json").display()
        )));
    }
    let act = |field: &str, name: &str| {
        Activation::from_hf_name(name).map_err(|e| bad_field(dir, field, e.to_string()))
    };
    let theta = |field: &str, v: f64| match v.is_finite() && v > 1.0 {
        true => Ok(v as f32),
        false => Err(bad_field(
            dir,
            field,
            format!("must be finite and > 1, got {v}"),
        )),
    };
    let entry = |kind: &str| {
        cfg.rope_parameters
            .as_ref()
            .and_then(|p| p.for_layers(kind))
    };
    let global_theta = match entry("full_attention") {
        Some(e) => rope_base(dir, "full_attention", e)?,
        None => cfg.global_rope_theta,
    };
    let local_theta = match entry("sliding_attention") {
        Some(e) => Some(rope_base(dir, "sliding_attention", e)?),
        None => cfg.local_rope_theta,
    };
    let mut arch = Arch::bert(
        cfg.vocab_size,
        c,
        cfg.num_hidden_layers,
        heads,
        cfg.intermediate_size,
        cfg.max_position_embeddings,
        act("hidden_activation", &cfg.hidden_activation)?,
        epsilon(dir, "norm_eps", cfg.norm_eps)?,
    );
    arch.residual = crate::block::Residual::PreNorm;
    arch.norm.bias = cfg.norm_bias;
    arch.embed.first_attn_unnormed = true;
    arch.embed.padding_idx = cfg.tokens.pad();
    arch.position = Position::Rope {
        theta: theta("global_rope_theta", global_theta)?,
        scaling: RopeScaling::None,
        max_len: Some(cfg.max_position_embeddings),
        rotary_dim: None,
    };
    let a = &mut arch.attention;
    a.qkv_bias = cfg.attention_bias;
    a.out_bias = cfg.attention_bias;
    let local: Vec<bool> = match &cfg.layer_types {
        Some(types) => sliding_layers(dir, types, cfg.num_hidden_layers)?,
        None => {
            let every = cfg.global_attn_every_n_layers;
            (0..cfg.num_hidden_layers).map(|l| l % every != 0).collect()
        }
    };
    if local.contains(&true) {
        if cfg.local_attention < 2 {
            return Err(bad_field(
                dir,
                "local_attention",
                format!(
                    "{}: a local layer sees local_attention / 2 keys on each side",
                    cfg.local_attention
                ),
            ));
        }
        // transformers keeps |i − j| ≤ local_attention / 2; qkv's window keeps |i − j| < w
        a.window = Some(cfg.local_attention / 2 + 1);
        a.local_rope_theta = local_theta
            .map(|t| theta("local_rope_theta", t))
            .transpose()?;
    }
    a.local_layers = Some(local);
    arch.ffn.gated = true;
    arch.ffn.bias = cfg.mlp_bias;
    let masked = architecture == "ModernBertForMaskedLM" && ckpt.has("head.dense.weight");
    if masked && !cfg.decoder_bias {
        return Err(Error::Unsupported(format!(
            "{}: field `decoder_bias` is false; qkv's masked-LM head has a bias",
            dir.join("config.json").display()
        )));
    }
    arch.head = match masked {
        true => Head::MaskedLm {
            activation: act("classifier_activation", &cfg.classifier_activation)?,
            dense_bias: cfg.classifier_bias,
        },
        false => Head::None,
    };
    Ok((arch, cfg.tokens))
}

/// The name table: qkv's modules → ModernBERT's (see [`Name`]). A masked-LM model
/// keeps the encoder under `model.`.
fn names(arch: &Arch) -> Vec<Name> {
    let b = match arch.head {
        Head::MaskedLm { .. } => "model.",
        _ => "",
    };
    let mut t = vec![
        same("embed_tokens", &format!("{b}embeddings.tok_embeddings")),
        same("encoder.embed_norm", &format!("{b}embeddings.norm")),
        same("encoder.final_norm", &format!("{b}final_norm")),
        same("head", "decoder"),
        same("head.dense", "head.dense"),
        same("head.norm", "head.norm"),
    ];
    let layer = format!("{b}layers.{{l}}.");
    t.extend(layer_rows(
        "encoder",
        &layer,
        &[
            ("attn_norm", "attn_norm"),
            ("attn.o", "attn.Wo"),
            ("ffn_norm", "mlp_norm"),
            ("ffn.down", "mlp.Wo"),
        ],
    ));
    let s = arch.stack();
    t.extend(fused_qkv_rows(
        "encoder",
        &format!("{layer}attn.Wqkv"),
        s.heads,
        s.kv_heads,
    ));
    t.extend(fused_gated_rows("encoder", &format!("{layer}mlp.Wi")));
    t
}

/// The base of a 5.x `rope_parameters` entry for layers of `kind`, which must be
/// unscaled: ModernBERT is read with plain RoPE only.
fn rope_base(dir: &Path, kind: &str, entry: &HfRopeConfig) -> Result<f64> {
    match entry.rope_type.as_deref().or(entry.legacy_type.as_deref()) {
        None | Some("default") => Ok(entry.rope_theta.unwrap_or(10_000.0)),
        Some(scaled) => Err(Error::Unsupported(format!(
            "`{scaled}` RoPE scaling: ModernBERT is read with plain RoPE only ({}, field `rope_parameters.{kind}`)",
            dir.join("config.json").display()
        ))),
    }
}

/// `ModernBertConfig`'s keys, see `keys.rs`.
const KEYS: KeyTable = &[&[
    ("hidden_size", Read),
    ("intermediate_size", Read),
    ("num_hidden_layers", Read),
    ("num_attention_heads", Read),
    ("hidden_activation", Read),
    ("max_position_embeddings", Read),
    ("norm_eps", Read),
    ("norm_bias", Read),
    ("global_rope_theta", Read),
    ("rope_theta", Read),
    ("local_rope_theta", Read),
    ("rope_scaling", Read),
    ("rope_parameters", Read),
    ("attention_bias", Read),
    ("mlp_bias", Read),
    ("global_attn_every_n_layers", Read),
    ("local_attention", Read),
    ("layer_types", Read),
    ("decoder_bias", Read),
    ("classifier_bias", Read),
    ("classifier_activation", Read),
    ("classifier_pooling", Read),
    ("tie_word_embeddings", Only("true")),
    (
        "cls_token_id",
        Irrelevant("the tokenizer's; no forward reads it"),
    ),
    ("attention_dropout", DROPOUT),
    ("embedding_dropout", DROPOUT),
    ("mlp_dropout", DROPOUT),
    ("classifier_dropout", DROPOUT),
    ("initializer_range", INIT),
    ("initializer_cutoff_factor", INIT),
    (
        "deterministic_flash_attn",
        Irrelevant("flash-attention's backward order on GPUs"),
    ),
    (
        "reference_compile",
        Irrelevant("whether torch.compile runs the layers; the same numbers"),
    ),
    ("repad_logits_with_grad", TRAINING),
    ("sparse_prediction", TRAINING),
    ("sparse_pred_ignore_index", TRAINING),
]];
