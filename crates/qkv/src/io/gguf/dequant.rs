//! Reference dequantization: a tensor's stored blocks → f32 weights, one block at a
//! time, written for reading (the layouts are ggml's `block_q8_0`, `block_q4_0`,
//! `block_q4_K`, `block_q5_K`, `block_q6_K`). These are the twins the fast kernels
//! that compute on blocks are tested against.

use half::{bf16, f16};

use super::types::GgmlType;

/// Weights per K-quant super-block.
const QK_K: usize = 256;

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
        GgmlType::Q4_0 => blocks.for_each(|(b, o)| q4_0(b, o)),
        GgmlType::Q4_K => blocks.for_each(|(b, o)| q4_k(b, o)),
        GgmlType::Q5_K => blocks.for_each(|(b, o)| q5_k(b, o)),
        GgmlType::Q6_K => blocks.for_each(|(b, o)| q6_k(b, o)),
        _ => unreachable!("{ty} is not a type qkv dequantizes"),
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

/// 18 bytes: d (f16), then 16 bytes of 4-bit codes: the low nibbles are weights 0..16,
/// the high ones 16..32; w = d·(q − 8).
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = half(b);
    for (i, &q) in b[2..18].iter().enumerate() {
        out[i] = d * ((q & 0x0F) as f32 - 8.0);
        out[i + 16] = d * ((q >> 4) as f32 - 8.0);
    }
}

/// Scale and min of sub-block j (0..8) from the 12 bytes of 6-bit values: sub-blocks
/// 0..4 keep theirs in the low 6 bits of bytes j and j + 4; 4..8 in the nibbles of
/// bytes j + 4 with their top 2 bits in the spare bits of bytes j − 4 and j.
fn scale_min(j: usize, s: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    (sc as f32, m as f32)
}

/// 144 bytes: d, dmin (f16), 12 bytes of sub-block scales and mins, 128 bytes of
/// 4-bit codes. Eight sub-blocks of 32; each 32 code bytes hold two sub-blocks (low
/// nibbles, then high); w = d·scale·q − dmin·min.
fn q4_k(b: &[u8], out: &mut [f32]) {
    scaled_sub_blocks(b, &b[16..144], None, out);
}

/// 176 bytes: d, dmin (f16), 12 bytes of scales and mins, 32 bytes of fifth bits
/// (bit 2p of byte l for weight l of sub-block 2p, bit 2p + 1 for sub-block 2p + 1),
/// 128 bytes of low nibbles laid out as Q4_K's; w = d·scale·q − dmin·min, q < 32.
fn q5_k(b: &[u8], out: &mut [f32]) {
    scaled_sub_blocks(b, &b[48..176], Some(&b[16..48]), out);
}

/// Q4_K's and Q5_K's shared arithmetic: d, dmin and the scales from the block's first
/// 16 bytes, the low 4 bits of each code from `codes`, and the fifth bit from `high`
/// when the block has one.
fn scaled_sub_blocks(b: &[u8], codes: &[u8], high: Option<&[u8]>, out: &mut [f32]) {
    let (d, dmin) = (half(b), half(&b[2..]));
    let scales = &b[4..16];
    for (pair, (codes, o)) in codes
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(64))
        .enumerate()
    {
        let (s1, m1) = scale_min(2 * pair, scales);
        let (s2, m2) = scale_min(2 * pair + 1, scales);
        for (l, &q) in codes.iter().enumerate() {
            let (h1, h2) = high.map_or((0, 0), |h| {
                ((h[l] >> (2 * pair)) & 1, (h[l] >> (2 * pair + 1)) & 1)
            });
            o[l] = d * s1 * ((q & 0x0F) | (h1 << 4)) as f32 - dmin * m1;
            o[l + 32] = d * s2 * ((q >> 4) | (h2 << 4)) as f32 - dmin * m2;
        }
    }
}

/// 210 bytes: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed 8-bit
/// sub-block scales, d (f16). Two halves of 128 weights; in each, weight l + 32k
/// (k = 0..4, l = 0..32) takes nibble (k odd: high) of low byte l + 32·(k mod 2) and
/// bits 2k..2k+2 of high byte l; w = d·scale·(q − 32) with the scale of its 16.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = half(&b[208..]);
    for (half_i, o) in out.chunks_exact_mut(QK_K / 2).enumerate() {
        let low = &b[64 * half_i..][..64];
        let high = &b[128 + 32 * half_i..][..32];
        let scales = &b[192 + 8 * half_i..][..8];
        for l in 0..32 {
            for k in 0..4 {
                let nibble = match k {
                    0 => low[l] & 0x0F,
                    1 => low[l + 32] & 0x0F,
                    2 => low[l] >> 4,
                    _ => low[l + 32] >> 4,
                };
                let q = (nibble | (((high[l] >> (2 * k)) & 3) << 4)) as i32 - 32;
                let scale = scales[l / 16 + 2 * k] as i8;
                o[l + 32 * k] = d * scale as f32 * q as f32;
            }
        }
    }
}
