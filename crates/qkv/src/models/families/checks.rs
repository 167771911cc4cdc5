//! Config checks several families share; each error names the field at fault.

use std::path::Path;

use serde::Deserialize;

use crate::error::Result;
use crate::io::bad_field;
use crate::models::net::arch::Arch;

/// The sizes every Llama-like config names alike (Llama, Mistral, the Qwens, Gemma,
/// Phi-3).
#[derive(Deserialize)]
pub(super) struct DecoderSizes {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Absent means multi-head attention (G = H).
    pub num_key_value_heads: Option<usize>,
}

impl DecoderSizes {
    /// H and G, checked: the sizes positive, G dividing H.
    pub fn heads(&self, dir: &Path) -> Result<(usize, usize)> {
        let s = self;
        crate::positive!(dir, s; vocab_size, hidden_size, intermediate_size, num_attention_heads)?;
        let heads = self.num_attention_heads;
        Ok((heads, kv_heads(dir, heads, self.num_key_value_heads)?))
    }

    /// Llama's architecture of these sizes (H heads of `head_dim`, G key/value heads),
    /// which a family then adjusts.
    pub fn llama(&self, (heads, kv_heads): (usize, usize), head_dim: usize) -> Arch {
        Arch::llama(
            self.vocab_size,
            self.hidden_size,
            self.num_hidden_layers,
            heads,
            kv_heads,
            0,
        )
        .with_widths(head_dim, self.intermediate_size)
    }
}

/// G, the key/value heads (`num_key_value_heads`, absent: H), which must divide H.
fn kv_heads(dir: &Path, heads: usize, given: Option<usize>) -> Result<usize> {
    let kv_heads = given.unwrap_or(heads);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(bad_field(
            dir,
            "num_key_value_heads",
            format!("{kv_heads} key/value heads must divide num_attention_heads = {heads}"),
        ));
    }
    Ok(kv_heads)
}

/// R, the dimensions of a head of `head_dim` that RoPE rotates when `field` gives the
/// share `share`: transformers' `int(head_dim · share)`, which must be even and ≥ 2.
pub(super) fn rotary_dims(dir: &Path, field: &str, head_dim: usize, share: f64) -> Result<usize> {
    let rotary = (head_dim as f64 * share) as usize;
    if !(share > 0.0 && share <= 1.0) || rotary < 2 || !rotary.is_multiple_of(2) {
        return Err(bad_field(
            dir,
            field,
            format!("{share} of a head of {head_dim} rotates {rotary} dimensions: RoPE needs an even number, at least 2"),
        ));
    }
    Ok(rotary)
}
