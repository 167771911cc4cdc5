//! y (+)= x·Wᵀ for a weight in blocks: the form by the row count and the CPU (module
//! docs of [`super`]).

use super::activations::QuantizedX;
use super::panels::PANEL;
use super::tile::{self, Kernel, Tile};
use super::weight::BlockWeight;
use crate::error::{Error, Result};
use crate::ops::disjoint::Disjoint;
use crate::ops::Par;
use crate::weights::int8::Start;
use crate::weights::stored::{check_operands, widened_product};
use rayon::prelude::*;

/// Which form a product takes. All compute deq(q(x))·deq(W)ᵀ; they differ in the
/// order of the f32 sums (the tile kernels not even in that).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Tiles of integer dot products by one kernel.
    Tiles(Kernel),
    /// Both operands dequantized into the f32 product, slab by slab: more rows where
    /// only the plain kernel runs.
    Widened,
}

/// Most rows that take the plain tiles: beyond them, the f32 product's tiles reuse
/// each dequantized slab over many rows.
const FEW_ROWS: usize = 4;

/// Rows of a tile.
const MR: usize = 4;

/// The form [`product`] takes on this CPU for `rows` rows.
pub fn form(rows: usize) -> Form {
    match Kernel::best() {
        Kernel::Plain if rows > FEW_ROWS => Form::Widened,
        kernel => Form::Tiles(kernel),
    }
}

/// The forms this CPU can run (what the tests compare).
pub fn forms_here() -> Vec<Form> {
    let mut forms: Vec<Form> = Kernel::available()
        .iter()
        .map(|&k| Form::Tiles(k))
        .collect();
    forms.push(Form::Widened);
    forms
}

/// y `[rows, N]` ← start + deq(q(x))·deq(W)ᵀ, row-major: x `[rows, K]` quantized as
/// llama.cpp quantizes it for the weight's type ([`super::activations`]). Errors when
/// the lengths do not match the weight's shape.
pub fn product(
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    w: &BlockWeight,
    start: Start,
    par: Par,
) -> Result<()> {
    product_as(form(rows), y, x, rows, w, start, par)
}

/// [`product`] in a given form (one of [`forms_here`]).
pub fn product_as(
    form: Form,
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    w: &BlockWeight,
    start: Start,
    par: Par,
) -> Result<()> {
    check_operands("block product operands", y, x, rows, w)?;
    if let Start::Bias(b) = start {
        if b.len() != w.n() {
            return Err(Error::shape(
                "block product bias",
                format!("[{}]", w.n()),
                &[b.len()],
            ));
        }
    }
    if rows == 0 {
        return Ok(());
    }
    let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
    let xq = QuantizedX::new(x, rows, w.k(), w.ty(), parallel);
    match form {
        Form::Tiles(kernel) => tiles(y, &xq, w, start, kernel, parallel),
        Form::Widened => {
            if let Start::Bias(b) = start {
                y.chunks_exact_mut(w.n())
                    .for_each(|row| row.copy_from_slice(b));
            }
            let accumulate = !matches!(start, Start::Zero);
            widened_product(y, &xq.dequantized(), rows, w, accumulate, par)?;
        }
    }
    Ok(())
}

/// The tiles: one row (a decoding step) takes four panels a tile, more rows tiles of
/// [`MR`] rows × 2 panels. A task owns a run of panels and sweeps every row tile over
/// them, so its panels stay in cache while x streams past; one task a thread, since a
/// decoding step's products are too short to pay for more.
fn tiles(
    y: &mut [f32],
    xq: &QuantizedX,
    w: &BlockWeight,
    start: Start,
    kernel: Kernel,
    parallel: bool,
) {
    let (n, rows) = (w.n(), xq.rows());
    let group = if rows == 1 { 4 } else { 2 };
    let panels = w.panel_count();
    let chunk = if parallel {
        panels
            .div_ceil(rayon::current_num_threads())
            .next_multiple_of(group)
    } else {
        panels
    };
    let out = Disjoint::new(y);
    let run = |j0: usize| {
        let j1 = panels.min(j0 + chunk);
        let mut sums = [[0.0f32; 4 * PANEL]; MR];
        for j in (j0..j1).step_by(group) {
            let live = (j1 - j).min(group);
            let cols = (n - j * PANEL).min(live * PANEL);
            for r0 in (0..rows).step_by(MR) {
                let r_live = (rows - r0).min(MR);
                tile(kernel, xq, r0, r_live, w, j, live, group == 4, &mut sums);
                for (r, row) in sums.iter().enumerate().take(r_live) {
                    // SAFETY: columns j·PANEL.. of this task's panels belong to it alone.
                    let dst = unsafe { out.range((r0 + r) * n + j * PANEL, cols) };
                    match start {
                        Start::Zero => dst.copy_from_slice(&row[..cols]),
                        Start::Accumulate => dst.iter_mut().zip(row).for_each(|(d, &s)| *d += s),
                        Start::Bias(b) => {
                            let b = &b[j * PANEL..][..cols];
                            dst.iter_mut()
                                .zip(row.iter().zip(b))
                                .for_each(|(d, (&s, &b))| *d = s + b)
                        }
                    }
                }
            }
        }
    };
    if parallel {
        (0..panels).into_par_iter().step_by(chunk).for_each(run);
    } else {
        run(0);
    }
}

