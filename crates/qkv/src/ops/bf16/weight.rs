//! A `[N, K]` weight in bf16, laid out for y = x·Wᵀ.
//!
//! Layout: N cut into panels of [`PANEL`] output columns (the last one padded with
//! zero columns), K into ⌈K/2⌉ pairs (an odd K padded with a zero). Panel j holds, for
//! each pair p, its 16 columns' pairs: word `(j·pairs + p)·16 + c` is
//! (W[16j + c, 2p], W[16j + c, 2p + 1]) as two bf16, the first in the low half. A
//! panel's pair row is 64 bytes: one AVX-512 vector, the operand of `vdpbf16ps`, read
//! in order by both products.

use super::convert::{bf16_to_f32, pair};
use crate::error::Result;
use crate::ops::matmul::check_weight;
use crate::ops::stored::StoredWeight;

/// Output columns of a panel.
pub const PANEL: usize = 16;

/// A bf16 weight (see the module documentation).
#[derive(Clone)]
pub struct Bf16Weight {
    n: usize,
    k: usize,
    words: Vec<u32>,
}

impl std::fmt::Debug for Bf16Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bf16Weight {{ n: {}, k: {} }}", self.n, self.k)
    }
}

impl Bf16Weight {
    /// Rounds `w`, a row-major `[n, k]` f32 weight (n, k ≥ 1), to bf16.
    pub fn new(w: &[f32], n: usize, k: usize) -> Result<Self> {
        check_weight("bf16 weight", w.len(), n, k)?;
        let pairs = k.div_ceil(2);
        let panels = n.div_ceil(PANEL);
        let mut words = vec![0u32; panels * pairs * PANEL];
        let at = |r: usize, c: usize| if c < k { w[r * k + c] } else { 0.0 };
        for (j, panel) in words.chunks_exact_mut(pairs * PANEL).enumerate() {
            for (p, line) in panel.chunks_exact_mut(PANEL).enumerate() {
                for (c, word) in line.iter_mut().enumerate() {
                    let r = j * PANEL + c;
                    if r < n {
                        *word = pair(at(r, 2 * p), at(r, 2 * p + 1));
                    }
                }
            }
        }
        Ok(Bf16Weight { n, k, words })
    }

    /// Rows of the weight: columns of the product.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns of the weight: the product's inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// K in pairs, the last one padded when K is odd.
    pub fn pairs(&self) -> usize {
        self.k.div_ceil(2)
    }

    /// Panels of [`PANEL`] columns.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Bytes the weight takes.
    pub fn bytes(&self) -> usize {
        self.words.len() * 4
    }

    /// Panel j's words: `pairs · PANEL` of them.
    pub(super) fn panel(&self, j: usize) -> &[u32] {
        let len = self.pairs() * PANEL;
        &self.words[j * len..][..len]
    }

    /// Rows `r0..r0 + count` widened to f32 into `out`, row-major `[count, k]`.
    pub fn widen_rows(&self, r0: usize, count: usize, out: &mut [f32]) {
        assert!(r0 + count <= self.n && out.len() == count * self.k);
        for (i, row) in out.chunks_exact_mut(self.k).enumerate() {
            let r = r0 + i;
            let panel = self.panel(r / PANEL);
            for (p, pair) in row.chunks_mut(2).enumerate() {
                let word = panel[p * PANEL + r % PANEL];
                pair[0] = bf16_to_f32(word as u16);
                if let Some(odd) = pair.get_mut(1) {
                    *odd = bf16_to_f32((word >> 16) as u16);
                }
            }
        }
    }
}

impl StoredWeight for Bf16Weight {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn element(&self, r: usize, c: usize) -> f32 {
        let word = self.panel(r / PANEL)[(c / 2) * PANEL + r % PANEL];
        bf16_to_f32(if c.is_multiple_of(2) {
            word as u16
        } else {
            (word >> 16) as u16
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::bf16::convert::round_to_bf16;

    #[test]
    fn holds_each_weight_rounded_once_and_refuses_bad_shapes() {
        // 19 rows: a second panel of 3; 7 columns: an odd K
        let (n, k) = (19, 7);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let b = Bf16Weight::new(&w, n, k).unwrap();
        assert_eq!((b.panels(), b.pairs(), b.bytes()), (2, 4, 2 * 4 * 16 * 4));
        let want: Vec<f32> = w.iter().map(|&x| round_to_bf16(x)).collect();
        assert_eq!(b.widened(), want);
        // the padding is zeros
        assert_eq!(b.panel(1)[3 * PANEL + 2] >> 16, 0);
        assert_eq!(b.panel(1)[4], 0);
        assert!(Bf16Weight::new(&w, n, k + 1).is_err());
        assert!(Bf16Weight::new(&[], 0, 3).is_err());
    }
}
