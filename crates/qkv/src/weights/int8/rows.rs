//! Activations quantized on the fly: each row of x `[rows, K]` cut into the weight's
//! groups, one scale a group ([`super::quant`]), as the signed side of the products.

use super::kernel::XRow;
use super::quant::{block_scale, quantize_groups};
use super::weight::{Int8Weight, ScaleLayout};
use rayon::prelude::*;

/// Rows from which quantizing x is worth spreading over the pool.
const PARALLEL_ROWS: usize = 64;

/// One row's input and codes, and its scales and offsets, as the quantizing pass zips them.
type RowIn<'a> = (&'a [f32], &'a mut [i8]);
type RowOut<'a> = (&'a mut [f32], &'a mut [i32]);

/// x `[rows, K]` in codes, for one weight's groups.
pub(super) struct QuantizedRows {
    /// K padded to whole groups
    pub width: usize,
    pub group: usize,
    /// `[rows, width]`, zeros past K
    pub codes: Vec<i8>,
    /// `[rows, groups]`
    pub scales: Vec<f32>,
    /// `[rows, groups]`: 128 · Σ codes of the group, what the weights' bias of 128
    /// adds to each sum (Σ (q_w + 128)·q_x = Σ q_w·q_x + 128·Σ q_x)
    pub offsets: Vec<i32>,
}

impl QuantizedRows {
    /// Quantizes x `[rows, w.k()]` in `w`'s groups (in blocks, their scales as Q8_0
    /// stores them: [`block_scale`]), the rows spread over the pool when
    /// `parallel` (a batch of prompts is a few thousand rows: a pass over x that would
    /// otherwise leave the other threads waiting).
    pub fn new(x: &[f32], rows: usize, w: &Int8Weight, parallel: bool) -> Self {
        let (k, group) = (w.k(), w.group());
        assert_eq!(x.len(), rows * k);
        let width = w.quads() * 4;
        let groups = width / group;
        let blocks = w.layout() == ScaleLayout::Blocks;
        let mut codes = vec![0i8; rows * width];
        let mut scales = vec![0.0f32; rows * groups];
        let mut offsets = vec![0i32; rows * groups];
        let one_row = |((src, q), (s, o)): (RowIn, RowOut)| {
            quantize_groups(src, group, &mut q[..k], s, o);
            if blocks {
                s.iter_mut().for_each(|d| *d = block_scale(*d));
            }
            o.iter_mut().for_each(|sum| *sum *= 128);
        };
        if parallel && rows >= PARALLEL_ROWS {
            x.par_chunks_exact(k)
                .zip(codes.par_chunks_exact_mut(width))
                .zip(
                    scales
                        .par_chunks_exact_mut(groups)
                        .zip(offsets.par_chunks_exact_mut(groups)),
                )
                .with_min_len(PARALLEL_ROWS / 2)
                .for_each(one_row);
        } else {
            x.chunks_exact(k)
                .zip(codes.chunks_exact_mut(width))
                .zip(
                    scales
                        .chunks_exact_mut(groups)
                        .zip(offsets.chunks_exact_mut(groups)),
                )
                .for_each(one_row);
        }
        QuantizedRows {
            width,
            group,
            codes,
            scales,
            offsets,
        }
    }

    /// Scales per row.
    pub fn groups(&self) -> usize {
        self.width / self.group
    }

    /// Row r.
    pub fn row(&self, r: usize) -> XRow<'_> {
        let g = self.groups();
        XRow {
            codes: &self.codes[r * self.width..][..self.width],
            scales: &self.scales[r * g..][..g],
            offsets: &self.offsets[r * g..][..g],
        }
    }

    /// x as the product reads it, `[rows, k]`: q·d.
    pub fn dequantized(&self, k: usize) -> Vec<f32> {
        let rows = self.scales.len() / self.groups();
        let mut out = Vec::with_capacity(rows * k);
        for r in 0..rows {
            let XRow { codes, scales, .. } = self.row(r);
            out.extend((0..k).map(|c| f32::from(codes[c]) * scales[c / self.group]));
        }
        out
    }
}
