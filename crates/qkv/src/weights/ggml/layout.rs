//! The block formats (ggml's `block_q4_0`, `block_q4_K`, `block_q5_K`, `block_q6_K`),
//! and each block's codes, scales and offsets unpacked for reading. In every type
//! w = d·scale_s·q − offset_s over the block's sub-blocks s, with q unsigned:
//!
//! | type | weights | bytes | sub-block | scale | offset |
//! |---|---|---|---|---|---|
//! | Q4_0 | 32 | 18 | 32 | 1 | d·8 |
//! | Q4_K | 256 | 144 | 32 | 6 bits | dmin·min (6 bits) |
//! | Q5_K | 256 | 176 | 32 | 6 bits | dmin·min (6 bits) |
//! | Q6_K | 256 | 210 | 16 | i8 | d·scale·32 |

use half::f16;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

/// A block type of GGUF's that the products compute from as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockType {
    Q4_0,
    Q4K,
    Q5K,
    Q6K,
}

impl BlockType {
    /// Every type.
    pub const ALL: [BlockType; 4] = [
        BlockType::Q4_0,
        BlockType::Q4K,
        BlockType::Q5K,
        BlockType::Q6K,
    ];

    /// ggml's name of the type, lower-case: `q4_0`, `q4_k`, `q5_k`, `q6_k`.
    pub fn name(self) -> &'static str {
        match self {
            BlockType::Q4_0 => "q4_0",
            BlockType::Q4K => "q4_k",
            BlockType::Q5K => "q5_k",
            BlockType::Q6K => "q6_k",
        }
    }

    /// Weights a block holds.
    pub const fn weights(self) -> usize {
        match self {
            BlockType::Q4_0 => 32,
            _ => QK_K,
        }
    }

    /// Bytes a block takes.
    pub const fn bytes(self) -> usize {
        match self {
            BlockType::Q4_0 => 18,
            BlockType::Q4K => 144,
            BlockType::Q5K => 176,
            BlockType::Q6K => 210,
        }
    }

    /// Steps of x that share an activation scale: Q8_0's 32 for Q4_0, Q8_K's 256.
    pub fn x_group(self) -> usize {
        self.weights()
    }

    /// The byte ranges of a block's f16 scales (d, and dmin for Q4_K and Q5_K).
    pub fn scale_fields(self) -> &'static [usize] {
        match self {
            BlockType::Q4_0 => &[0],
            BlockType::Q4K | BlockType::Q5K => &[0, 2],
            BlockType::Q6K => &[208],
        }
    }
}

/// The f16 at the start of `b`, widened.
pub fn half(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// The 8 sub-blocks' 6-bit scales and mins of a Q4_K or Q5_K block, from its 12 bytes
/// at 4..16: sub-blocks 0..4 keep theirs in the low 6 bits of bytes j and j + 4;
/// 4..8 in the nibbles of byte j + 4, with their top 2 bits in the spare bits of bytes
/// j − 4 and j.
pub fn scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        (scales[j], mins[j]) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        };
    }
    (scales, mins)
}

/// A Q4_0 block's 32 codes (0..16): the low nibbles of its 16 code bytes are weights
/// 0..16, the high ones 16..32.
pub fn q4_0_codes(b: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (i, &byte) in b[2..18].iter().enumerate() {
        q[i] = byte & 0x0F;
        q[i + 16] = byte >> 4;
    }
    q
}

/// A Q4_K (`high` None) or Q5_K block's 256 codes: each 32 bytes of `low` hold two
/// sub-blocks, 2p in the low nibbles and 2p + 1 in the high ones; Q5_K's fifth bit of
/// weight l in sub-block s is bit s of `high[l]`.
pub fn k_codes(low: &[u8], high: Option<&[u8]>) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (p, bytes) in low.chunks_exact(32).enumerate() {
        for (l, &byte) in bytes.iter().enumerate() {
            let (h1, h2) = high.map_or((0, 0), |h| {
                ((h[l] >> (2 * p)) & 1, (h[l] >> (2 * p + 1)) & 1)
            });
            q[64 * p + l] = (byte & 0x0F) | (h1 << 4);
            q[64 * p + 32 + l] = (byte >> 4) | (h2 << 4);
        }
    }
    q
}

/// The codes of a Q4_K block (bytes 16..144).
pub fn q4_k_codes(b: &[u8]) -> [u8; QK_K] {
    k_codes(&b[16..144], None)
}

/// The codes of a Q5_K block (fifth bits at 16..48, nibbles at 48..176).
pub fn q5_k_codes(b: &[u8]) -> [u8; QK_K] {
    k_codes(&b[48..176], Some(&b[16..48]))
}

/// A Q6_K block's 256 codes (0..64): 128 bytes of low nibbles, 64 of high 2-bit
/// pairs. In each half of 128 weights, weight l + 32k (k = 0..4, l = 0..32) takes the
/// nibble (high for k ≥ 2) of low byte l + 32·(k mod 2) and bits 2k..2k+2 of high
/// byte l.
pub fn q6_k_codes(b: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let low = &b[64 * half..][..64];
        let high = &b[128 + 32 * half..][..32];
        for l in 0..32 {
            for k in 0..4 {
                let nibble = match k {
                    0 => low[l] & 0x0F,
                    1 => low[l + 32] & 0x0F,
                    2 => low[l] >> 4,
                    _ => low[l + 32] >> 4,
                };
                q[128 * half + l + 32 * k] = nibble | (((high[l] >> (2 * k)) & 3) << 4);
            }
        }
    }
    q
}

/// A Q6_K block's 16 signed scales, one per 16 weights (bytes 192..208).
pub fn q6_k_scales(b: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| b[192 + i] as i8)
}

impl std::fmt::Display for BlockType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
