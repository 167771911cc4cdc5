//! y (+)= x·Wᵀ for an int8 weight: the form by the CPU (module docs of [`super`]).

use super::amx;
use super::kernel::{self, Kernel, Tile};
use super::rows::QuantizedRows;
pub use super::start::Start;
use super::weight::{Int8Weight, PANEL};
use crate::error::{Error, Result};
use crate::ops::disjoint::Disjoint;
use crate::ops::Par;
use crate::weights::stored::{check_operands, panels_per_task, widened_product};
use rayon::prelude::*;

/// Which form a product takes. Both compute deq(q(x))·deq(W)ᵀ; they differ in the
/// order of the f32 sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `vpdpbusd` tiles, exact in i32 within a group: every row count on AVX-512 VNNI.
    Dot,
    /// Both operands dequantized, then the f32 product: elsewhere.
    Widened,
    /// AMX's `tdpbsud`, exact in i32 over all of K: more than four rows times
    /// a weight with a scale per row, where the process has AMX-INT8.
    Amx,
}

/// Most rows that take the VNNI tiles even where AMX is there: a decoding step's few
/// rows would fill a sixteenth of a tile.
const FEW_ROWS: usize = 4;

/// The form [`product`] takes on this CPU for `rows` rows times `w`.
pub fn form(rows: usize, w: &Int8Weight) -> Form {
    if rows > FEW_ROWS && amx::available(w) {
        Form::Amx
    } else if kernel::vnni() {
        Form::Dot
    } else {
        Form::Widened
    }
}

/// The forms this CPU can run (what the tests compare).
pub fn forms_here() -> Vec<Form> {
    let mut forms = vec![Form::Widened];
    if kernel::vnni() {
        forms.push(Form::Dot);
    }
    if crate::weights::amx::int8() {
        forms.push(Form::Amx);
    }
    forms
}

/// Rows of a tile.
const MR: usize = 4;

/// y `[rows, N]` ← start + deq(q(x))·deq(W)ᵀ, row-major: x `[rows, K]` quantized in the
/// weight's groups ([`super::quant`]), each group's sum exact in integers. Errors when
/// the lengths do not match the weight's shape.
pub fn product(
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    w: &Int8Weight,
    start: Start,
    par: Par,
) -> Result<()> {
    check_operands("int8 product operands", y, x, rows, w)?;
    if let Start::Bias(b) = start {
        if b.len() != w.n() {
            return Err(Error::shape(
                "int8 product bias",
                format!("[{}]", w.n()),
                &[b.len()],
            ));
        }
    }
    if rows == 0 {
        return Ok(());
    }
    let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
    let xq = QuantizedRows::new(x, rows, w, parallel);
    match form(rows, w) {
        Form::Dot => tiles(y, &xq, rows, w, start, Kernel::Vnni, par),
        Form::Widened => widened(y, &xq, rows, w, start, par)?,
        Form::Amx => amx::product(y, &xq, rows, w, start, parallel),
    }
    Ok(())
}

/// The tiled form with a given kernel. One row (a decoding step) takes four panels a
/// tile (64 columns, 8 vectors of sums); more rows take tiles of [`MR`] rows × 2
/// panels. A task owns a run of panels and sweeps every row tile over them, so its
/// panels stay in cache while x streams past; the weight is read from memory once.
fn tiles(
    y: &mut [f32],
    xq: &QuantizedRows,
    rows: usize,
    w: &Int8Weight,
    start: Start,
    kernel: Kernel,
    par: Par,
) {
    let n = w.n();
    let group = if rows == 1 { 4 } else { 2 };
    let panels = w.panels();
    let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
    let chunk = panels_per_task(panels, group, parallel);
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
    xq: &QuantizedRows,
    r0: usize,
    r_live: usize,
    w: &Int8Weight,
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
                x: std::array::from_fn(|i| xq.row(r0 + i)),
                codes: std::array::from_fn(|i| w.panel_codes(panel(i))),
                scales: std::array::from_fn(|i| w.panel_scales(panel(i))),
                group: w.group(),
            };
            let mut out = [[[0.0f32; PANEL]; $np]; $r];
            kernel::tile_on(kernel, &t, &mut out);
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

