//! A `[N, K]` weight in 8-bit codes with scales, laid out for y = x·Wᵀ.
//!
//! Each row is cut into groups of K steps with one scale each ([`ScaleLayout`]):
//! W[r, c] ≈ q[r, c]·d[r, g]. The codes are stored biased, q + 128 as an unsigned byte,
//! because `vpdpbusd` multiplies unsigned bytes by signed ones: the weight is the
//! unsigned side and the activations, quantized on the fly, the signed one.
//!
//! Layout: N cut into panels of [`PANEL`] output columns (the last padded with zero
//! rows), K padded with zeros to whole groups and cut into quads of 4 steps. Panel j
//! holds, for each quad t, its 16 columns' quads: word `(j·quads + t)·16 + c` holds
//! q[16j + c, 4t + i] + 128 in byte i. A panel's quad row is 64 bytes, one AVX-512
//! vector, the operand of `vpdpbusd`. Panel j's scales are `(j·groups + g)·16 + c`.

use super::quant::{block_scale, quantize, BLOCK};
use crate::error::{Error, Result};
use crate::ops::matmul::check_weight;

/// Output columns of a panel.
pub const PANEL: usize = crate::weights::stored::PANEL;

/// Most K steps one scale covers: the i32 sums of a group, at most 255·127 a step,
/// must not overflow.
const MOST_STEPS: usize = 1 << 16;

/// How many K steps share a scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleLayout {
    /// One scale per [`BLOCK`] = 32 steps of a row, as GGUF's Q8_0 (whose f16 scales
    /// these f32 ones hold exactly). The activations are quantized per block of 32
    /// too, as llama.cpp does.
    Blocks,
    /// One scale per row (per 65536 steps of a longer row), and the activations one
    /// per row.
    Rows,
}

/// An int8 weight (see the module documentation).
#[derive(Clone)]
pub struct Int8Weight {
    n: usize,
    k: usize,
    layout: ScaleLayout,
    /// K steps per scale: 32, or K rounded up to a quad
    group: usize,
    codes: Vec<u32>,
    scales: Vec<f32>,
}

impl std::fmt::Debug for Int8Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, k, layout) = (self.n, self.k, self.layout);
        write!(f, "Int8Weight {{ n: {n}, k: {k}, {layout:?} }}")
    }
}

impl Int8Weight {
    /// Quantizes `w`, a row-major `[n, k]` f32 weight (n, k ≥ 1), group by group (in
    /// blocks exactly as llama.cpp's Q8_0 quantizer: [`block_scale`]). Errors when the
    /// lengths do not match.
    pub fn new(w: &[f32], n: usize, k: usize, layout: ScaleLayout) -> Result<Self> {
        check_weight("int8 weight", w.len(), n, k)?;
        let group = match layout {
            ScaleLayout::Blocks => BLOCK,
            ScaleLayout::Rows => k.next_multiple_of(4).min(MOST_STEPS),
        };
        let mut row = vec![0.0f32; k.next_multiple_of(group)];
        Self::from_groups(n, k, layout, group, |r, g, q| {
            if g == 0 {
                row[..k].copy_from_slice(&w[r * k..][..k]);
            }
            let d = quantize(&row[g * group..][..group], q);
            Ok(match layout {
                ScaleLayout::Blocks => block_scale(d),
                ScaleLayout::Rows => d,
            })
        })
    }

    /// A `[n, k]` weight already in Q8_0's form (k a multiple of [`BLOCK`]):
    /// `block(r, g, q)` writes the 32 codes of row r's block g into q and returns its
    /// scale, or an error that the load then reports. The codes are taken as they are
    /// (−128 included), so the product computes with exactly the stored weights.
    pub fn from_blocks(
        n: usize,
        k: usize,
        block: impl FnMut(usize, usize, &mut [i8]) -> Result<f32>,
    ) -> Result<Self> {
        if n == 0 || k == 0 || !k.is_multiple_of(BLOCK) {
            return Err(Error::invalid(
                "int8 weight",
                format!("[{n}, {k}] is not a shape of whole {BLOCK}-weight blocks"),
            ));
        }
        Self::from_groups(n, k, ScaleLayout::Blocks, BLOCK, block)
    }

