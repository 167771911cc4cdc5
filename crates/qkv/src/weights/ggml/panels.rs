//! A weight's blocks laid out in panels of 16 rows for the tile kernels: each
//! super-block of a panel (a "panel block", 16 rows × the type's super-block of
//! steps) holds its rows' codes interleaved so that one 64-byte vector carries the
//! same 4 steps of all 16 rows, one row a 32-bit lane, as `vpdpbusd` multiplies them.
//! The bits are the file's: codes, 6-bit or 8-bit scales and mins, f16 scales widened
//! to f32 (exactly). A panel block, in order:
//!
//! | part | size | what |
//! |---|---|---|
//! | nibbles | units × 4 × 64 B | per unit of 32 steps, vector p (0..4): byte 4c + i holds, of row c, step 4p + i in its low nibble and step 16 + 4p + i in its high one |
//! | high bits | units × H × 64 B | Q5_K (H = 1): bit t of byte 4c + i is the fifth bit of step 4t + i; Q6_K (H = 2): vector h, bits 2m..2m + 2 of byte 4c + i are the top bits of step 4(4h + m) + i |
//! | scales | groups × 16 B | one signed byte a row: per 32 steps (Q4_K, Q5_K) or per 16 (Q6_K); none for Q4_0 |
//! | mins | 4 × 64 B | Q4_K and Q5_K, a min per 32 steps: vector m, lane c holds row c's mins of sub-blocks 2m and 2m + 1 as two i16, as `vpdpwssd` pairs them |
//! | d | 16 × f32 | a row's scale of the super-block |
//! | dmin | 16 × f32 | Q4_K and Q5_K |
//!
//! Rows past N in the last panel are zero codes on zero scales.

use super::layout::{
    half, q4_0_codes, q4_k_codes, q5_k_codes, q6_k_codes, q6_k_scales, scales_mins, BlockType,
};

/// Rows of a panel: the lanes of a 512-bit vector of i32.
pub const PANEL: usize = crate::weights::stored::PANEL;

/// Bytes of one vector of a panel block.
pub const VECTOR: usize = 64;

/// Where each part of a panel block of one type starts, and its size.
#[derive(Clone, Copy, Debug)]
pub struct Parts {
    /// units of 32 steps a super-block
    pub units: usize,
    /// high-bit vectors a unit
    pub high_per_unit: usize,
    /// scale groups a super-block (each 16 bytes)
    pub groups: usize,
    pub has_mins: bool,
    pub high: usize,
    pub scales: usize,
    pub mins: usize,
    pub d: usize,
    pub dmin: usize,
    pub bytes: usize,
}

impl Parts {
    pub const fn of(ty: BlockType) -> Parts {
        let (units, high_per_unit, groups, has_mins) = match ty {
            BlockType::Q4_0 => (1, 0, 0, false),
            BlockType::Q4K => (8, 0, 8, true),
            BlockType::Q5K => (8, 1, 8, true),
            BlockType::Q6K => (8, 2, 16, false),
        };
        let high = units * 4 * VECTOR;
        let scales = high + units * high_per_unit * VECTOR;
        let mins = scales + groups * PANEL;
        let d = mins + if has_mins { 4 * VECTOR } else { 0 };
        let dmin = d + 4 * PANEL;
        let bytes = dmin + if has_mins { 4 * PANEL } else { 0 };
        Parts {
            units,
            high_per_unit,
            groups,
            has_mins,
            high,
            scales,
            mins,
            d,
            dmin,
            bytes,
        }
    }
}

