//! The tile kernel: R rows of quantized x against NP panels of a block weight
//! ([`super::panels`]), `out[r][np][c]` = Σ over super-blocks of the row's sum, as
//! llama.cpp's `ggml_vec_dot_*` computes it: each group's sum of code × activation
//! exact in i32, times its integer scale, the offsets (Q4_K's and Q5_K's mins, Q6_K's
//! 32, Q4_0's 8) through the activations' sums per 16; only the sum over super-blocks
//! is f32: acc += isum·(d·dx), minus msum·(dmin·dx), each rounded once.
//!
//! Three kernels compute it ([`Kernel`]): `vpdpbusd` on AVX-512 VNNI ([`vnni`]),
//! `vpmaddubsw` and `vpmaddwd` on AVX2 ([`avx2`]), and plain loops. The group sums are
//! exact integers in all three and the f32 operations the same, in the same order, so
//! all three give the same bits.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod operands;
#[cfg(target_arch = "x86_64")]
mod vnni;

use super::layout::BlockType;
use super::panels::{code, lane_f32, min_at, Parts, PANEL};
use crate::ops::isa::Isa;
pub(crate) use operands::Tile;

/// Which loops compute a tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `vpdpbusd` on 16 rows a vector: AVX-512 F, BW and VNNI.
    Vnni,
    /// `vpmaddubsw` and `vpmaddwd` on 8 rows a vector: AVX2.
    Avx2,
    /// Plain loops: any CPU.
    Plain,
}

impl Kernel {
    /// What a product's [`Form::Tiles`](crate::weights::stored::Form::Tiles) calls this
    /// kernel.
    pub fn kernel(self) -> crate::weights::stored::Kernel {
        use crate::weights::stored::Kernel as Named;
        match self {
            Kernel::Vnni => Named::Vnni,
            Kernel::Avx2 => Named::Avx2,
            Kernel::Plain => Named::Plain,
        }
    }

    /// The fastest kernel this CPU runs (within the `QKV_ISA` cap).
    pub fn best() -> Kernel {
        Self::available()[0]
    }

    /// Every kernel this CPU runs, fastest first: what the tests compare. Asked
    /// once (each tile checks its kernel against it).
    pub fn available() -> &'static [Kernel] {
        static KERNELS: std::sync::OnceLock<Vec<Kernel>> = std::sync::OnceLock::new();
        KERNELS.get_or_init(Self::detect)
    }

    fn detect() -> Vec<Kernel> {
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let isa = Isa::detect();
            if isa == Isa::Avx512
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512bw")
            {
                kernels.push(Kernel::Vnni);
            }
            if isa != Isa::Portable {
                kernels.push(Kernel::Avx2);
            }
        }
        kernels.push(Kernel::Plain);
        kernels
    }
}

/// The tile's sums by the given kernel (one of [`Kernel::available`]).
pub(super) fn tile_on<const R: usize, const NP: usize>(
    kernel: Kernel,
    t: &Tile<'_, R, NP>,
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    let p = Parts::of(t.ty);
    let k = t.x[0].0.len();
    let blocks = k / t.ty.weights();
    assert!(k > 0 && blocks * t.ty.weights() == k);
    assert!(t.panels.iter().all(|pn| pn.len() == blocks * p.bytes));
    assert!(t.x.iter().all(|(q, s, sums)| {
        q.len() == k && s.len() == k / t.ty.x_group() && sums.len() == k / 16
    }));
    assert!(
        Kernel::available().contains(&kernel),
        "{kernel:?} does not run here"
    );
    match kernel {
        // SAFETY: the CPU has the instructions (checked above); so are the lengths.
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => unsafe { vnni::tile(t, out) },
        // SAFETY: as above
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { avx2::tile(t, out) },
        _ => plain(t, out),
    }
}

/// The kernel in plain loops, in the vector form's order of f32 operations.
fn plain<const R: usize, const NP: usize>(t: &Tile<'_, R, NP>, out: &mut [[[f32; PANEL]; NP]; R]) {
    let (ty, p) = (t.ty, Parts::of(t.ty));
    let per = ty.weights();
    for ((q, xs, sums), out) in t.x.iter().zip(out.iter_mut()) {
        for (panel, out) in t.panels.iter().zip(out.iter_mut()) {
            for (c, acc) in out.iter_mut().enumerate() {
                *acc = 0.0;
                for (b, pb) in panel.chunks_exact(p.bytes).enumerate() {
                    let dot = |from: usize, len: usize| -> i32 {
                        (from..from + len)
                            .map(|s| i32::from(code(ty, pb, c, s)) * i32::from(q[b * per + s]))
                            .sum()
                    };
                    let sum = |g: usize| i32::from(sums[b * per / 16 + g]);
                    let scale = |g: usize| i32::from(pb[p.scales + g * PANEL + c] as i8);
                    let (isum, msum) = match ty {
                        BlockType::Q4_0 => (dot(0, 32) - 8 * (sum(0) + sum(1)), 0),
                        BlockType::Q6K => {
                            let isum = (0..16).map(|g| (dot(16 * g, 16) - 32 * sum(g)) * scale(g));
                            (isum.sum(), 0)
                        }
                        _ => {
                            let isum = (0..8).map(|s| dot(32 * s, 32) * scale(s)).sum();
                            let min = |s: usize| i32::from(pb[min_at(&p, c, s)]);
                            let msum = (0..8).map(|s| min(s) * (sum(2 * s) + sum(2 * s + 1)));
                            (isum, msum.sum())
                        }
                    };
                    let dx = xs[b];
                    *acc = (isum as f32).mul_add(lane_f32(pb, p.d, c) * dx, *acc);
                    if p.has_mins {
                        *acc = (-(msum as f32)).mul_add(lane_f32(pb, p.dmin, c) * dx, *acc);
                    }
                }
            }
        }
    }
}
