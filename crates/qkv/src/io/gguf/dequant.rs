//! Reference dequantization: a tensor's stored elements or blocks → f32 weights, one
//! block at a time, written for reading: F32, F16 and BF16 here; the blocks beside the
//! kernels that compute on them and are tested against them (Q8_0 in
//! [`crate::weights::int8::q8_0`], the 4- to 6-bit blocks in
//! [`crate::weights::ggml::dequant`]).

use half::{bf16, f16};

use super::types::GgmlType;
use crate::weights::ggml::dequant::dequantize_block;
use crate::weights::int8::q8_0;

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
        GgmlType::Q8_0 => blocks.for_each(|(b, o)| q8_0::dequantize(b, o)),
        _ => match ty.block_type() {
            Some(t) => blocks.for_each(|(b, o)| dequantize_block(t, b, o)),
            None => unreachable!("{ty} is not a type qkv dequantizes"),
        },
    }
}
