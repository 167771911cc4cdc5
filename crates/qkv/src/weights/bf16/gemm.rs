//! The many-rows product on AVX512-BF16: y `[M, N]` (+)= x·Wᵀ with x rounded to bf16
//! and each pair of products summed into f32 by `vdpbf16ps`, 32 multiply-adds an
//! instruction (an f32 FMA does 16).
//!
//! x is first rounded into pairs, row by row (`[M, ⌈K/2⌉]` words). A task takes a
//! block of two panels (32 columns of y) and runs every row tile of [`MR`] rows over
//! it: 6 rows × 2 panels are 12 sums in flight, and the block's panels (64 bytes a
//! pair each) stay in L1/L2 while the row tiles stream past.

use super::convert::round_pairs;
use super::job::Job;
use super::weight::PANEL;
use crate::ops::disjoint::Disjoint;
use crate::ops::for_each_task;

/// Rows of a tile.
const MR: usize = 6;
/// Panels of a block.
const NP: usize = 2;

/// Whether the many-rows products should take this form: on AMD's Zen 4 and Zen 5,
/// `vdpbf16ps` does twice the multiply-adds of an f32 FMA a cycle. On Intel's Xeons
/// (Sapphire Rapids, measured with `qkv bench matmul --dtype bf16`: 110 GFLOP/s against
/// 232 for the f32 product on the same shapes) it is slower than the f32 FMAs, so
/// there the widened form runs.
pub(super) fn preferred() -> bool {
    available() && amd()
}

/// Whether the CPU's vendor is AMD (cpuid leaf 0: "AuthenticAMD").
fn amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: cpuid leaf 0 exists on every x86-64 CPU.
        #[allow(unused_unsafe)] // a safe function from Rust 1.94 on
        let id = unsafe { std::arch::x86_64::__cpuid(0) };
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has the instructions (AVX-512 F and BF16) and the vector width is
/// not capped below AVX-512 (`QKV_ISA`).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::ops::isa::Isa::detect() == crate::ops::isa::Isa::Avx512
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// x `[rows, K]` rounded to bf16 pairs, `[rows, ⌈K/2⌉]` (an odd K padded with zero).
pub(super) fn x_pairs(x: &[f32], rows: usize, k: usize) -> Vec<u32> {
    let pairs = k.div_ceil(2);
    let mut out = vec![0u32; rows * pairs];
    for (dst, src) in out.chunks_exact_mut(pairs).zip(x.chunks_exact(k)) {
        round_pairs(src, dst);
    }
    out
}

/// y `[rows, N]` ← (accumulate ? y : 0) + bf16(x)`[rows, K]`·Wᵀ, all row-major. Only
/// where [`available`] says yes.
pub(super) fn product(job: Job<'_>, parallel: bool) {
    let Job {
        y,
        x,
        rows,
        w,
        accumulate,
    } = job;
    assert!(available(), "vdpbf16ps needs AVX512-BF16");
    let (n, k, pairs) = (w.n(), w.k(), w.pairs());
    assert!(x.len() == rows * k && y.len() == rows * n);
    let xp = x_pairs(x, rows, k);
    let out = Disjoint::new(y);
    let blocks = w.panels().div_ceil(NP);
    let run = |block: usize| {
        let j = block * NP;
        let live = (w.panels() - j).min(NP);
        let cols = (n - j * PANEL).min(live * PANEL);
        let panels: [&[u32]; NP] = std::array::from_fn(|c| w.panel(j + c.min(live - 1)));
        let mut sums = [[0.0f32; NP * PANEL]; MR];
        for r0 in (0..rows).step_by(MR) {
            let r_live = (rows - r0).min(MR);
            let a = &xp[r0 * pairs..(r0 + r_live) * pairs];
            // SAFETY: available() said the CPU has AVX-512 F and BF16; `a` holds r_live
            // rows of `pairs` words and each panel `pairs · PANEL` words.
            unsafe { x86::tile(a, r_live, &panels, pairs, &mut sums) };
            for (r, row) in sums.iter().enumerate().take(r_live) {
                let at = (r0 + r) * n + j * PANEL;
                // SAFETY: the block's columns belong to this task alone.
                let dst = unsafe { out.range(at, cols) };
                for (d, &s) in dst.iter_mut().zip(row) {
                    *d = if accumulate { *d + s } else { s };
                }
            }
        }
    };
    if parallel {
        for_each_task(blocks, run);
    } else {
        (0..blocks).for_each(run);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MR, NP, PANEL};
    use std::arch::x86_64::*;

    /// Sums of `rows` ≤ MR rows of pairs `a` against the block's panels, into
    /// `sums[r][np·PANEL + c]`.
    ///
    /// # Safety
    /// AVX-512 F and BF16; `a` holds `rows · pairs` words, each panel `pairs · PANEL`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile(
        a: &[u32],
        rows: usize,
        panels: &[&[u32]; NP],
        pairs: usize,
        sums: &mut [[f32; NP * PANEL]; MR],
    ) {
        match rows {
            1 => rows_tile::<1>(a, panels, pairs, sums),
            2 => rows_tile::<2>(a, panels, pairs, sums),
            3 => rows_tile::<3>(a, panels, pairs, sums),
            4 => rows_tile::<4>(a, panels, pairs, sums),
            5 => rows_tile::<5>(a, panels, pairs, sums),
            _ => rows_tile::<MR>(a, panels, pairs, sums),
        }
    }

    #[inline(always)]
    unsafe fn rows_tile<const R: usize>(
        a: &[u32],
        panels: &[&[u32]; NP],
        pairs: usize,
        sums: &mut [[f32; NP * PANEL]; MR],
    ) {
        assert!(a.len() >= R * pairs && panels.iter().all(|p| p.len() >= pairs * PANEL));
        let mut acc = [[_mm512_setzero_ps(); NP]; R];
        for p in 0..pairs {
            let b: [__m512bh; NP] = std::array::from_fn(|np| {
                let words = _mm512_loadu_si512(panels[np].as_ptr().add(p * PANEL).cast());
                // SAFETY: a vector of 32 bf16 is a vector of 16 words, bit for bit
                std::mem::transmute::<__m512i, __m512bh>(words)
            });
            for (r, row) in acc.iter_mut().enumerate() {
                let word = *a.get_unchecked(r * pairs + p) as i32;
                let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(word));
                for (sum, &bv) in row.iter_mut().zip(&b) {
                    *sum = _mm512_dpbf16_ps(*sum, x, bv);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (np, sum) in row.iter().enumerate() {
                _mm512_storeu_ps(sums[r][np * PANEL..].as_mut_ptr(), *sum);
            }
        }
    }
}
