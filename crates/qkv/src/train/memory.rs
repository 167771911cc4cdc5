//! What a training run will hold in memory, estimated from its sizes before anything is
//! allocated, so that a run too large for the machine is refused with the estimate
//! instead of aborting mid-allocation (or being killed after the first steps).
//!
//! The estimate is deliberately generous, counted in f32 values:
//! - the parameters four times: weights, gradients, and AdamW's two moments;
//! - per token of a batch, every layer's saved activations (the residual stream, the
//!   norms, Q, K, V and the attention output, the FFN's hidden layer) and the logits
//!   with their softmax and gradient;
//! - the batches themselves (ids and targets).

use crate::models::{Arch, Weights};

/// Bytes of one f32 or one token id held as usize.
const VALUE: usize = 4;
const ID: usize = std::mem::size_of::<usize>();

/// Saved f32 values per token and layer, as multiples of the model width C and of the
/// FFN width F: the tape keeps about a dozen C-wide vectors and a few F-wide ones.
const PER_LAYER_C: usize = 16;
const PER_LAYER_F: usize = 4;
/// Logits, probabilities and their gradient: three V-wide rows per token.
const PER_TOKEN_V: usize = 3;

/// The estimate, in bytes, for training a Transformer of `arch` on batches of `batch`
/// rows of `seq_len` tokens; `None` when it overflows (no machine has that much).
pub fn transformer_bytes(arch: &Arch, batch: usize, seq_len: usize) -> Option<usize> {
    let params = Weights::count(arch)?;
    let c = arch.d_model;
    let per_layer = |s: Option<crate::models::StackDims>| -> Option<usize> {
        s.map_or(Some(0), |s| {
            PER_LAYER_C
                .checked_mul(c)?
                .checked_add(PER_LAYER_F.checked_mul(s.ffn_dim)?)?
                .checked_mul(s.layers)
        })
    };
    let per_token = per_layer(arch.encoder)?
        .checked_add(per_layer(arch.decoder)?)?
        .checked_add(PER_TOKEN_V.checked_mul(arch.vocab)?)?;
    let tokens = batch.checked_mul(seq_len)?;
    params
        .checked_mul(4 * VALUE)?
        .checked_add(tokens.checked_mul(per_token)?.checked_mul(VALUE)?)?
        .checked_add(tokens.checked_mul(2 * ID)?)
}

/// The estimate for a recurrent model of `width` (embedding, hidden and attention) and
/// `layers` over `vocab` tokens, on batches of `batch` × `seq_len`.
pub fn recurrent_bytes(
    vocab: usize,
    width: usize,
    layers: usize,
    batch: usize,
    seq_len: usize,
) -> Option<usize> {
    // embedding and output tables, and per layer two width × width matrices
    let params = vocab.checked_mul(width)?.checked_mul(2)?.checked_add(
        width
            .checked_mul(width)?
            .checked_mul(2)?
            .checked_mul(layers.max(1))?,
    )?;
    let per_token = PER_LAYER_C
        .checked_mul(width)?
        .checked_mul(layers.max(1))?
        .checked_add(PER_TOKEN_V.checked_mul(vocab)?)?;
    let tokens = batch.checked_mul(seq_len)?;
    params
        .checked_mul(4 * VALUE)?
        .checked_add(tokens.checked_mul(per_token)?.checked_mul(VALUE)?)?
        .checked_add(tokens.checked_mul(2 * ID)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_runs_fit_and_huge_ones_overflow_or_grow() {
        let arch = Arch::gpt2(64, 64, 2, 4, 32);
        let small = transformer_bytes(&arch, 32, 32).unwrap();
        // 0.1 M parameters × 16 bytes plus 1024 tokens' activations: a few MB
        assert!(small < 64 << 20, "{small}");
        assert!(transformer_bytes(&arch, usize::MAX / 2, 32).is_none());
        let wide = Arch::gpt2(64, 65536, 2, 4, 32);
        assert!(transformer_bytes(&wide, 32, 32).unwrap() > 100 << 30);
    }
}
