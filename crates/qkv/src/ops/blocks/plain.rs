//! The dot products in plain loops: one weight row's blocks against one quantized row
//! of x, each sub-block's sum exact in i32 and only the sum over blocks in f32, as
//! llama.cpp's `ggml_vec_dot_*` compute it. The vector forms ([`super::x86`]) give
//! these results up to the order of the f32 sums over blocks.

use super::activations::{XRow, SUM};
use super::layout::{
    half, q4_0_codes, q4_k_codes, q5_k_codes, q6_k_codes, q6_k_scales, scales_mins, BlockType, QK_K,
};

/// Σ_c W[row, c]·x[c] for one row's blocks `w` and a row `x` quantized for `ty`.
pub(super) fn dot(ty: BlockType, w: &[u8], (q, scales, sums): XRow) -> f32 {
    let mut total = 0.0f32;
    let per = ty.weights();
    for (b, block) in w.chunks_exact(ty.bytes()).enumerate() {
        let (q, sums) = (&q[b * per..][..per], &sums[b * per / SUM..][..per / SUM]);
        let dx = scales[b];
        total += match ty {
            BlockType::Q4_0 => {
                // Σ (c − 8)·x = Σ c·x − 8·Σ x
                let codes = q4_0_codes(block);
                let s = products(&codes, q) - 8 * (i32::from(sums[0]) + i32::from(sums[1]));
                half(block) * dx * s as f32
            }
            BlockType::Q4K => with_mins(block, &q4_k_codes(block), q, sums, dx),
            BlockType::Q5K => with_mins(block, &q5_k_codes(block), q, sums, dx),
            BlockType::Q6K => {
                // Σ_g scale_g·Σ (c − 32)·x over groups g of 16
                let (codes, scales) = (q6_k_codes(block), q6_k_scales(block));
                let mut s = 0i32;
                for g in 0..QK_K / 16 {
                    let range = g * 16..(g + 1) * 16;
                    let dot = products(&codes[range.clone()], &q[range]) - 32 * i32::from(sums[g]);
                    s += i32::from(scales[g]) * dot;
                }
                half(&block[208..]) * dx * s as f32
            }
        };
    }
    total
}

/// Q4_K's and Q5_K's d·dx·Σ_s scale_s·Σ c·x − dmin·dx·Σ_s min_s·Σ x over sub-blocks
/// s of 32.
fn with_mins(block: &[u8], codes: &[u8], q: &[i8], sums: &[i16], dx: f32) -> f32 {
    let (scales, mins) = scales_mins(&block[4..16]);
    let (mut s, mut m) = (0i32, 0i32);
    for j in 0..8 {
        let range = 32 * j..32 * (j + 1);
        s += i32::from(scales[j]) * products(&codes[range.clone()], &q[range]);
        m += i32::from(mins[j]) * (i32::from(sums[2 * j]) + i32::from(sums[2 * j + 1]));
    }
    half(block) * dx * s as f32 - half(&block[2..]) * dx * m as f32
}

/// Σ c·x over unsigned codes and signed activations.
fn products(codes: &[u8], q: &[i8]) -> i32 {
    codes
        .iter()
        .zip(q)
        .map(|(&c, &x)| i32::from(c) * i32::from(x))
        .sum()
}
