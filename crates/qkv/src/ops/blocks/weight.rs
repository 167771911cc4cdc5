//! A `[N, K]` weight of whole blocks, row by row as a GGUF file stores it: row r is
//! `K / weights` blocks at `r · row_bytes`.

use super::dequant::dequantize_block;
use super::layout::{half, BlockType};
use crate::error::{Error, Result};
use crate::ops::matmul::SlabSource;
use crate::ops::stored::StoredWeight;

/// A weight in one [`BlockType`] (see the module documentation).
#[derive(Clone)]
pub struct BlockWeight {
    ty: BlockType,
    n: usize,
    k: usize,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for BlockWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ty, n, k) = (self.ty, self.n, self.k);
        write!(f, "BlockWeight {{ {ty:?}, n: {n}, k: {k} }}")
    }
}

impl BlockWeight {
    /// A `[n, k]` weight whose row r's blocks `row(r, dst)` copies into `dst`
    /// (`row_bytes` long), as stored: k must be a whole number of blocks, and every
    /// block's scales finite (an error names the row and block otherwise).
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
        let row_bytes = k / ty.weights() * ty.bytes();
        let mut bytes = vec![0u8; n * row_bytes];
        for (r, dst) in bytes.chunks_exact_mut(row_bytes).enumerate() {
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
        }
        Ok(BlockWeight { ty, n, k, bytes })
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

    /// Bytes one row's blocks take.
    pub fn row_bytes(&self) -> usize {
        self.k / self.ty.weights() * self.ty.bytes()
    }

    /// Row r's blocks.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes()..][..self.row_bytes()]
    }

    /// Bytes the blocks take.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Block b of row r, dequantized into `out` (`weights` long).
    fn block(&self, r: usize, b: usize, out: &mut [f32]) {
        let at = b * self.ty.bytes();
        dequantize_block(self.ty, &self.row(r)[at..][..self.ty.bytes()], out);
    }
}

impl StoredWeight for BlockWeight {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn element(&self, r: usize, c: usize) -> f32 {
        let mut out = vec![0.0; self.ty.weights()];
        self.block(r, c / self.ty.weights(), &mut out);
        out[c % self.ty.weights()]
    }

    fn widened(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.n * self.k];
        for (r, row) in out.chunks_exact_mut(self.k).enumerate() {
            for (b, o) in row.chunks_exact_mut(self.ty.weights()).enumerate() {
                self.block(r, b, o);
            }
        }
        out
    }
}

/// The weight as the f32 product's B operand (Wᵀ, `[K, N]`): each slab's blocks
/// dequantized into the packed layout as the product asks for them, one pass over the
/// weight a product (what more than a few rows take).
impl SlabSource for BlockWeight {
    fn pack_slab(&self, k0: usize, kc: usize, c0: usize, cols: usize, out: &mut [f32]) {
        const PANEL: usize = 16;
        assert!(c0.is_multiple_of(PANEL) && k0 + kc <= self.k && c0 + cols <= self.n);
        let panels = cols.div_ceil(PANEL);
        assert!(out.len() >= panels * kc * PANEL);
        let per = self.ty.weights();
        let mut block = vec![0.0f32; per];
        out[..panels * kc * PANEL].fill(0.0);
        for c in 0..cols {
            let dst = &mut out[(c / PANEL) * kc * PANEL + c % PANEL..];
            for b in k0 / per..(k0 + kc).div_ceil(per) {
                self.block(c0 + c, b, &mut block);
                let (from, to) = ((b * per).max(k0), ((b + 1) * per).min(k0 + kc));
                for p in from..to {
                    dst[(p - k0) * PANEL] = block[p - b * per];
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
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

    #[test]
    fn slabs_hold_the_weight_and_bad_blocks_are_refused() {
        for ty in BlockType::ALL {
            let k = 2 * 256;
            let w = random(ty, 37, k, 3);
            let slabs = [(0, k, 0, 37), (3, 300, 16, 21), (255, 2, 32, 5)];
            crate::ops::stored::checks::assert_slabs(&w, &slabs);
            let err = BlockWeight::from_rows(ty, 2, k, |_, dst| {
                dst.fill(0);
                dst[ty.scale_fields()[0] + 1] = 0x7c; // f16 infinity
            });
            assert!(err.unwrap_err().to_string().contains("block 0 of row 0"));
            assert!(BlockWeight::from_rows(ty, 2, k + 16, |_, _| ()).is_err());
        }
    }
}
