//! y (+)= x·Wᵀ for an int8 weight: the form by the CPU (module docs of [`super`]).

use super::amx;
use super::kernel::{self, Kernel as Loops, Tile};
use super::rows::QuantizedRows;
use super::weight::Int8Weight;
use crate::error::Result;
use crate::ops::Par;
use crate::weights::stored::{
    sweep_panels, widened_product, At, Form, Operands, StoredWeight, Sums, TileKernel,
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