/// Sums of rows `r0..r0 + r_live` against panels `j..j + live` (of four when `four`,
/// else two) into `sums[r][c]`, the panels' columns c.
#[allow(clippy::too_many_arguments)]
fn tile(
    kernel: Kernel,
    xq: &QuantizedX,
    r0: usize,
    r_live: usize,
    w: &BlockWeight,
    j: usize,
    live: usize,
    four: bool,
    sums: &mut [[f32; 4 * PANEL]; MR],
) {
    // missing panels repeat the last live one; their sums are dropped
    let panel = |i: usize| j + i.min(live - 1);
    macro_rules! call {
        ($r:literal, $np:literal) => {{
            let t = Tile::<$r, $np> {
                ty: w.ty(),
                x: std::array::from_fn(|i| xq.row(r0 + i)),
                panels: std::array::from_fn(|i| w.panel(panel(i))),
            };
            let mut out = [[[0.0f32; PANEL]; $np]; $r];
            tile::tile_on(kernel, &t, &mut out);
            for (dst, src) in sums.iter_mut().zip(&out) {
                for (np, cols) in src.iter().enumerate() {
                    dst[np * PANEL..][..PANEL].copy_from_slice(cols);
                }
            }
        }};
    }
    match (r_live, four) {
        (1, true) => call!(1, 4),
        (1, false) => call!(1, 2),
        (2, _) => call!(2, 2),
        (3, _) => call!(3, 2),
        _ => call!(4, 2),
    }
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::super::weight::tests::random;
    use super::super::BlockType;
    use super::*;
    use crate::rng::Rng;
    use crate::weights::stored::checks;

    /// Every form equals the twin within f32 rounding of the sums over K, for every
    /// type: one row and a few (the dot products), more (widened), an odd count of
    /// Q4_0 blocks, a last task of fewer rows, each start.
    #[test]
    fn every_form_equals_the_twin() {
        let mut rng = Rng::new(7);
        for ty in BlockType::ALL {
            for (rows, blocks, n) in [(1, 3, 37), (2, 2, 20), (4, 1, 70), (9, 2, 33)] {
                let k = blocks * ty.weights() * if ty == BlockType::Q4_0 { 3 } else { 1 };
                let w = random(ty, n, k, rows as u64);
                let x = rng.normals(rows * k, 1.0);
                let y0 = rng.normals(rows * n, 1.0);
                let bias: Vec<f32> = (0..n).map(|c| c as f32 * 0.25 - 3.0).collect();
                for start in [Start::Zero, Start::Accumulate, Start::Bias(&bias)] {
                    let mut want = y0.clone();
                    if let Start::Bias(b) = start {
                        want.chunks_exact_mut(n)
                            .for_each(|row| row.copy_from_slice(b));
                    }
                    reference::product(&mut want, &x, rows, &w, !matches!(start, Start::Zero));
                    for f in forms_here() {
                        for par in [Par::Auto, Par::Single] {
                            let mut got = y0.clone();
                            product_as(f, &mut got, &x, rows, &w, start, par).unwrap();
                            let what = format!("{ty:?} {f:?} {rows}x{k}x{n} {start:?} {par:?}");
                            checks::assert_near(&what, &got, &want, k);
                        }
                    }
                }
            }
        }
    }

    /// The vector kernels give the plain loops' bits, for every type and every shape
    /// of tile the products take.
    #[test]
    fn vector_kernels_equal_the_plain_loops_to_the_bit() {
        fn check<const R: usize, const NP: usize>(ty: BlockType, w: &BlockWeight, xq: &QuantizedX) {
            let t = Tile::<R, NP> {
                ty,
                x: std::array::from_fn(|r| xq.row(r)),
                panels: std::array::from_fn(|j| w.panel(j + 1)),
            };
            let mut want = [[[0.0; PANEL]; NP]; R];
            tile::tile_on(Kernel::Plain, &t, &mut want);
            assert!(want.iter().flatten().flatten().any(|&v| v != 0.0));
            for &kernel in Kernel::available() {
                let mut got = [[[1.0; PANEL]; NP]; R];
                tile::tile_on(kernel, &t, &mut got);
                assert_eq!(got, want, "{ty:?} {kernel:?} {R}x{NP}");
            }
        }
        let mut rng = Rng::new(11);
        for ty in BlockType::ALL {
            let k = 2 * QK;
            let w = random(ty, 80, k, 2);
            let x = rng.normals(4 * k, 2.0);
            let xq = QuantizedX::new(&x, 4, k, ty, false);
            check::<1, 4>(ty, &w, &xq);
            check::<3, 2>(ty, &w, &xq);
            check::<4, 2>(ty, &w, &xq);
        }
    }

    const QK: usize = super::super::layout::QK_K;

    /// A NaN in x reaches y in every form.
    #[test]
    fn a_nan_in_x_reaches_y() {
        for ty in BlockType::ALL {
            let k = QK;
            let w = random(ty, 3, k, 1);
            let mut x = vec![0.5; k];
            x[40] = f32::NAN;
            for f in forms_here() {
                let mut y = vec![0.0; 3];
                product_as(f, &mut y, &x, 1, &w, Start::Zero, Par::Auto).unwrap();
                assert!(y.iter().all(|v| v.is_nan()), "{ty:?} {f:?}: {y:?}");
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let w = random(BlockType::Q4K, 2, QK, 1);
        let mut y = vec![0.0; 2];
        assert!(product(&mut y, &[1.0; 4], 1, &w, Start::Zero, Par::Auto).is_err());
        let err = product(&mut y, &[1.0; QK], 1, &w, Start::Bias(&[0.0; 3]), Par::Auto);
        assert!(err.unwrap_err().to_string().contains("bias"));
    }
}
