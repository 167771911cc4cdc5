//! The tile kernel: sums of R rows of quantized x against NP panels of an int8 weight,
//! `out[r][np][c]` = Σ_g d_x[r, g]·d_w[16·np + c, g] · Σ_{k in g} q_x[r, k]·q_w[.., k].
//!
//! Each group's sum is exact in i32, whichever instructions make it: `vpdpbusd` on
//! AVX-512 VNNI ([`vnni`]), `vpmaddubsw` and `vpmaddwd` on AVX2 ([`avx2`]), plain
//! loops. Only the sum over groups is in f32, in the same order in every form, so all
//! three give the same bits.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod operands;
#[cfg(target_arch = "x86_64")]
mod vnni;

use super::weight::PANEL;
use crate::ops::isa::Isa;
pub(crate) use operands::{Tile, XRow};

use crate::weights::stored::Kernel as Named;

/// Which form of the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    /// AVX-512 VNNI's `vpdpbusd`.
    Vnni,
    /// AVX2's `vpmaddubsw` and `vpmaddwd`.
    Avx2,
    /// Plain loops: the twin, which the tests run, and the tiles' form on any CPU.
    Plain,
}

impl Kernel {
    /// Whether this CPU runs the kernel, within the `QKV_ISA` cap: VNNI on 512-bit
    /// vectors, AVX2 (with FMA) wherever the cap leaves vectors at all.
    pub(super) fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Kernel::Vnni => {
                    Isa::detect() == Isa::Avx512 && is_x86_feature_detected!("avx512vnni")
                }
                Kernel::Avx2 => Isa::detect() != Isa::Portable,
                Kernel::Plain => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Plain
        }
    }

    /// What a product's [`Form::Tiles`](crate::weights::stored::Form::Tiles) calls
    /// this kernel.
    pub(super) fn named(self) -> Named {
        match self {
            Kernel::Vnni => Named::Vnni,
            Kernel::Avx2 => Named::Avx2,
            Kernel::Plain => Named::Plain,
        }
    }

    /// The kernel a product's form names ([`Kernel::named`] backwards; the names no
    /// int8 tile has are the plain loops).
    pub(super) fn of(name: Named) -> Kernel {
        match name {
            Named::Vnni => Kernel::Vnni,
            Named::Avx2 => Kernel::Avx2,
            _ => Kernel::Plain,
        }
    }

    /// The fastest kernel this CPU runs.
    pub(super) fn best() -> Kernel {
        [Kernel::Vnni, Kernel::Avx2, Kernel::Plain]
            .into_iter()
            .find(|k| k.runs_here())
            .expect("the plain loops run anywhere")
    }

    /// Every kernel this CPU runs, fastest first: what the tests compare.
    pub(super) fn here() -> Vec<Kernel> {
        [Kernel::Vnni, Kernel::Avx2, Kernel::Plain]
            .into_iter()
            .filter(|k| k.runs_here())
            .collect()
    }
}

/// The tile's sums in the given form (one that [`Kernel::runs_here`]).
pub(super) fn tile_on<const R: usize, const NP: usize>(
    kernel: Kernel,
    t: &Tile<'_, R, NP>,
    out: &mut [[[f32; PANEL]; NP]; R],
) {
    let width = t.x[0].codes.len();
    let groups = width / t.group;
    assert!(t.group.is_multiple_of(4) && groups * t.group == width);
    assert!(t
        .x
        .iter()
        .all(|x| x.codes.len() == width && x.scales.len() == groups && x.offsets.len() == groups));
    assert!(t.codes.iter().all(|c| c.len() == width / 4 * PANEL));
    assert!(t.scales.iter().all(|s| s.len() == groups * PANEL));
    assert!(kernel.runs_here(), "{kernel:?} does not run here");
    match kernel {
        // SAFETY: the CPU has the instructions; the lengths were checked above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => unsafe { vnni::tile(t, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { avx2::tile(t, out) },
        _ => plain(t, out),
    }
}

