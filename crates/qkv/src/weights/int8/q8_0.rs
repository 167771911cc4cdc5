//! GGUF's Q8_0 block as a file stores it: 34 bytes, d (f16) then 32 signed 8-bit
//! codes, w = d·q. The int8 weight's blocks are these ([`super::weight`] keeps d
//! widened beside the codes), so a file's Q8_0 tensors run as stored.

use half::f16;

/// Weights a block holds.
pub const WEIGHTS: usize = 32;

/// Bytes a block takes.
pub const BYTES: usize = 2 + WEIGHTS;

/// A block's scale d and its 32 codes, from the block's first [`BYTES`] bytes.
pub fn parts(b: &[u8]) -> (f32, impl Iterator<Item = i8> + '_) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    (d, b[2..BYTES].iter().map(|&q| q as i8))
}

/// The twin: one block `b` → its 32 weights in `out`.
pub fn dequantize(b: &[u8], out: &mut [f32]) {
    let (d, codes) = parts(b);
    for (o, q) in out.iter_mut().zip(codes) {
        *o = d * f32::from(q);
    }
}
