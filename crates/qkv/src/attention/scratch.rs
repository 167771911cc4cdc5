//! What a task of the tiled kernels ([`super::tiled`], [`super::tiled_bf16`]) works in:
//! the key block's width, the rows a task takes and the per-thread buffers.

use crate::ops::aligned::AlignedBuf;

/// Keys per block (a whole number of panels).
pub(super) const BLOCK_K: usize = 128;

/// The query rows one task computes: rows `i0..i0 + rows` of head h in batch b.
#[derive(Clone, Copy, Debug)]
pub(super) struct QueryRows {
    pub b: usize,
    pub h: usize,
    pub i0: usize,
    pub rows: usize,
}

/// Per-thread working space, allocated once per rayon worker and reused across tasks;
/// `rows` query rows a task.
pub(super) struct Scratch {
    /// [rows, BLOCK_K] scores, then probabilities
    pub tile: AlignedBuf,
    /// [rows, Dv]
    pub acc: AlignedBuf,
    /// [rows] running max, sum, and this block's rescale factor
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    pub corr: Vec<f32>,
    /// [rows, D] the block's query rows, contiguous (the bf16 products only)
    pub q_rows: Vec<f32>,
}
