//! [`ModelInfo`]: what `qkv inspect` reports, derived from an [`Arch`] for display.

use super::families::Family;
use super::net::arch::{Arch, ModelKind, Position};
use crate::block::Residual;
use crate::layers::NormKind;
use crate::ops::Activation;
use crate::position::{RopeScaling, SinusoidalLayout};

/// A model described for people: sizes, and each choice in words.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelInfo {
    /// `bert`, `gpt2`, `llama`, `mistral`, `bloom`, `marian`, `t5`, `qkv`
    pub family: String,
    /// `architectures[0]` from config.json
    pub architecture: String,
    /// Encoder layers for encoders and encoder-decoders, decoder layers otherwise.
    pub layers: usize,
    /// Decoder layers of an encoder-decoder.
    pub decoder_layers: Option<usize>,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    /// Longest sequence the position scheme allows (or was trained for), if it says.
    pub max_positions: Option<usize>,
    /// e.g. "learned absolute", "RoPE (half-split, θ=10000)", "ALiBi"
    pub position: String,
    /// e.g. "LayerNorm, post-norm, eps 1e-12"
    pub norm: String,
    /// e.g. "GELU (erf)", "SwiGLU"
    pub ffn: String,
}

impl ModelInfo {
    pub(crate) fn describe(arch: &Arch, family: Family, architecture: String) -> Self {
        let first = arch.encoder.or(arch.decoder).expect("validated: a stack");
        let a = &arch.attention;
        let position = match &arch.position {
            Position::None => "none".to_string(),
            Position::Learned { .. } if arch.embed.token_types > 0 => {
                format!("learned absolute + {} token types", arch.embed.token_types)
            }
            Position::Learned { .. } => "learned absolute".into(),
            Position::Sinusoidal { layout, .. } => match layout {
                SinusoidalLayout::Interleaved => "sinusoidal (fixed, interleaved sin, cos)",
                SinusoidalLayout::Split => "sinusoidal (fixed, split sin | cos)",
            }
            .into(),
            Position::Rope {
                theta,
                scaling,
                rotary_dim,
                ..
            } => {
                let part = rotary_dim.map_or(String::new(), |r| format!(", first {r} dims"));
                format!(
                    "RoPE (half-split, θ={theta}{part}){}",
                    scaling_words(scaling)
                )
            }
            Position::Alibi => "ALiBi".into(),
            Position::Relative {
                buckets,
                max_distance,
            } => format!("relative bias ({buckets} buckets, max distance {max_distance})"),
        };
        let mut position = position;
        if let Some(w) = a.window {
            // an encoder's window reaches both ways: keys within w − 1 of the query
            match arch.kind() {
                ModelKind::Encoder => position.push_str(&format!(", window ±{}", w - 1)),
                _ => position.push_str(&format!(", sliding window {w}")),
            }
            match &a.local_layers {
                Some(flags) => {
                    let layers: Vec<String> = (0..flags.len())
                        .filter(|&l| a.is_local(l))
                        .map(|l| l.to_string())
                        .collect();
                    position.push_str(&format!(" on layers {}", layers.join(",")));
                }
                None if a.window_from_layer > 0 => {
                    position.push_str(&format!(" from layer {}", a.window_from_layer));
                }
                None => {}
            }
        }
        if let Some(theta) = a.local_rope_theta {
            position.push_str(&format!(", local layers' RoPE θ={theta}"));
        }
        if let Some(cap) = a.softcap {
            position.push_str(&format!(", scores soft-capped at {cap}"));
        }
        if a.scale == Some(1.0) {
            position.push_str(", unscaled scores");
        }
        let norm = format!(
            "{}, {}{}, eps {:e}",
            match arch.norm.kind {
                NormKind::LayerNorm => "LayerNorm",
                NormKind::RmsNorm => "RMSNorm",
            },
            match arch.residual {
                Residual::PreNorm => "pre-norm",
                Residual::PostNorm => "post-norm",
                Residual::PreNormFromNormed => "pre-norm (residual after the norm)",
                Residual::Parallel => "pre-norm, parallel attention and FFN",
                Residual::Sandwich => "pre- and post-norm on each sub-layer",
            },
            if arch.embed.norm {
                ", embedding norm"
            } else {
                ""
            },
            arch.norm.eps
        );
        let ffn = match (arch.ffn.gated, arch.ffn.activation) {
            (false, act) => act.to_string(),
            (true, Activation::Silu) => "SwiGLU".into(),
            (true, act) => format!("gated {act}"),
        };
        // RoBERTa's table starts its real tokens at padding_idx + 1: 514 rows hold 512
        let max_positions = match arch.position {
            Position::Rope { max_len, .. } => max_len,
            _ => arch
                .max_positions()
                .map(|n| n.saturating_sub(arch.embed.position_offset)),
        };
        ModelInfo {
            family: family.name().into(),
            architecture,
            layers: first.layers,
            decoder_layers: arch.encoder.and(arch.decoder).map(|d| d.layers),
            hidden: arch.d_model,
            heads: first.heads,
            kv_heads: first.kv_heads,
            head_dim: first.head_dim,
            ffn_dim: first.ffn_dim,
            vocab: arch.vocab,
            max_positions,
            position,
            norm,
            ffn,
        }
    }
}

/// ", llama3 scaling ×8 (from 8192 positions)" and the like; empty without scaling.
fn scaling_words(scaling: &RopeScaling) -> String {
    match scaling {
        RopeScaling::None => String::new(),
        RopeScaling::Linear { factor } => format!(", linear scaling ×{factor}"),
        RopeScaling::Llama3(l) => format!(
            ", llama3 scaling ×{} (from {} positions)",
            l.factor, l.original_max
        ),
        RopeScaling::Yarn(y) => format!(
            ", YaRN scaling ×{} (from {} positions, attention factor {})",
            y.factor, y.original_max, y.attention_factor
        ),
        RopeScaling::Dynamic { factor, max_len } => {
            format!(", dynamic NTK scaling ×{factor} past {max_len} positions")
        }
        RopeScaling::LongRope(l) => format!(
            ", LongRoPE (long factors past {} positions, attention factor {})",
            l.original_max, l.attention_factor
        ),
    }
}
