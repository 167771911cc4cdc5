//! What a whole forward will hold in memory, estimated from the shapes before it runs,
//! so that a request too large for the machine is refused before anything of it is
//! allocated rather than aborting half-way.

use crate::models::net::arch::{Arch, Head, Position, StackDims};

/// Sizes of one whole forward.
#[derive(Clone, Copy, Debug)]
pub struct Shapes {
    /// B
    pub batch: usize,
    /// S: the encoder's tokens (0 without an encoder input).
    pub source: usize,
    /// T: the decoder's tokens (0 without a decoder input).
    pub target: usize,
    /// The logits (a head's `[B, T, V]`) are computed.
    pub head: bool,
    /// Every layer's `[B, H, T, S]` attention weights are kept.
    pub attentions: bool,
}

/// `4 · Π xs` bytes of f32, or `None` past `usize`.
fn f32s(xs: &[usize]) -> Option<usize> {
    xs.iter().try_fold(4usize, |acc, &x| acc.checked_mul(x))
}

/// One stack over `t` query and `s` key tokens: the activations of the layer being run
/// (residual stream, norm output, q/k/v, merged heads, the FFN's two intermediates),
/// the dense position bias a relative or encoder-ALiBi stack builds `[H, T, S]`, and
/// with `maps` every layer's weights `[B, H, T, S]` (and `cross_keys` more keys per
/// query for a decoder's cross-attention).
fn stack(
    a: &Arch,
    d: StackDims,
    b: usize,
    t: usize,
    s: usize,
    maps: bool,
    cross_keys: usize,
) -> Option<usize> {
    let c = a.d_model;
    let qkv = d
        .heads
        .checked_add(d.kv_heads.checked_mul(2)?)?
        .checked_mul(d.head_dim)?;
    let width = c
        .checked_mul(4)?
        .checked_add(qkv)?
        .checked_add(d.ffn_dim.checked_mul(2)?)?;
    let activations = f32s(&[b, t, width])?;
    let dense = match a.position {
        Position::Relative { .. } | Position::Alibi => f32s(&[d.heads, t, s])?,
        _ => 0,
    };
    let weights = match maps {
        true => f32s(&[d.layers, b, d.heads, t, s.checked_add(cross_keys)?])?,
        false => 0,
    };
    activations.checked_add(dense)?.checked_add(weights)
}

/// Bytes a forward of `shapes` through `a` holds at its peak, roughly: the outputs
/// (logits `[B, T, V]` or hidden states), every attention map when asked, the
/// encoder's output and the decoder's cross keys and values, a dense position bias,
/// and one layer's activations. `None`: more than can be counted.
pub fn forward_bytes(a: &Arch, shapes: Shapes) -> Option<usize> {
    let Shapes {
        batch: b,
        source: s,
        target: t,
        head,
        attentions,
    } = shapes;
    let mut total = 0usize;
    if let Some(e) = a.encoder {
        total = total.checked_add(stack(a, e, b, s, s, attentions, 0)?)?;
        // the encoder's output, kept for the decoder or returned
        total = total.checked_add(f32s(&[b, s, a.d_model])?)?;
    }
    if let Some(d) = a.decoder {
        let cross = match a.encoder {
            Some(_) => s,
            None => 0,
        };
        total = total.checked_add(stack(a, d, b, t, t, attentions, cross)?)?;
        let cross_kv = f32s(&[d.layers, b, cross, 2, d.kv_heads, d.head_dim])?;
        total = total.checked_add(cross_kv)?;
    }
    let rows = match a.decoder {
        Some(_) => t,
        None => s,
    };
    let logits = match (head, a.head) {
        (true, Head::Lm { .. }) => f32s(&[b, rows, a.vocab])?,
        _ => 0,
    };
    total.checked_add(logits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::arch::Arch;

    #[test]
    fn maps_dominate_a_long_text_and_overflow_is_none() {
        let arch = Arch::vaswani(100, 32, 2, 2, 64);
        let small = Shapes {
            batch: 1,
            source: 8,
            target: 8,
            head: true,
            attentions: false,
        };
        let plain = forward_bytes(&arch, small).unwrap();
        let with_maps = forward_bytes(
            &arch,
            Shapes {
                attentions: true,
                ..small
            },
        )
        .unwrap();
        // encoder 2·1·2·8·8, decoder self 8·8 and cross 8·8 per head and layer
        assert_eq!(with_maps - plain, 4 * (2 * 2 * 64 + 2 * 2 * 128));
        // 2⁸⁰ weights per map
        let huge = Shapes {
            source: 1 << 40,
            target: 1 << 40,
            attentions: true,
            ..small
        };
        assert_eq!(forward_bytes(&arch, huge), None);
    }
}
