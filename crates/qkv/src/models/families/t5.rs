//! T5 (`T5ForConditionalGeneration`): an encoder-decoder whose only position signal is
//! a learned bias added to the attention scores per relative-distance bucket and head.
//!
//! - One embedding table (`shared`) for encoder and decoder, not scaled, no absolute
//!   positions.
//! - Pre-norm blocks with T5's LayerNorm, an RMSNorm; each stack ends with
//!   `final_layer_norm`.
//! - Attention projections without biases, head width `d_kv` (H·d_kv may differ from
//!   d_model), and *unscaled* scores Q·Kᵀ: the 1/√D is folded into the initialisation.
//! - The relative position bias `[num_buckets, H]` lives in the first layer of each
//!   stack and is shared by all its layers: bidirectional buckets in the encoder,
//!   backward-only ones in the decoder's causal self-attention, none in cross-attention.
//! - FFN `wo(act(wi x))` (`relu`) or gated `wo(act(wi_0 x) ⊙ wi_1 x)` (`gated-gelu`).
//! - The head: transformers 4.x rescales the decoder output by d_model^−½ exactly when
//!   the head is tied to `shared`. transformers 5 writes `scale_decoder_outputs`, which
//!   then decides alone; and a checkpoint that holds an `lm_head.weight` different from
//!   `shared.weight` keeps its own head even under `tie_word_embeddings` (5.x warns and
//!   does not tie).

use std::path::Path;

use serde::Deserialize;

use super::def::{hf_family, FamilyDef};
use super::keys::{KeyTable, Rule::*, CACHE, DROPOUT, INIT};
use super::names::{same, Name};
use super::special::{SpecialTokens, TokenIds};
use crate::block::Residual;
use crate::error::Result;
use crate::io::{bad_field, epsilon, read_config, Checkpoint};
use crate::layers::NormKind;
use crate::models::net::arch::{Arch, Head, Position, StackDims};
use crate::ops::Activation;

pub(crate) static T5: FamilyDef = hf_family(
    "t5",
    &["T5ForConditionalGeneration"],
    |dir, _, ckpt| read(dir, ckpt),
    names,
    "",
)
.with_keys(KEYS)
.with_special(start_from_bos);

/// Without a decoder start token, generation starts from BOS, as Hugging Face's
/// `generate` does.
fn start_from_bos(mut special: SpecialTokens) -> SpecialTokens {
    special.decoder_start = special.decoder_start.or(special.bos);
    special
}

/// Hugging Face `T5Config`, with its defaults for absent fields (early checkpoints such
/// as `t5-small` predate `relative_attention_max_distance`) and the `attribute_map`
/// names as aliases.
#[derive(Deserialize)]
struct T5Config {
    #[serde(default = "crate::io::size::<32128>")]
    vocab_size: usize,
    #[serde(default = "crate::io::size::<512>", alias = "hidden_size")]
    d_model: usize,
    #[serde(default = "crate::io::size::<64>", alias = "head_dim")]
    d_kv: usize,
    #[serde(default = "crate::io::size::<2048>")]
    d_ff: usize,
    #[serde(default = "crate::io::size::<6>", alias = "num_hidden_layers")]
    num_layers: usize,
    /// Defaults to `num_layers`.
    num_decoder_layers: Option<usize>,
    #[serde(default = "crate::io::size::<8>", alias = "num_attention_heads")]
    num_heads: usize,
    #[serde(default = "crate::io::size::<32>")]
    relative_attention_num_buckets: usize,
    #[serde(default = "crate::io::size::<128>")]
    relative_attention_max_distance: usize,
    #[serde(default = "crate::io::eps::<6>")]
    layer_norm_epsilon: f64,
    #[serde(default = "default_ffn")]
    feed_forward_proj: String,
    /// Written by transformers ≥ 4.23; overrides what `feed_forward_proj` implies, as
    /// `PretrainedConfig` sets saved attributes after `T5Config.__init__` derives them.
    dense_act_fn: Option<String>,
    is_gated_act: Option<bool>,
    #[serde(default = "crate::io::yes")]
    tie_word_embeddings: bool,
    /// transformers 5: whether the decoder output is scaled by d_model^−½ before the head.
    scale_decoder_outputs: Option<bool>,
    #[serde(flatten)]
    ids: TokenIds,
}

fn default_ffn() -> String {
    "relu".into()
}

