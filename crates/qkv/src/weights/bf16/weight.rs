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
use crate::ops::isa::Isa;
use crate::ops::matmul::check_weight;
use rayon::prelude::*;

/// Output columns of a panel.
pub const PANEL: usize = crate::weights::stored::PANEL;

/// Words below which a packing task is not worth handing to another thread.
const PARALLEL_WORDS: usize = 1 << 15;

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
        Ok(Self::build(n, k, Source::Rows(w)))
    }

    /// The bf16 weight of aᵀ, for a row-major `[rows, cols]` f32 matrix a (rows, cols
    /// ≥ 1): `[cols, rows]`, read from a in place. A layer's backward reads its weight
    /// `[out, in]` this way (dx = dy·W is a product with the weight Wᵀ), and its input
    /// x `[N, in]` (dW = dyᵀ·x is one with the weight xᵀ).
    pub fn transposed(a: &[f32], rows: usize, cols: usize) -> Result<Self> {
        check_weight("bf16 transposed weight", a.len(), cols, rows)?;
        Ok(Self::build(cols, rows, Source::Columns(a)))
    }

    /// The `[n, k]` weight read from `source`, rounded. Panels are filled in parallel:
    /// mixed-precision training packs every layer's input and weight this way each
    /// step, and a serial, scalar packing took a fifth of the step while the other
    /// threads waited.
    fn build(n: usize, k: usize, source: Source<'_>) -> Self {
        let pairs = k.div_ceil(2);
        let panels = n.div_ceil(PANEL);
        let mut words = vec![0u32; panels * pairs * PANEL];
        let isa = Isa::detect();
        words
            .par_chunks_mut(pairs * PANEL)
            .enumerate()
            .with_min_len(PARALLEL_WORDS.div_ceil(pairs * PANEL))
            .for_each(|(j, panel)| fill_panel(isa, source, (n, k), j, panel));
        Bf16Weight { n, k, words }
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

    /// W[r, c] as the products read it.
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let word = self.panel(r / PANEL)[(c / 2) * PANEL + r % PANEL];
        bf16_to_f32(if c.is_multiple_of(2) {
            word as u16
        } else {
            (word >> 16) as u16
        })
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

/// Where a weight's elements are read from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// The weight, row-major `[n, k]`.
    Rows(&'a [f32]),
    /// Its transpose, row-major `[k, n]`: a panel's pair row is two runs of 16 along
    /// a's rows 2p and 2p + 1.
    Columns(&'a [f32]),
}

/// Panel j of an `[n, k]` weight (`⌈k/2⌉ · PANEL` words, zero on entry), compiled for
/// `isa`, so that the rounding and pairing run a vector wide.
fn fill_panel(isa: Isa, source: Source<'_>, nk: (usize, usize), j: usize, panel: &mut [u32]) {
    match isa {
        // SAFETY: `isa` is this CPU's (Isa::detect), or one of Isa::available in tests.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { fill_avx512(source, nk, j, panel) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { fill_avx2(source, nk, j, panel) },
        _ => fill_body(source, nk, j, panel),
    }
}

/// [`fill_panel`] compiled for AVX-512.
///
/// # Safety
/// AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn fill_avx512(source: Source<'_>, nk: (usize, usize), j: usize, panel: &mut [u32]) {
    fill_body(source, nk, j, panel)
}

/// [`fill_panel`] compiled for AVX2.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2(source: Source<'_>, nk: (usize, usize), j: usize, panel: &mut [u32]) {
    fill_body(source, nk, j, panel)
}

#[inline(always)]
fn fill_body(source: Source<'_>, (n, k): (usize, usize), j: usize, panel: &mut [u32]) {
    let c0 = j * PANEL;
    let width = PANEL.min(n - c0);
    for (p, line) in panel.chunks_exact_mut(PANEL).enumerate() {
        let line = &mut line[..width];
        match source {
            Source::Columns(a) => {
                let low = &a[2 * p * n + c0..][..width];
                match a.get((2 * p + 1) * n + c0..) {
                    Some(high) if 2 * p + 1 < k => {
                        for ((word, &l), &h) in line.iter_mut().zip(low).zip(&high[..width]) {
                            *word = pair(l, h);
                        }
                    }
                    _ => line
                        .iter_mut()
                        .zip(low)
                        .for_each(|(w, &l)| *w = pair(l, 0.0)),
                }
            }
            Source::Rows(w) => {
                for (c, word) in line.iter_mut().enumerate() {
                    let row = &w[(c0 + c) * k..][..k];
                    let high = row.get(2 * p + 1).copied().unwrap_or(0.0);
                    *word = pair(row[2 * p], high);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::bf16::convert::round_to_bf16;
    use crate::weights::stored::StoredWeight;

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

    #[test]
    fn a_transposed_weight_holds_the_transpose_rounded() {
        // a [5, 19]: its transpose [19, 5] has a second panel of 3 and an odd K
        let (rows, cols) = (5, 19);
        let a: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 * 0.61).cos() * 2.0)
            .collect();
        let t = Bf16Weight::transposed(&a, rows, cols).unwrap();
        assert_eq!((t.n(), t.k()), (cols, rows));
        let mut at = vec![0.0; cols * rows];
        for (r, row) in a.chunks_exact(cols).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                at[c * rows + r] = round_to_bf16(v);
            }
        }
        assert_eq!(t.widened(), at);
        for isa in Isa::available() {
            let mut panel = vec![0u32; t.pairs() * PANEL];
            fill_panel(isa, Source::Columns(&a), (cols, rows), 1, &mut panel);
            assert_eq!(panel, t.panel(1), "{isa:?}");
            fill_panel(isa, Source::Rows(&at), (cols, rows), 1, &mut panel);
            assert_eq!(panel, t.panel(1), "{isa:?}");
        }
        assert!(Bf16Weight::transposed(&a, rows, cols + 1).is_err());
        assert!(Bf16Weight::transposed(&[], 0, 4).is_err());
    }
}
