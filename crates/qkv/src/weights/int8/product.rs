//! y (+)= x·Wᵀ for an int8 weight: the form by the CPU (module docs of [`super`]).

use super::amx;
use super::kernel::{self, Kernel as Loops, Tile};
use super::rows::QuantizedRows;
use super::weight::Int8Weight;
use crate::error::Result;
use crate::ops::Par;
use crate::weights::stored::{
    check_operands, sweep_panels, sweep_panels_of, widened_product, At, Form, Operands, Start,
    StoredWeight, Sums, TileKernel,
};

/// Most rows that take the VNNI tiles even where AMX is there: a decoding step's few
/// rows would fill a sixteenth of a tile.
const FEW_ROWS: usize = 4;

/// The forms (module docs of [`super`]): tiles exact in i32 within a group, by
/// `vpdpbusd` on AVX-512 VNNI, by `vpmaddubsw` on AVX2 and in plain loops; both
/// operands dequantized into the f32 product (the form without AVX2); and AMX's
/// `tdpbsud` (exact in i32 over all of K) for more than four rows times a weight with a
/// scale per row, where the process has AMX-INT8.
impl StoredWeight for Int8Weight {
    fn shape(&self) -> (usize, usize) {
        (self.n(), self.k())
    }

    fn element(&self, r: usize, c: usize) -> f32 {
        f32::from(self.code(r, c)) * self.scale(r, c)
    }

    fn bytes(&self) -> usize {
        Int8Weight::bytes(self)
    }

    fn type_name(&self) -> &'static str {
        "int8"
    }

    fn forms_here(&self) -> Vec<Form> {
        let mut forms = vec![Form::Widened];
        forms.extend(Loops::here().into_iter().map(|k| Form::Tiles(k.named())));
        if amx::available(self) {
            forms.push(Form::Amx);
        }
        forms
    }

    fn form(&self, rows: usize) -> Form {
        if rows > FEW_ROWS && amx::available(self) {
            Form::Amx
        } else {
            match Loops::best() {
                Loops::Plain => Form::Widened,
                best => Form::Tiles(best.named()),
            }
        }
    }

    fn run(&self, form: Form, ops: Operands, par: Par) -> Result<()> {
        let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
        let xq = QuantizedRows::new(ops.x, ops.rows, self, parallel);
        match form {
            Form::Tiles(kernel) => {
                let kernel = Loops::of(kernel);
                // four tasks a thread
                sweep_panels(
                    &Tiles {
                        kernel,
                        xq: &xq,
                        w: self,
                    },
                    ops,
                    4,
                    parallel,
                )
            }
            Form::Amx => amx::product(ops.y, &xq, ops.rows, self, ops.start, parallel),
            Form::Widened | Form::Rows(_) => {
                let x = &xq.dequantized(self.k());
                widened_product(self, Operands { x, ..ops }, par)?
            }
        }
        Ok(())
    }
}

/// y_i ← start_i + x `[rows, K]`·W_iᵀ for int8 weights that read the same x (an
/// attention's Q, K and V; a gated FFN's gate and up): x quantized once, and every
/// weight's panels swept in one job (`stored::sweep_panels_of`), where one product each
/// would quantize x and hand off a job per weight. `Ok(false)`, nothing written,
/// where the weights differ in K or in grouping, or where this CPU's form for `rows`
/// rows is not the tiles (AMX, the widened form): then each is a product of its own.
/// Errors when the lengths do not match a weight.
pub fn fused_products(
    parts: Vec<(&Int8Weight, &mut [f32], Start)>,
    x: &[f32],
    rows: usize,
    par: Par,
) -> Result<bool> {
    for (w, y, start) in &parts {
        check_operands(*w, y, x, rows, *start)?;
    }
    let Some(&(first, ..)) = parts.first() else {
        return Ok(true);
    };
    if rows == 0 {
        return Ok(true);
    }
    let weights: Vec<&Int8Weight> = parts.iter().map(|&(w, ..)| w).collect();
    if !fusable(&weights, rows) {
        return Ok(false);
    }
    let Form::Tiles(named) = first.form(rows) else {
        unreachable!("fusable weights take the tiles")
    };
    let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
    let xq = QuantizedRows::new(x, rows, first, parallel);
    let kernel = Loops::of(named);
    let tiles: Vec<Tiles> = parts
        .iter()
        .map(|&(w, ..)| Tiles { kernel, xq: &xq, w })
        .collect();
    let sweeps = tiles
        .iter()
        .zip(parts)
        .map(|(t, (_, y, start))| (t, Operands { y, x, rows, start }))
        .collect();
    // four tasks a thread, as one product takes
    sweep_panels_of(sweeps, 4, parallel);
    Ok(true)
}

