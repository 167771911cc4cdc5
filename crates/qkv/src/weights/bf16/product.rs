//! y (+)= x·Wᵀ for a bf16 weight: the form by the row count and the CPU (module docs
//! of [`super`]).

use super::convert::round_to_bf16;
use super::operands::Operands;
use super::weight::Bf16Weight;
use super::{amx, gemm, gemv};
use crate::error::Result;
use crate::ops::Par;
use crate::weights::stored::{check_operands, widened_product};

/// Which form a product of `rows` rows takes. Each computes bf16(x)·Wᵀ with products
/// and sums in f32; they differ in the order of the sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The weight widened in registers: a few rows.
    FewRows,
    /// `vdpbf16ps`: many rows on AVX512-BF16.
    DotBf16,
    /// `tdpbf16ps`: many rows on AMX.
    Amx,
    /// x and the weight widened to f32 once, then the f32 product: many rows elsewhere.
    Widened,
}

/// The form [`product`] takes for `rows` rows on this CPU.
pub fn form(rows: usize) -> Form {
    if rows <= gemv::ROWS {
        Form::FewRows
    } else if amx::available() {
        Form::Amx
    } else if gemm::preferred() {
        Form::DotBf16
    } else {
        Form::Widened
    }
}

/// y `[rows, N]` ← (accumulate ? y : 0) + bf16(x) `[rows, K]`·Wᵀ, row-major: x rounded
/// to bf16 as the weight is, products and sums in f32. Errors when the lengths do not
/// match the weight's shape.
pub fn product(
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    w: &Bf16Weight,
    accumulate: bool,
    par: Par,
) -> Result<()> {
    check_operands("bf16 product operands", y, x, rows, w)?;
    if rows == 0 {
        return Ok(());
    }
    let ops = Operands {
        y,
        x,
        rows,
        w,
        accumulate,
    };
    run(form(rows), ops, par)
}

/// The forms this CPU can run (what the tests compare): the few-rows and widened forms
/// everywhere, `vdpbf16ps` where the CPU has AVX512-BF16, `tdpbf16ps` where it has AMX.
pub fn forms_here() -> Vec<Form> {
    let mut forms = vec![Form::FewRows, Form::Widened];
    if gemm::available() {
        forms.push(Form::DotBf16);
    }
    if amx::available() {
        forms.push(Form::Amx);
    }
    forms
}

/// [`product`] in a given form, on checked operands (the few-rows form takes at most
/// four rows).
fn run(form: Form, ops: Operands<'_>, par: Par) -> Result<()> {
    let parallel = par == Par::Auto;
    match form {
        Form::FewRows => gemv::product(ops, parallel),
        Form::DotBf16 => gemm::product(ops, parallel),
        Form::Amx => amx::product(ops, parallel),
        Form::Widened => widened(ops, par)?,
    }
    Ok(())
}

/// The widened form: x rounded once, then the f32 product with the weight widened slab
/// by slab as the product packs it ([`crate::ops::matmul::SlabSource`]).
fn widened(ops: Operands<'_>, par: Par) -> Result<()> {
    let Operands {
        y,
        x,
        rows,
        w,
        accumulate,
    } = ops;
    let xr: Vec<f32> = x.iter().map(|&v| round_to_bf16(v)).collect();
    widened_product(y, &xr, rows, w, accumulate, par)
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::*;
    use crate::weights::stored::checks;

    /// Each form this CPU runs equals the twin within f32 rounding of the sums (their
    /// order differs):
    /// row counts on both sides of the few-rows limit and of a tile, odd K, a last
    /// panel of fewer than 16 columns, accumulation.
    #[test]
    fn every_row_count_equals_the_twin() {
        for ((rows, k, n), [x, wf, y0]) in checks::cases(7) {
            let w = Bf16Weight::new(&wf, n, k).unwrap();
            let forms = forms_here()
                .into_iter()
                .filter(|&f| f != Form::FewRows || rows <= 4);
            for (form, accumulate) in forms.flat_map(|f| [(f, false), (f, true)]) {
                let mut got = y0.clone();
                let ops = Operands {
                    y: &mut got,
                    x: &x,
                    rows,
                    w: &w,
                    accumulate,
                };
                run(form, ops, Par::Auto).unwrap();
                let mut want = y0.clone();
                reference::product(&mut want, &x, rows, &w, accumulate);
                let what = format!("{form:?} {rows}x{k}x{n} acc {accumulate}");
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
            let forms = forms_here()
                .into_iter()
                .filter(|&f| f != Form::FewRows || rows <= 4);
            for form in forms {
                let mut got = vec![0.0; rows * n];
                let ops = Operands {
                    y: &mut got,
                    x: &x,
                    rows,
                    w: &w,
                    accumulate: false,
                };
                run(form, ops, Par::Auto).unwrap();
                let flushed = matches!(form, Form::DotBf16 | Form::Amx);
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
        assert!(product(&mut y, &[1.0; 4], 1, &w, false, Par::Auto).is_err());
        assert!(product(&mut y, &[1.0; 3], 2, &w, false, Par::Auto).is_err());
    }
}