/// `dir/config.json` as an [`Arch`], checked; errors name the field at fault. `ckpt`
/// tells whether a tied config's file holds a head of its own (see the module docs).
pub(super) fn read(dir: &Path, ckpt: &Checkpoint) -> Result<(Arch, TokenIds)> {
    let cfg: T5Config = read_config(dir)?;
    crate::positive!(dir, cfg; d_model, d_kv, d_ff, num_heads, vocab_size)?;
    crate::positive!(dir, cfg; relative_attention_max_distance)?;
    if cfg.relative_attention_num_buckets < 2 {
        return Err(bad_field(
            dir,
            "relative_attention_num_buckets",
            "need at least 2 buckets",
        ));
    }
    // T5Config: "gated-<act>" or "<act>"; "gated-gelu" means the tanh GELU.
    let parts: Vec<&str> = cfg.feed_forward_proj.split('-').collect();
    let derived_gated = match parts.as_slice() {
        [_] => false,
        ["gated", _] => true,
        _ => {
            return Err(bad_field(
                dir,
                "feed_forward_proj",
                format!(
                    "`{}` is not `<act>` or `gated-<act>`",
                    cfg.feed_forward_proj
                ),
            ))
        }
    };
    let derived_act = if cfg.feed_forward_proj == "gated-gelu" {
        "gelu_new"
    } else {
        parts[parts.len() - 1]
    };
    let (field, act) = match &cfg.dense_act_fn {
        Some(a) => ("dense_act_fn", a.as_str()),
        None => ("feed_forward_proj", derived_act),
    };
    let activation =
        Activation::from_hf_name(act).map_err(|e| bad_field(dir, field, e.to_string()))?;
    let stack = |layers| StackDims {
        layers,
        heads: cfg.num_heads,
        kv_heads: cfg.num_heads,
        head_dim: cfg.d_kv,
        ffn_dim: cfg.d_ff,
    };
    let mut arch = Arch::gpt2(cfg.vocab_size, cfg.d_model, 0, 1, 1);
    arch.encoder = Some(stack(cfg.num_layers));
    arch.decoder = Some(stack(cfg.num_decoder_layers.unwrap_or(cfg.num_layers)));
    arch.position = Position::Relative {
        buckets: cfg.relative_attention_num_buckets,
        max_distance: cfg.relative_attention_max_distance,
    };
    arch.norm.kind = NormKind::RmsNorm;
    arch.norm.bias = false;
    arch.norm.eps = epsilon(dir, "layer_norm_epsilon", cfg.layer_norm_epsilon)?;
    arch.residual = Residual::PreNorm;
    arch.attention.qkv_bias = false;
    arch.attention.out_bias = false;
    arch.attention.scale = Some(1.0);
    arch.ffn.activation = activation;
    arch.ffn.gated = cfg.is_gated_act.unwrap_or(derived_gated);
    arch.ffn.bias = false;
    // 5.x keeps a stored head that differs from `shared` even when told to tie.
    let own_head = ckpt.has("lm_head.weight")
        && ckpt.has("shared.weight")
        && ckpt.tensor("lm_head.weight")? != ckpt.tensor("shared.weight")?;
    let tied = cfg.tie_word_embeddings && !own_head;
    arch.head = Head::Lm {
        tied,
        rescale: cfg.scale_decoder_outputs.unwrap_or(cfg.tie_word_embeddings),
        logits_bias: false,
    };
    Ok((arch, cfg.ids))
}

/// The name table: qkv's modules → T5's (see [`Name`]). A block's sub-layers are
/// numbered: 0 self-attention, (1 cross-attention in the decoder,) then the FFN.
pub(super) fn names(arch: &Arch) -> Vec<Name> {
    let mut t = vec![
        same("embed_tokens", "shared"),
        same("head.lm_head", "lm_head"),
    ];
    let wi = if arch.ffn.gated { "wi_0" } else { "wi" };
    for stack in ["encoder", "decoder"] {
        let ffn = if stack == "decoder" { 2 } else { 1 };
        let rel = "block.0.layer.0.SelfAttention.relative_attention_bias";
        t.push(same(
            &format!("{stack}.rel_bias"),
            &format!("{stack}.{rel}"),
        ));
        t.push(same(
            &format!("{stack}.final_norm"),
            &format!("{stack}.final_layer_norm"),
        ));
        let mut layer = vec![
            ("attn_norm".to_string(), "0.layer_norm".to_string()),
            ("cross_norm".into(), "1.layer_norm".into()),
            ("ffn_norm".into(), format!("{ffn}.layer_norm")),
            ("ffn.up".into(), format!("{ffn}.DenseReluDense.{wi}")),
            ("ffn.gate_up".into(), format!("{ffn}.DenseReluDense.wi_1")),
            ("ffn.down".into(), format!("{ffn}.DenseReluDense.wo")),
        ];
        for p in ["q", "k", "v", "o"] {
            layer.push((format!("attn.{p}"), format!("0.SelfAttention.{p}")));
            layer.push((format!("cross.{p}"), format!("1.EncDecAttention.{p}")));
        }
        for (qkv, hf) in layer {
            t.push(same(
                &format!("{stack}.layers.{{l}}.{qkv}"),
                &format!("{stack}.block.{{l}}.layer.{hf}"),
            ));
        }
    }
    t
}

/// `T5Config`'s keys, see `keys.rs`.
const KEYS: KeyTable = &[&[
    ("d_model", Read),
    ("hidden_size", Read),
    ("d_kv", Read),
    ("head_dim", Read),
    ("d_ff", Read),
    ("num_layers", Read),
    ("num_hidden_layers", Read),
    ("num_decoder_layers", Read),
    ("num_heads", Read),
    ("num_attention_heads", Read),
    ("relative_attention_num_buckets", Read),
    ("relative_attention_max_distance", Read),
    ("layer_norm_epsilon", Read),
    ("feed_forward_proj", Read),
    ("dense_act_fn", Read),
    ("is_gated_act", Read),
    ("tie_word_embeddings", Read),
    ("scale_decoder_outputs", Read),
    ("dropout_rate", DROPOUT),
    ("classifier_dropout", DROPOUT),
    ("initializer_factor", INIT),
    ("use_cache", CACHE),
    ("output_past", CACHE),
    (
        "n_positions",
        Irrelevant("the first T5 configs' length note; relative positions have no table"),
    ),
    (
        "is_decoder",
        Irrelevant("T5 sets it on its own stacks' copies of the config"),
    ),
]];