/// One stored block unpacked: codes (unsigned), a signed scale per group, a min per
/// 32 steps, d and dmin.
struct Unpacked {
    codes: Vec<u8>,
    scales: Vec<i8>,
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

fn unpack(ty: BlockType, b: &[u8]) -> Unpacked {
    match ty {
        BlockType::Q4_0 => Unpacked {
            codes: q4_0_codes(b).to_vec(),
            scales: Vec::new(),
            mins: [0; 8],
            d: half(b),
            dmin: 0.0,
        },
        BlockType::Q4K | BlockType::Q5K => {
            let codes = if ty == BlockType::Q4K {
                q4_k_codes(b)
            } else {
                q5_k_codes(b)
            };
            let (scales, mins) = scales_mins(&b[4..16]);
            Unpacked {
                codes: codes.to_vec(),
                scales: scales.iter().map(|&s| s as i8).collect(),
                mins,
                d: half(b),
                dmin: half(&b[2..]),
            }
        }
        BlockType::Q6K => Unpacked {
            codes: q6_k_codes(b).to_vec(),
            scales: q6_k_scales(b).to_vec(),
            mins: [0; 8],
            d: half(&b[208..]),
            dmin: 0.0,
        },
    }
}

/// The panels of a `[n, k]` weight, from its rows of stored blocks: `row(r, dst)`
/// writes row r's blocks into `dst` (one row's bytes, reused from row to row), or
/// fails, which ends the build with its error.
pub fn build<E>(
    ty: BlockType,
    n: usize,
    k: usize,
    mut row: impl FnMut(usize, &mut [u8]) -> Result<(), E>,
) -> Result<Vec<u8>, E> {
    let p = Parts::of(ty);
    let blocks = k / ty.weights();
    let mut out = vec![0u8; n.div_ceil(PANEL) * blocks * p.bytes];
    let mut stored = vec![0u8; blocks * ty.bytes()];
    for r in 0..n {
        let (j, c) = (r / PANEL, r % PANEL);
        row(r, &mut stored)?;
        for b in 0..blocks {
            let u = unpack(ty, &stored[b * ty.bytes()..][..ty.bytes()]);
            let pb = &mut out[(j * blocks + b) * p.bytes..][..p.bytes];
            for (step, &q) in u.codes.iter().enumerate() {
                let (unit, t, i) = (step / 32, (step % 32) / 4, step % 4);
                let at = (unit * 4 + t % 4) * VECTOR + 4 * c + i;
                pb[at] |= (q & 0x0F) << (4 * (t / 4));
                let top = q >> 4;
                match p.high_per_unit {
                    1 => pb[p.high + unit * VECTOR + 4 * c + i] |= top << t,
                    2 => {
                        let at = p.high + (2 * unit + t / 4) * VECTOR + 4 * c + i;
                        pb[at] |= top << (2 * (t % 4));
                    }
                    _ => {}
                }
            }
            for (g, &s) in u.scales.iter().enumerate() {
                pb[p.scales + g * PANEL + c] = s as u8;
            }
            if p.has_mins {
                for (s, &m) in u.mins.iter().enumerate() {
                    pb[min_at(&p, c, s)] = m;
                }
                pb[p.dmin + 4 * c..][..4].copy_from_slice(&u.dmin.to_le_bytes());
            }
            pb[p.d + 4 * c..][..4].copy_from_slice(&u.d.to_le_bytes());
        }
    }
    Ok(out)
}

/// Row c's code of `step` (within the super-block) in the panel block `pb`.
pub fn code(ty: BlockType, pb: &[u8], c: usize, step: usize) -> u8 {
    let p = Parts::of(ty);
    let (unit, t, i) = (step / 32, (step % 32) / 4, step % 4);
    let low = (pb[(unit * 4 + t % 4) * VECTOR + 4 * c + i] >> (4 * (t / 4))) & 0x0F;
    let top = match p.high_per_unit {
        1 => (pb[p.high + unit * VECTOR + 4 * c + i] >> t) & 1,
        2 => (pb[p.high + (2 * unit + t / 4) * VECTOR + 4 * c + i] >> (2 * (t % 4))) & 3,
        _ => 0,
    };
    low | (top << 4)
}

/// Where row c's min of sub-block s lies: the low byte of its i16 (the high byte is 0,
/// mins having 6 bits).
pub fn min_at(p: &Parts, c: usize, s: usize) -> usize {
    p.mins + (s / 2) * VECTOR + 4 * c + 2 * (s % 2)
}

/// A little-endian f32 of lane c of the part at `at`.
pub fn lane_f32(pb: &[u8], at: usize, c: usize) -> f32 {
    f32::from_le_bytes(pb[at + 4 * c..][..4].try_into().expect("4 bytes"))
}

/// Row c's weight at `step` of the panel block `pb`, in the twin's order of operations
/// ([`super::dequant`]), so that it equals the twin's bit for bit.
pub fn weight(ty: BlockType, pb: &[u8], c: usize, step: usize) -> f32 {
    let p = Parts::of(ty);
    let q = code(ty, pb, c, step);
    let d = lane_f32(pb, p.d, c);
    match ty {
        BlockType::Q4_0 => d * (q as f32 - 8.0),
        BlockType::Q4K | BlockType::Q5K => {
            let sc = pb[p.scales + (step / 32) * PANEL + c] as f32;
            let m = pb[min_at(&p, c, step / 32)] as f32;
            d * sc * q as f32 - lane_f32(pb, p.dmin, c) * m
        }
        BlockType::Q6K => {
            let sc = pb[p.scales + (step / 16) * PANEL + c] as i8;
            d * sc as f32 * (q as i32 - 32) as f32
        }
    }
}
