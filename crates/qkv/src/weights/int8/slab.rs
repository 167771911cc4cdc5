//! An int8 weight as the f32 product's B operand (Wᵀ, `[K, N]`): each slab dequantized
//! (q·d) into the packed layout as the product asks for it. Where `vpdpbusd` is
//! missing (AVX2) the product runs on the f32 micro-kernel having read the weight at a
//! quarter of f32's bytes; the dequantizing costs one pass over the weight a product.

use super::weight::{Int8Weight, PANEL};
use crate::ops::matmul::SlabSource;

impl SlabSource for Int8Weight {
    fn pack_slab(&self, k0: usize, kc: usize, c0: usize, cols: usize, out: &mut [f32]) {
        assert!(c0.is_multiple_of(PANEL) && k0 + kc <= self.k() && c0 + cols <= self.n());
        let panels = cols.div_ceil(PANEL);
        assert!(out.len() >= panels * kc * PANEL);
        let group = self.group();
        for (jj, dst) in out.chunks_exact_mut(kc * PANEL).take(panels).enumerate() {
            let (codes, scales) = (
                self.panel_codes(c0 / PANEL + jj),
                self.panel_scales(c0 / PANEL + jj),
            );
            for (i, line) in dst.chunks_exact_mut(PANEL).enumerate() {
                let p = k0 + i;
                let words = &codes[(p / 4) * PANEL..][..PANEL];
                let ds = &scales[(p / group) * PANEL..][..PANEL];
                let shift = 8 * (p % 4);
                // padding rows hold code 0 (128 biased) and scale 0: zeros
                for ((v, &word), &d) in line.iter_mut().zip(words).zip(ds) {
                    let code = ((word >> shift) & 0xff) as i32 - 128;
                    *v = code as f32 * d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::weight::ScaleLayout;
    use super::*;

    /// Every slab holds W's elements, q·d, where the packed layout puts them, and zeros
    /// past the last column.
    #[test]
    fn slabs_hold_the_weight_in_the_packed_layout() {
        let (n, k) = (37, 45);
        let wf: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.71).cos()).collect();
        let w = Int8Weight::new(&wf, n, k, ScaleLayout::Blocks).unwrap();
        let slabs = [(0, 45, 0, 37), (3, 33, 16, 21), (31, 2, 32, 5)];
        crate::weights::stored::checks::assert_slabs(&w, &slabs);
    }
}
