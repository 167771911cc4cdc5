//! The twin: a block → its f32 weights, in the order of operations of
//! `gguf.quants.dequantize` (whose results these equal bit for bit, the GGUF tests
//! check).

use super::layout::{
    half, q4_0_codes, q4_k_codes, q5_k_codes, q6_k_codes, q6_k_scales, scales_mins, BlockType,
};

/// Dequantizes one block `b` of type `ty` into `out` (`ty.weights()` long).
pub fn dequantize_block(ty: BlockType, b: &[u8], out: &mut [f32]) {
    assert_eq!((b.len(), out.len()), (ty.bytes(), ty.weights()));
    match ty {
        BlockType::Q4_0 => {
            // w = d·(q − 8)
            let d = half(b);
            for (o, q) in out.iter_mut().zip(q4_0_codes(b)) {
                *o = d * (q as f32 - 8.0);
            }
        }
        BlockType::Q4K => sub_blocks_with_mins(b, &q4_k_codes(b), out),
        BlockType::Q5K => sub_blocks_with_mins(b, &q5_k_codes(b), out),
        BlockType::Q6K => {
            // w = d·scale·(q − 32), a scale per 16
            let (d, scales) = (half(&b[208..]), q6_k_scales(b));
            for (i, (o, q)) in out.iter_mut().zip(q6_k_codes(b)).enumerate() {
                *o = d * scales[i / 16] as f32 * (q as i32 - 32) as f32;
            }
        }
    }
}

/// Q4_K's and Q5_K's w = d·scale·q − dmin·min, a scale and min per 32.
fn sub_blocks_with_mins(b: &[u8], codes: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half(b), half(&b[2..]));
    let (scales, mins) = scales_mins(&b[4..16]);
    for (i, (o, &q)) in out.iter_mut().zip(codes).enumerate() {
        let (sc, m) = (scales[i / 32] as f32, mins[i / 32] as f32);
        *o = d * sc * q as f32 - dmin * m;
    }
}

/// Dequantizes whole blocks: `bytes` (a multiple of the block size) → `out`.
pub fn dequantize(ty: BlockType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len() / ty.bytes() * ty.weights(), out.len());
    for (b, o) in bytes
        .chunks_exact(ty.bytes())
        .zip(out.chunks_exact_mut(ty.weights()))
    {
        dequantize_block(ty, b, o);
    }
}
