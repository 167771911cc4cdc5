//! A bf16 weight as the f32 product's B operand (Wᵀ, `[K, N]`): each slab widened into
//! the packed layout as the product asks for it, two K steps per weight word (the
//! low bf16 to step 2q, the high one to 2q + 1), a shift or a mask per 16 columns. The
//! product then runs on the f32 micro-kernel at its own speed, having read the weight
//! at half the bytes; the widening costs one pass over the weight per product.

use super::convert::bf16_to_f32;
use super::weight::{Bf16Weight, PANEL};
use crate::ops::isa::Isa;
use crate::ops::matmul::SlabSource;

impl SlabSource for Bf16Weight {
    fn pack_slab(&self, k0: usize, kc: usize, c0: usize, cols: usize, out: &mut [f32]) {
        assert!(c0.is_multiple_of(PANEL) && k0 + kc <= self.k() && c0 + cols <= self.n());
        let panels = cols.div_ceil(PANEL);
        assert!(out.len() >= panels * kc * PANEL);
        let isa = Isa::detect();
        for (jj, dst) in out.chunks_exact_mut(kc * PANEL).take(panels).enumerate() {
            let words = self.panel(c0 / PANEL + jj);
            if k0 % 2 == 1 || isa == Isa::Portable {
                widen_plain(words, k0, kc, dst);
                continue;
            }
            // whole pairs first, then a lone last step when kc is odd
            let pairs = kc / 2;
            let from = &words[k0 / 2 * PANEL..][..pairs * PANEL];
            widen_pairs_on(isa, from, &mut dst[..2 * pairs * PANEL]);
            if kc % 2 == 1 {
                widen_plain(words, k0 + kc - 1, 1, &mut dst[(kc - 1) * PANEL..]);
            }
        }
    }
}

/// Steps `k0..k0 + kc` of one panel, element by element: the twin of the vector form.
fn widen_plain(words: &[u32], k0: usize, kc: usize, dst: &mut [f32]) {
    for (i, line) in dst.chunks_exact_mut(PANEL).take(kc).enumerate() {
        let p = k0 + i;
        for (c, v) in line.iter_mut().enumerate() {
            let word = words[(p / 2) * PANEL + c];
            *v = bf16_to_f32(if p.is_multiple_of(2) {
                word as u16
            } else {
                (word >> 16) as u16
            });
        }
    }
}

/// `words` (pairs × PANEL) widened into `dst` (2·pairs × PANEL) in a given form.
fn widen_pairs_on(isa: Isa, words: &[u32], dst: &mut [f32]) {
    assert!(dst.len() == 2 * words.len() && words.len().is_multiple_of(PANEL));
    match isa {
        // SAFETY: the CPU has the form; the lengths were checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::widen_avx512(words, dst) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::widen_avx2(words, dst) },
        _ => widen_plain(words, 0, 2 * words.len() / PANEL, dst),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PANEL;
    use crate::ops::vector::Vector;
    use std::arch::x86_64::{__m256, __m512};

    /// The entry point of one instruction set, compiled for it, around the one body.
    macro_rules! entry_point {
        ($name:ident, $vector:ty, $features:literal, $needs:literal) => {
            #[doc = concat!("# Safety\n", $needs, "; `dst` holds twice the words.")]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(words: &[u32], dst: &mut [f32]) {
                widen::<$vector>(words, dst)
            }
        };
    }
    entry_point!(widen_avx2, __m256, "avx2,fma", "AVX2 and FMA");
    entry_point!(widen_avx512, __m512, "avx512f,avx2,fma", "AVX-512 F");

    #[inline(always)]
    unsafe fn widen<V: Vector>(words: &[u32], dst: &mut [f32]) {
        let lanes = V::LANES;
        for (q, line) in words.chunks_exact(PANEL).enumerate() {
            for u in (0..PANEL).step_by(lanes) {
                let w = V::load(line.as_ptr().add(u).cast());
                w.bf16_low().store(dst.as_mut_ptr().add(2 * q * PANEL + u));
                w.bf16_high()
                    .store(dst.as_mut_ptr().add((2 * q + 1) * PANEL + u));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slab, odd start and length included, holds W's elements where the packed
    /// layout puts them, in every form, and zeros past the last column.
    #[test]
    fn slabs_hold_the_weight_in_the_packed_layout() {
        let (n, k) = (37, 23);
        let wf: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.71).cos()).collect();
        let w = Bf16Weight::new(&wf, n, k).unwrap();
        let slabs = [(0, 23, 0, 37), (2, 9, 16, 21), (3, 8, 32, 5), (4, 1, 0, 16)];
        crate::weights::stored::checks::assert_slabs(&w, &slabs);
        for isa in Isa::available() {
            let words = w.panel(1);
            let mut got = vec![0.0; 2 * words.len()];
            widen_pairs_on(isa, words, &mut got);
            let mut want = vec![0.0; 2 * words.len()];
            widen_plain(words, 0, 2 * words.len() / PANEL, &mut want);
            assert_eq!(got, want, "{isa:?}");
        }
    }
}
