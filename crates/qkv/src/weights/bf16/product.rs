//! y (+)= x·Wᵀ for a bf16 weight: the form by the row count and the CPU (module docs
//! of [`super`]).

use super::convert::round_to_bf16;
use super::job::Job;
use super::weight::Bf16Weight;
use super::{amx, gemm, gemv};
use crate::error::{Error, Result};
use crate::ops::isa::Isa;
use crate::ops::Par;
use crate::weights::stored::{widened_product, Form, Kernel, Operands, StoredWeight};

/// The few-rows form's kernel: the widest vectors this CPU runs.
fn rows_kernel() -> Kernel {
    match Isa::detect() {
        Isa::Avx512 => Kernel::Avx512,
        Isa::Avx2 => Kernel::Avx2,
        Isa::Portable => Kernel::Plain,
    }
}

/// The forms (module docs of [`super`]): up to four rows with the weight widened in
/// registers; more through AMX's `tdpbf16ps`, AVX512-BF16's `vdpbf16ps` tiles, or x and
/// the weight widened into the f32 product.
impl StoredWeight for Bf16Weight {
    fn shape(&self) -> (usize, usize) {
        (self.n(), self.k())
    }

    fn element(&self, r: usize, c: usize) -> f32 {
        self.get(r, c)
    }

    fn bytes(&self) -> usize {
        Bf16Weight::bytes(self)
    }

    fn type_name(&self) -> &'static str {
        "bf16"
    }

    /// The few-rows and widened forms everywhere, `vdpbf16ps` where the CPU has
    /// AVX512-BF16, `tdpbf16ps` where it has AMX.
    fn forms_here(&self) -> Vec<Form> {
        let mut forms = vec![Form::Rows(rows_kernel()), Form::Widened];
        if gemm::available() {
            forms.push(Form::Tiles(Kernel::Bf16));
        }
        if amx::available() {
            forms.push(Form::Amx);
        }
        forms
    }

    fn form(&self, rows: usize) -> Form {
        if rows <= gemv::ROWS {
            Form::Rows(rows_kernel())
        } else if amx::available() {
            Form::Amx
        } else if gemm::preferred() {
            Form::Tiles(Kernel::Bf16)
        } else {
            Form::Widened
        }
    }

    /// A bias is copied into y first: these forms add to y or overwrite it.
    fn run(&self, form: Form, ops: Operands, par: Par) -> Result<()> {
        let Operands { y, x, rows, start } = ops;
        if matches!(form, Form::Rows(_)) && rows > gemv::ROWS {
            return Err(Error::invalid(
                "form",
                format!(
                    "the few-rows form takes at most {} rows, not {rows}",
                    gemv::ROWS
                ),
            ));
        }
        if form == Form::Widened {
            let xr: Vec<f32> = x.iter().map(|&v| round_to_bf16(v)).collect();
            return widened_product(
                self,
                Operands {
                    y,
                    x: &xr,
                    rows,
                    start,
                },
                par,
            );
        }
        start.prepare(y, self.n());
        let job = Job {
            y,
            x,
            rows,
            w: self,
            accumulate: start.accumulates(),
        };
        let parallel = par == Par::Auto;
        match form {
            Form::Rows(_) => gemv::product(job, parallel),
            Form::Amx => amx::product(job, parallel),
            _ => gemm::product(job, parallel),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::*;
    use crate::weights::stored::{checks, product, product_as, Start};

    /// Each form this CPU runs equals the twin within f32 rounding of the sums (their
    /// order differs):
    /// row counts on both sides of the few-rows limit and of a tile, odd K, a last
    /// panel of fewer than 16 columns, accumulation.
    #[test]
    fn every_row_count_equals_the_twin() {
        for ((rows, k, n), [x, wf, y0]) in checks::cases(7) {
            let w = Bf16Weight::new(&wf, n, k).unwrap();
            let bias = checks::bias(n);
            let forms = w.forms_here().into_iter();
            let forms = forms.filter(|f| !matches!(f, Form::Rows(_)) || rows <= 4);
            let starts = [Start::Zero, Start::Accumulate, Start::Bias(&bias)];
            for (form, start) in forms.flat_map(|f| starts.map(|s| (f, s))) {
                let got = checks::run_form(&w, form, (&x, &y0), rows, start, Par::Auto);
                let want = checks::twin(&y0, n, start, |y, acc| {
                    reference::product(y, &x, rows, &w, acc)
                });
                let what = format!("{form:?} {rows}x{k}x{n} {start:?}");
                checks::assert_near(&what, &got, &want, k);
            }
        }
    }

    /// Subnormal activations (below 2⁻¹²⁶ ≈ 1.2e-38) are rounded to bf16 alike by every
    /// form, but only the f32 products count them: `vdpbf16ps` and `tdpbf16ps` take
    /// subnormal inputs as zero (as oneDNN's bf16 products do on the same
    /// instructions). Against a weight of 2¹⁰⁰ they make sums of about 6e-9, which the
    /// twin, the widened and the few-rows forms give and the bf16 instructions drop.
    /// Such a term is below 2⁻²⁶ of the largest f32 the weight can meet it with, so
    /// it never shows beside a normal one.
    #[test]
    fn subnormal_inputs_count_in_the_f32_forms_only() {
        let (k, n) = (3, 17);
        for rows in [2, 40] {
            let x = vec![1.5e-39f32; rows * k];
            let w = Bf16Weight::new(&vec![2f32.powi(100); n * k], n, k).unwrap();
            let mut want = vec![0.0; rows * n];
            reference::product(&mut want, &x, rows, &w, false);
            assert!(want.iter().all(|&v| v > 5e-9), "{}", want[0]);
            let forms = w.forms_here().into_iter();
            for form in forms.filter(|f| !matches!(f, Form::Rows(_)) || rows <= 4) {
                let mut got = vec![0.0; rows * n];
                product_as(
                    form,
                    &w,
                    Operands {
                        y: &mut got,
                        x: &x,
                        rows,
                        start: Start::Zero,
                    },
                    Par::Auto,
                )
                .unwrap();
                let flushed = matches!(form, Form::Tiles(Kernel::Bf16) | Form::Amx);
                for (i, (&g, &t)) in got.iter().zip(&want).enumerate() {
                    // relative: the sums lie far below the other tests' absolute tolerance
                    let ok = if flushed {
                        g == 0.0
                    } else {
                        (g - t).abs() <= 1e-6 * t
                    };
                    assert!(ok, "{form:?} {rows} rows [{i}]: {g} vs {t}");
                }
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let w = Bf16Weight::new(&[1.0; 6], 2, 3).unwrap();
        let mut y = vec![0.0; 2];
        assert!(product(&w, &mut y, &[1.0; 4], 1, Start::Zero, Par::Auto).is_err());
        assert!(product(&w, &mut y, &[1.0; 3], 2, Start::Zero, Par::Auto).is_err());
        let ops = Operands {
            y: &mut [0.0; 10],
            x: &[1.0; 15],
            rows: 5,
            start: Start::Zero,
        };
        let few = product_as(Form::Rows(rows_kernel()), &w, ops, Par::Auto);
        assert!(few.unwrap_err().to_string().contains("at most 4 rows"));
    }
}
