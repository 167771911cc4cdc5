//! A `[N, K]` weight of whole blocks, taken from a GGUF file's rows and laid out in
//! panels of 16 rows for the tile kernels ([`super::panels`]): the file's bits,
//! interleaved.

use super::layout::{half, BlockType};
use super::panels::{self, Parts, PANEL};
use crate::error::{Error, Result};
use crate::ops::matmul::SlabSource;
use crate::weights::stored::StoredWeight;

/// A weight in one [`BlockType`] (see the module documentation).
#[derive(Clone)]
pub struct BlockWeight {
    ty: BlockType,
    n: usize,
    k: usize,
    /// panel j's blocks at `j · blocks · parts.bytes`, super-block by super-block
    panels: Vec<u8>,
}

impl std::fmt::Debug for BlockWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ty, n, k) = (self.ty, self.n, self.k);
        write!(f, "BlockWeight {{ {ty:?}, n: {n}, k: {k} }}")
    }
}

impl BlockWeight {
    /// A `[n, k]` weight whose row r's blocks `row(r, dst)` copies into `dst`
    /// (`k / weights · bytes` long), as stored: k must be a whole number of blocks, and
    /// every block's scales finite (an error names the row and block otherwise).
    pub fn from_rows(
        ty: BlockType,
        n: usize,
        k: usize,
        mut row: impl FnMut(usize, &mut [u8]),
    ) -> Result<Self> {
        if n == 0 || k == 0 || !k.is_multiple_of(ty.weights()) {
            return Err(Error::invalid(
                "block weight",
                format!(
                    "[{n}, {k}] is not a shape of whole {}-weight {} blocks",
                    ty.weights(),
                    ty.name()
                ),
            ));
        }
        let panels = panels::build(ty, n, k, |r, dst| {
            row(r, dst);
            for (b, block) in dst.chunks_exact(ty.bytes()).enumerate() {
                for &at in ty.scale_fields() {
                    let d = half(&block[at..]);
                    if !d.is_finite() {
                        return Err(Error::invalid(
                            "block weight",
                            format!("block {b} of row {r} has the scale {d}"),
                        ));
                    }
                }
            }
            Ok(())
        })?;
        Ok(BlockWeight { ty, n, k, panels })
    }

    pub fn ty(&self) -> BlockType {
        self.ty
    }

    /// Rows of the weight: columns of the product.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns of the weight: the product's inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Panels of [`PANEL`] rows.
    pub fn panel_count(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Panel j's blocks.
    pub(super) fn panel(&self, j: usize) -> &[u8] {
        let len = self.k / self.ty.weights() * Parts::of(self.ty).bytes;
        &self.panels[j * len..][..len]
    }

    /// Bytes the panels take.
    pub fn bytes(&self) -> usize {
        self.panels.len()
    }
}

/// The weight as the f32 product's B operand (Wᵀ, `[K, N]`): each slab's weights
/// dequantized into the packed layout as the product asks for them.
impl SlabSource for BlockWeight {
    fn pack_slab(&self, k0: usize, kc: usize, c0: usize, cols: usize, out: &mut [f32]) {
        assert!(c0.is_multiple_of(PANEL) && k0 + kc <= self.k && c0 + cols <= self.n);
        let panels = cols.div_ceil(PANEL);
        assert!(out.len() >= panels * kc * PANEL);
        out[..panels * kc * PANEL].fill(0.0);
        for c in 0..cols {
            let dst = &mut out[(c / PANEL) * kc * PANEL + c % PANEL..];
            for p in 0..kc {
                dst[p * PANEL] = self.element(c0 + c, k0 + p);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Random blocks with sane scales (f16 d and dmin of about 1e-3).
    pub(crate) fn random(ty: BlockType, n: usize, k: usize, seed: u64) -> BlockWeight {
        let mut rng = crate::rng::Rng::new(seed);
        BlockWeight::from_rows(ty, n, k, |_, dst| {
            for block in dst.chunks_exact_mut(ty.bytes()) {
                for b in block.iter_mut() {
                    *b = (rng.uniform() * 256.0) as u8;
                }
                for &at in ty.scale_fields() {
                    let d = half::f16::from_f64(1e-3 * (0.5 + rng.uniform()));
                    block[at..at + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
        })
        .unwrap()
    }

    /// The panels hold the stored blocks' weights bit for bit as the twin dequantizes
    /// them, the slabs hold them where the packed layout puts them, and bad blocks are
    /// refused.
    #[test]
    fn panels_hold_the_stored_weights_and_bad_blocks_are_refused() {
        for ty in BlockType::ALL {
            let k = 2 * 256;
            let (n, row_bytes) = (37, k / ty.weights() * ty.bytes());
            let mut rng = crate::rng::Rng::new(9);
            let stored: Vec<u8> = (0..n * row_bytes)
                .map(|_| (rng.uniform() * 256.0) as u8)
                .collect();
            let w = BlockWeight::from_rows(ty, n, k, |r, dst| {
                dst.copy_from_slice(&stored[r * row_bytes..][..row_bytes]);
                for block in dst.chunks_exact_mut(ty.bytes()) {
                    for &at in ty.scale_fields() {
                        block[at + 1] &= 0x3f; // finite f16 scales
                    }
                }
            })
            .unwrap();
            let got = w.widened();
            let mut want = vec![0.0f32; k];
            for r in 0..n {
                let mut row = stored[r * row_bytes..][..row_bytes].to_vec();
                for block in row.chunks_exact_mut(ty.bytes()) {
                    for &at in ty.scale_fields() {
                        block[at + 1] &= 0x3f;
                    }
                }
                super::super::dequant::dequantize(ty, &row, &mut want);
                let same = got[r * k..][..k]
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty:?} row {r}");
            }
            let slabs = [(0, k, 0, 37), (3, 300, 16, 21), (255, 2, 32, 5)];
            crate::weights::stored::checks::assert_slabs(&w, &slabs);
            let err = BlockWeight::from_rows(ty, 2, k, |_, dst| {
                dst.fill(0);
                dst[ty.scale_fields()[0] + 1] = 0x7c; // f16 infinity
            });
            assert!(err.unwrap_err().to_string().contains("block 0 of row 0"));
            assert!(BlockWeight::from_rows(ty, 2, k + 16, |_, _| ()).is_err());
        }
    }
}