/// The kernel in plain loops, in the vector form's order of sums.
fn plain<const R: usize, const NP: usize>(t: &Tile<'_, R, NP>, out: &mut [[[f32; PANEL]; NP]; R]) {
    let quads = t.group / 4;
    for (x, out) in t.x.iter().zip(out.iter_mut()) {
        let XRow {
            codes: q,
            scales: xs,
            offsets,
        } = *x;
        for ((codes, scales), out) in t.codes.iter().zip(&t.scales).zip(out.iter_mut()) {
            for (c, total) in out.iter_mut().enumerate() {
                *total = 0.0;
                for g in 0..xs.len() {
                    let mut dot = 0i32;
                    for quad in g * quads..(g + 1) * quads {
                        let word = codes[quad * PANEL + c];
                        for i in 0..4 {
                            let w = (word >> (8 * i)) & 0xff;
                            dot += w as i32 * i32::from(q[4 * quad + i]);
                        }
                    }
                    let scale = scales[g * PANEL + c] * xs[g];
                    *total = ((dot - offsets[g]) as f32).mul_add(scale, *total);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::rows::QuantizedRows;
    use super::super::weight::{Int8Weight, ScaleLayout};
    use super::*;
    use crate::rng::Rng;

    /// Every kernel here against the plain loops, to the bit, for the tile of R rows of
    /// `x` `[R, K]` and NP panels of `w`.
    fn every_kernel_gives_the_plain_bits<const R: usize, const NP: usize>(
        x: &[f32],
        w: &Int8Weight,
        what: &str,
    ) {
        let xq = QuantizedRows::new(x, R, w, false);
        let t = Tile::<R, NP> {
            x: std::array::from_fn(|r| xq.row(r)),
            codes: std::array::from_fn(|j| w.panel_codes(j)),
            scales: std::array::from_fn(|j| w.panel_scales(j)),
            group: w.group(),
        };
        let mut want = [[[0.0; PANEL]; NP]; R];
        tile_on(Kernel::Plain, &t, &mut want);
        for kernel in Kernel::here() {
            let mut got = [[[1.0; PANEL]; NP]; R];
            tile_on(kernel, &t, &mut got);
            assert_eq!(got, want, "{kernel:?} {what} {R}x{NP}");
        }
    }

    /// Every form this CPU has gives the plain loops' bits, in both layouts and the
    /// tile shapes the sweep uses (one row against four panels, up to four rows
    /// against two).
    #[test]
    fn every_form_equals_the_plain_loops_to_the_bit() {
        let mut rng = Rng::new(5);
        let k = 200;
        let x = rng.normals(4 * k, 1.0);
        let wf = rng.normals(4 * PANEL * k, 1.0);
        for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
            let w = Int8Weight::new(&wf, 4 * PANEL, k, layout).unwrap();
            let what = format!("{layout:?}");
            every_kernel_gives_the_plain_bits::<1, 4>(&x[..k], &w, &what);
            every_kernel_gives_the_plain_bits::<3, 2>(&x[..3 * k], &w, &what);
            every_kernel_gives_the_plain_bits::<4, 2>(&x, &w, &what);
        }
    }

    /// Code i of row r's block g in the extreme weight: −128, 127 and −127 in turn,
    /// neighbours alike.
    fn extreme_code(r: usize, g: usize, i: usize) -> i8 {
        [i8::MIN, i8::MAX, -i8::MAX][(r + g + i / 2) % 3]
    }

    /// The largest products the codes allow: a file's −128 (which Q8_0 may store
    /// though the quantizer never makes it) and ±127 against activations at ±127,
    /// neighbours of one sign, where AVX2's i16 pairs are fullest (2·128·127). Every
    /// kernel gives the plain bits, and the best one the exact sums.
    #[test]
    fn the_extreme_codes_do_not_saturate() {
        let (k, n) = (64, 2 * PANEL);
        let w = Int8Weight::from_blocks(n, k, |r, g, q| {
            q.iter_mut()
                .enumerate()
                .for_each(|(i, c)| *c = extreme_code(r, g, i));
            Ok(0.5)
        })
        .unwrap();
        // each activation group's largest magnitude codes to ±127
        let x: Vec<f32> = (0..3 * k)
            .map(|i| if (i / 2) % 2 == 0 { 3.0 } else { -3.0 })
            .collect();
        every_kernel_gives_the_plain_bits::<3, 2>(&x, &w, "extreme codes");
        let xq = QuantizedRows::new(&x[..k], 1, &w, false);
        let XRow {
            codes: q,
            scales: xs,
            ..
        } = xq.row(0);
        assert!(q.iter().all(|c| c.abs() == 127), "activations at ±127");
        let t = Tile::<1, 2> {
            x: [xq.row(0)],
            codes: std::array::from_fn(|j| w.panel_codes(j)),
            scales: std::array::from_fn(|j| w.panel_scales(j)),
            group: w.group(),
        };
        let mut got = [[[0.0; PANEL]; 2]; 1];
        tile_on(Kernel::best(), &t, &mut got);
        for c in 0..n {
            let want: f64 = (0..k / 32)
                .map(|g| {
                    let dot: i64 = (0..32)
                        .map(|i| i64::from(extreme_code(c, g, i)) * i64::from(q[32 * g + i]))
                        .sum();
                    dot as f64 * 0.5 * f64::from(xs[g])
                })
                .sum();
            let got = f64::from(got[0][c / PANEL][c % PANEL]);
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "column {c}: {got} against {want}"
            );
        }
    }
}