/// Whether [`fused_products`] can take `weights` for `rows` rows: this CPU's form for
/// them is the tiles, and they share K and a grouping (so x is quantized once for all).
/// A caller asks before it allocates the outputs.
pub fn fusable(weights: &[&Int8Weight], rows: usize) -> bool {
    let key = |w: &Int8Weight| (w.k(), w.quads(), w.group(), w.layout(), w.form(rows));
    match weights.first() {
        Some(first) => {
            matches!(first.form(rows), Form::Tiles(_))
                && weights.iter().all(|w| key(w) == key(first))
        }
        None => true,
    }
}

/// The tiles of one product: x's rows quantized, the weight's panels, by one kernel.
struct Tiles<'a> {
    kernel: Loops,
    xq: &'a QuantizedRows,
    w: &'a Int8Weight,
}

impl TileKernel for Tiles<'_> {
    fn sums<const R: usize, const NP: usize>(&self, at: At<NP>, out: &mut Sums<R, NP>) {
        let At { r0, panels } = at;
        let t = Tile::<R, NP> {
            x: std::array::from_fn(|i| self.xq.row(r0 + i)),
            codes: panels.map(|j| self.w.panel_codes(j)),
            scales: panels.map(|j| self.w.panel_scales(j)),
            group: self.w.group(),
        };
        kernel::tile_on(self.kernel, &t, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::super::weight::ScaleLayout;
    use super::*;
    use crate::weights::stored::{checks, product, Kernel, Start};

    /// Every form, and the tiles with the plain kernel on any CPU, equal the twin within
    /// f32 rounding of the sums over groups: row counts around a tile, one row, odd K, a
    /// last block shorter than 32, a last panel of fewer than 16 columns, both layouts,
    /// each start (zero, y's values, a bias), x quantized serially and over the pool.
    #[test]
    fn every_form_equals_the_twin() {
        let mut amx_runs = 0;
        for ((rows, k, n), [x, wf, y0]) in checks::cases(11) {
            let bias = checks::bias(n);
            for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
                let w = Int8Weight::new(&wf, n, k, layout).unwrap();
                for start in [Start::Zero, Start::Accumulate, Start::Bias(&bias)] {
                    let want = checks::twin(&y0, n, start, |y, acc| {
                        reference::product(y, &x, rows, &w, acc)
                    });
                    let mut runs: Vec<(String, Vec<f32>)> = Vec::new();
                    for f in w.forms_here() {
                        for par in [Par::Auto, Par::Single] {
                            let got = checks::run_form(&w, f, (&x, &y0), rows, start, par);
                            runs.push((format!("{f:?} {par:?}"), got));
                        }
                    }
                    if amx::available(&w) {
                        // the same operations as the VNNI tiles, in the same order
                        let vnni = format!("{:?} Auto", Form::Tiles(Kernel::Vnni));
                        let amx = format!("{:?} Auto", Form::Amx);
                        let find = |name: &str| runs.iter().find(|(n, _)| n == name).map(|r| &r.1);
                        if let (Some(a), Some(v)) = (find(&amx), find(&vnni)) {
                            assert_eq!(a, v, "amx {layout:?} {rows}x{k}x{n} {start:?}");
                        }
                        amx_runs += 1;
                    }
                    let mut got = y0.clone();
                    product(&w, &mut got, &x, rows, start, Par::Auto).unwrap();
                    runs.push((format!("product ({:?})", w.form(rows)), got));
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
        assert!(product(&w, &mut y, &[1.0; 4], 1, Start::Zero, Par::Auto).is_err());
        assert!(product(&w, &mut y, &[1.0; 3], 2, Start::Zero, Par::Auto).is_err());
        let err = product(&w, &mut y, &[1.0; 3], 1, Start::Bias(&[0.0; 3]), Par::Auto);
        assert!(err.unwrap_err().to_string().contains("bias"));
    }

    /// Three weights of one K (Q's width, and K's and V's smaller, one not a whole
    /// panel) swept in one job give each weight's own product bit for bit: x
    /// quantized once is quantized as each product quantizes it, and every column's
    /// sums are the same tile's. Each start, one row and several, over the pool and on
    /// one thread.
    #[test]
    fn fused_products_equal_each_product() {
        let mut rng = crate::rng::Rng::new(5);
        let k = 96;
        for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
            let ws: Vec<Int8Weight> = [64, 40, 40]
                .map(|n| Int8Weight::new(&rng.normals(n * k, 1.0), n, k, layout).unwrap())
                .into();
            for rows in [1, 3, 5, 13] {
                let x = rng.normals(rows * k, 1.0);
                let bias = checks::bias(40);
                for start in [Start::Zero, Start::Accumulate, Start::Bias(&bias)] {
                    // a bias is only Q's to take ([40], K's and V's width): Q starts at zero
                    let starts = [Start::adding(start.accumulates()), start, start];
                    for par in [Par::Auto, Par::Single] {
                        let y0: Vec<Vec<f32>> =
                            ws.iter().map(|w| rng.normals(rows * w.n(), 1.0)).collect();
                        let mut fused = y0.clone();
                        let parts = ws
                            .iter()
                            .zip(fused.iter_mut())
                            .zip(starts)
                            .map(|((w, y), s)| (w, y.as_mut_slice(), s))
                            .collect();
                        let done = fused_products(parts, &x, rows, par).unwrap();
                        let tiles = matches!(ws[0].form(rows), Form::Tiles(_));
                        assert_eq!(done, tiles, "fused where the form is the tiles");
                        if !done {
                            assert_eq!(fused, y0, "nothing written when not fused");
                            continue;
                        }
                        for ((w, (y, got)), s) in ws.iter().zip(y0.iter().zip(&fused)).zip(starts) {
                            let mut want = y.clone();
                            product(w, &mut want, &x, rows, s, par).unwrap();
                            assert_eq!(got, &want, "{layout:?} rows {rows} {s:?} {par:?}");
                        }
                    }
                }
            }
        }
    }

    /// Weights of two groupings are not fused (x would be quantized twice), and
    /// operands that do not fit a weight are an error before anything is written.
    #[test]
    fn fused_products_refuse_what_they_cannot_share() {
        let blocks = Int8Weight::new(&[1.0; 64 * 16], 16, 64, ScaleLayout::Blocks).unwrap();
        let rows_w = Int8Weight::new(&[1.0; 64 * 16], 16, 64, ScaleLayout::Rows).unwrap();
        let (mut a, mut b) = (vec![7.0; 16], vec![7.0; 16]);
        let parts = vec![
            (&blocks, a.as_mut_slice(), Start::Zero),
            (&rows_w, b.as_mut_slice(), Start::Zero),
        ];
        assert!(!fusable(&[&blocks, &rows_w], 1));
        let tiles = matches!(blocks.form(1), Form::Tiles(_));
        assert_eq!(fusable(&[&blocks, &blocks], 1), tiles);
        assert!(!fused_products(parts, &[1.0; 64], 1, Par::Auto).unwrap());
        assert_eq!((a[0], b[0]), (7.0, 7.0));
        let parts = vec![(&blocks, a.as_mut_slice(), Start::Zero)];
        assert!(fused_products(parts, &[1.0; 63], 1, Par::Auto).is_err());
    }

    /// A NaN in x reaches y, as in f32, rather than vanishing into a code of 0.
    #[test]
    fn a_nan_in_x_reaches_y() {
        let mut x = vec![0.5; 64];
        x[40] = f32::NAN;
        for layout in [ScaleLayout::Blocks, ScaleLayout::Rows] {
            let w = Int8Weight::new(&[1.0; 64], 1, 64, layout).unwrap();
            for f in w.forms_here() {
                let y = checks::run_form(&w, f, (&x, &[0.0; 1]), 1, Start::Zero, Par::Auto);
                assert!(y[0].is_nan(), "{f:?} {layout:?}: {}", y[0]);
            }
        }
    }
}