    /// Lays out the codes and scales `fill(r, g, q)` gives for row r's group g (K
    /// padded with zero codes to whole groups, N with zero rows to whole panels).
    fn from_groups(
        n: usize,
        k: usize,
        layout: ScaleLayout,
        group: usize,
        mut fill: impl FnMut(usize, usize, &mut [i8]) -> Result<f32>,
    ) -> Result<Self> {
        let kq = k.next_multiple_of(group);
        let (groups, quads, panels) = (kq / group, kq / 4, n.div_ceil(PANEL));
        let mut codes = vec![0x8080_8080u32; panels * quads * PANEL];
        let mut scales = vec![0.0f32; panels * groups * PANEL];
        let mut q = vec![0i8; group];
        for r in 0..n {
            let (j, c) = (r / PANEL, r % PANEL);
            for g in 0..groups {
                scales[(j * groups + g) * PANEL + c] = fill(r, g, &mut q)?;
                for (i, &code) in q.iter().enumerate() {
                    let step = g * group + i;
                    let word = &mut codes[(j * quads + step / 4) * PANEL + c];
                    let shift = 8 * (step % 4);
                    let biased = u32::from((code as u8) ^ 0x80);
                    *word = (*word & !(0xff << shift)) | (biased << shift);
                }
            }
        }
        Ok(Int8Weight {
            n,
            k,
            layout,
            group,
            codes,
            scales,
        })
    }

    /// Rows of the weight: columns of the product.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns of the weight: the product's inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// How the scales are laid out.
    pub fn layout(&self) -> ScaleLayout {
        self.layout
    }

    /// K steps per scale.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Scales per row.
    pub fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }

    /// K padded to whole groups, in quads of 4 steps.
    pub fn quads(&self) -> usize {
        self.groups() * self.group / 4
    }

    /// Panels of [`PANEL`] columns.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Bytes the codes and scales take.
    pub fn bytes(&self) -> usize {
        (self.codes.len() + self.scales.len()) * 4
    }

    /// Panel j's codes: `quads · PANEL` words.
    pub(super) fn panel_codes(&self, j: usize) -> &[u32] {
        let len = self.quads() * PANEL;
        &self.codes[j * len..][..len]
    }

    /// Panel j's scales: `groups · PANEL`, group-major.
    pub(super) fn panel_scales(&self, j: usize) -> &[f32] {
        let len = self.groups() * PANEL;
        &self.scales[j * len..][..len]
    }

    /// q[r, c]: the code of W[r, c], unbiased.
    pub(super) fn code(&self, r: usize, c: usize) -> i8 {
        let word = self.panel_codes(r / PANEL)[(c / 4) * PANEL + r % PANEL];
        ((word >> (8 * (c % 4))) as u8 ^ 0x80) as i8
    }

    /// The scale of W[r, c].
    pub(super) fn scale(&self, r: usize, c: usize) -> f32 {
        self.panel_scales(r / PANEL)[(c / self.group) * PANEL + r % PANEL]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::stored::StoredWeight;

    #[test]
    fn holds_each_group_quantized_and_refuses_bad_weights() {
        // 19 rows: a second panel of 3; 45 columns: a last block of 13 steps
        let (n, k) = (19, 45);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
            let q = Int8Weight::new(&w, n, k, layout).unwrap();
            let got = q.widened();
            for r in 0..n {
                for (g, cols) in w[r * k..][..k].chunks(q.group()).enumerate() {
                    let mut codes = vec![0i8; cols.len()];
                    let mut d = quantize(cols, &mut codes);
                    if layout == ScaleLayout::Blocks {
                        d = block_scale(d);
                    }
                    for (i, &c) in codes.iter().enumerate() {
                        let at = r * k + g * q.group() + i;
                        assert_eq!(got[at], f32::from(c) * d, "{layout:?} [{r}, {at}]");
                    }
                }
            }
        }
        let blocks = Int8Weight::new(&w, n, k, ScaleLayout::Blocks).unwrap();
        assert_eq!(
            (blocks.panels(), blocks.groups(), blocks.quads()),
            (2, 2, 16)
        );
        // the padding is zero codes (128 biased) on zero scales
        assert_eq!(blocks.panel_codes(1)[15 * PANEL + 3], 0x8080_8080);
        assert_eq!(blocks.panel_scales(1)[PANEL + 3], 0.0);
        assert!(Int8Weight::new(&w, n, k + 1, ScaleLayout::Rows).is_err());
        assert!(Int8Weight::new(&[], 0, 3, ScaleLayout::Rows).is_err());
    }
}
