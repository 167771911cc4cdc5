//! Reference dequantization: a tensor's stored elements or blocks → f32 weights, one
//! block at a time, written for reading: F32, F16, BF16 and ggml's `block_q8_0` here,
//! the 4- to 6-bit blocks in [`crate::weights::ggml::dequant`], where the kernels that
//! compute on them are tested against them.

use half::{bf16, f16};

use super::types::GgmlType;
use crate::weights::ggml::dequant::dequantize_block;

fn half(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// `bytes` (whole blocks of `ty`) → their weights in `out` (as many as the blocks
/// hold). The caller checked the sizes; `ty` is one that [`GgmlType::dequantizes`].
pub(super) fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len() / ty.block_bytes * ty.block, out.len());
    let blocks = bytes
        .chunks_exact(ty.block_bytes)
        .zip(out.chunks_exact_mut(ty.block));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, o)| o[0] = half(b)),
        GgmlType::BF16 => {
            blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        GgmlType::Q8_0 => blocks.for_each(|(b, o)| q8_0(b, o)),
        _ => match ty.block_type() {
            Some(t) => blocks.for_each(|(b, o)| dequantize_block(t, b, o)),
            None => unreachable!("{ty} is not a type qkv dequantizes"),
        },
    }
}

/// 34 bytes: d (f16), then 32 signed 8-bit codes; w = d·q.
fn q8_0(b: &[u8], out: &mut [f32]) {
    let (d, codes) = q8_0_parts(b);
    for (o, q) in out.iter_mut().zip(codes) {
        *o = d * f32::from(q);
    }
}

/// A Q8_0 block's scale d and its 32 codes, from the block's first 34 bytes.
pub fn q8_0_parts(b: &[u8]) -> (f32, impl Iterator<Item = i8> + '_) {
    (half(b), b[2..34].iter().map(|&q| q as i8))
}