/// The widened form: x dequantized once, then the f32 product with the weight
/// dequantized slab by slab as the product packs it
/// ([`crate::ops::matmul::SlabSource`]); a bias is copied into y's rows first.
fn widened(
    y: &mut [f32],
    xq: &QuantizedRows,
    rows: usize,
    w: &Int8Weight,
    start: Start,
    par: Par,
) -> Result<()> {
    if let Start::Bias(b) = start {
        y.chunks_exact_mut(w.n())
            .for_each(|row| row.copy_from_slice(b));
    }
    let accumulate = !matches!(start, Start::Zero);
    widened_product(y, &xq.dequantized(w.k()), rows, w, accumulate, par)
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::super::weight::ScaleLayout;
    use super::*;
    use crate::weights::stored::checks;

    /// Every form, and the tiles with the plain kernel on any CPU, equal the twin within
    /// f32 rounding of the sums over groups: row counts around a tile, one row, odd K, a
    /// last block shorter than 32, a last panel of fewer than 16 columns, both layouts,
    /// each start (zero, y's values, a bias), x quantized serially and over the pool.
    #[test]
    fn every_form_equals_the_twin() {
        let mut amx_runs = 0;
        for ((rows, k, n), [x, wf, y0]) in checks::cases(11) {
            let bias: Vec<f32> = (0..n).map(|c| c as f32 * 0.25 - 3.0).collect();
            for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
                let w = Int8Weight::new(&wf, n, k, layout).unwrap();
                let xq = QuantizedRows::new(&x, rows, &w, true);
                for start in [Start::Zero, Start::Accumulate, Start::Bias(&bias)] {
                    let mut want = y0.clone();
                    if let Start::Bias(b) = start {
                        want.chunks_exact_mut(n)
                            .for_each(|row| row.copy_from_slice(b));
                    }
                    reference::product(&mut want, &x, rows, &w, !matches!(start, Start::Zero));
                    let mut runs: Vec<(String, Vec<f32>)> = Vec::new();
                    for kernel in kernel::kernels_here() {
                        let mut got = y0.clone();
                        tiles(&mut got, &xq, rows, &w, start, kernel, Par::Auto);
                        runs.push((format!("tiles {kernel:?}"), got));
                    }
                    let mut got = y0.clone();
                    widened(&mut got, &xq, rows, &w, start, Par::Auto).unwrap();
                    runs.push(("widened".into(), got));
                    if amx::available(&w) {
                        let mut got = y0.clone();
                        amx::product(&mut got, &xq, rows, &w, start, true);
                        // the same operations as the VNNI tiles, in the same order
                        if let Some((_, vnni)) = runs.iter().find(|(n, _)| n == "tiles Vnni") {
                            assert_eq!(&got, vnni, "amx {layout:?} {rows}x{k}x{n} {start:?}");
                        }
                        runs.push(("amx".into(), got));
                        amx_runs += 1;
                    }
                    let mut got = y0.clone();
                    product(&mut got, &x, rows, &w, start, Par::Auto).unwrap();
                    runs.push((format!("product ({:?})", form(rows, &w)), got));
                    for (name, got) in runs {
                        let what = format!("{name} {layout:?} {rows}x{k}x{n} {start:?}");
                        checks::assert_near(&what, &got, &want, k);
                    }
                }
            }
        }
        assert_eq!(
            amx_runs > 0,
            crate::weights::amx::int8(),
            "AMX ran where it is"
        );
    }

    /// Quantizing over the pool gives the serial pass's codes, scales and offsets.
    #[test]
    fn parallel_quantization_is_the_serial_one() {
        let ((rows, k, n), [x, wf, _]) = checks::cases(3).last().unwrap();
        assert!(rows >= 64, "a case large enough to be spread over the pool");
        let w = Int8Weight::new(&wf, n, k, ScaleLayout::Blocks).unwrap();
        let (a, b) = (
            QuantizedRows::new(&x, rows, &w, true),
            QuantizedRows::new(&x, rows, &w, false),
        );
        assert_eq!(
            (a.codes, a.scales, a.offsets),
            (b.codes, b.scales, b.offsets)
        );
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let w = Int8Weight::new(&[1.0; 6], 2, 3, ScaleLayout::Blocks).unwrap();
        let mut y = vec![0.0; 2];
        assert!(product(&mut y, &[1.0; 4], 1, &w, Start::Zero, Par::Auto).is_err());
        assert!(product(&mut y, &[1.0; 3], 2, &w, Start::Zero, Par::Auto).is_err());
        let err = product(&mut y, &[1.0; 3], 1, &w, Start::Bias(&[0.0; 3]), Par::Auto);
        assert!(err.unwrap_err().to_string().contains("bias"));
    }

    /// A NaN in x reaches y, as in f32, rather than vanishing into a code of 0.
    #[test]
    fn a_nan_in_x_reaches_y() {
        let mut x = vec![0.5; 64];
        x[40] = f32::NAN;
        for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
            let w = Int8Weight::new(&[1.0; 64], 1, 64, layout).unwrap();
            let forms = forms_here().into_iter();
            for f in forms.filter(|&f| f != Form::Amx || amx::available(&w)) {
                let mut y = vec![0.0; 1];
                let xq = QuantizedRows::new(&x, 1, &w, false);
                match f {
                    Form::Dot => tiles(&mut y, &xq, 1, &w, Start::Zero, Kernel::Vnni, Par::Auto),
                    Form::Widened => widened(&mut y, &xq, 1, &w, Start::Zero, Par::Auto).unwrap(),
                    Form::Amx => amx::product(&mut y, &xq, 1, &w, Start::Zero, false),
                }
                assert!(y[0].is_nan(), "{f:?} {layout:?}: {}", y[0]);
            }
        }
    }
}
