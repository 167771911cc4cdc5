//! y (+)= x·Wᵀ for a weight in blocks: the form by the row count and the CPU (module
//! docs of [`super`]).

use super::activations::{QuantizedX, XRow};
use super::plain;
use super::weight::BlockWeight;
use super::BlockType;
use crate::error::{Error, Result};
use crate::ops::disjoint::Disjoint;
use crate::ops::int8::Start;
use crate::ops::stored::{check_operands, widened_product};
use crate::ops::Par;
use rayon::prelude::*;

/// Which form a product takes. All compute deq(q(x))·deq(W)ᵀ; they differ in the
/// order of the f32 sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Integer dot products per block with `vpdpbusd`: a few rows on AVX-512 VNNI.
    Dot,
    /// The same dot products in plain loops: a few rows elsewhere.
    Plain,
    /// Both operands dequantized into the f32 product, slab by slab: more rows.
    Widened,
}

/// Most rows that take the dot products: beyond them, the f32 product's tiles reuse
/// each dequantized slab over many rows.
const FEW_ROWS: usize = 4;

/// Weight rows a task of the dot products takes, at least.
const ROWS_PER_TASK: usize = 16;

/// The form [`product`] takes on this CPU for `rows` rows.
pub fn form(rows: usize) -> Form {
    if rows > FEW_ROWS {
        Form::Widened
    } else if dot_here() {
        Form::Dot
    } else {
        Form::Plain
    }
}

/// Whether this CPU runs the `vpdpbusd` dot products.
fn dot_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The forms this CPU can run (what the tests compare).
pub fn forms_here() -> Vec<Form> {
    let mut forms = vec![Form::Plain, Form::Widened];
    if dot_here() {
        forms.push(Form::Dot);
    }
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
        Form::Dot | Form::Plain => dots(y, &xq, w, start, form == Form::Dot, parallel),
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

/// The dot products: the weight's rows cut into runs, one task each, every x row
/// against each weight row as it passes ([`FEW_ROWS`] at a time).
fn dots(y: &mut [f32], xq: &QuantizedX, w: &BlockWeight, start: Start, vnni: bool, parallel: bool) {
    let (n, rows) = (w.n(), xq.rows());
    let chunk = if parallel {
        n.div_ceil(rayon::current_num_threads()).max(ROWS_PER_TASK)
    } else {
        n
    };
    let out = Disjoint::new(y);
    let run = |j0: usize| {
        let j1 = n.min(j0 + chunk);
        let mut sums = vec![0.0f32; rows * (j1 - j0)];
        let x: Vec<XRow> = (0..rows).map(|r| xq.row(r)).collect();
        for j in j0..j1 {
            for r0 in (0..rows).step_by(FEW_ROWS) {
                let v = row_dots(w.ty(), w.row(j), &x[r0..], vnni);
                for (r, v) in v.iter().take(rows - r0).enumerate() {
                    sums[(r0 + r) * (j1 - j0) + j - j0] = *v;
                }
            }
        }
        for (r, got) in sums.chunks_exact(j1 - j0).enumerate() {
            // SAFETY: columns j0..j1 of every row belong to this task alone
            let dst = unsafe { out.range(r * n + j0, j1 - j0) };
            match start {
                Start::Zero => dst.copy_from_slice(got),
                Start::Accumulate => dst.iter_mut().zip(got).for_each(|(d, &s)| *d += s),
                Start::Bias(b) => dst
                    .iter_mut()
                    .zip(got.iter().zip(&b[j0..j1]))
                    .for_each(|(d, (&s, &b))| *d = s + b),
            }
        }
    };
    if parallel {
        (0..n).into_par_iter().step_by(chunk).for_each(run);
    } else {
        run(0);
    }
}

/// One weight row `wr` against the first [`FEW_ROWS`] (or fewer) rows of `x`.
fn row_dots(ty: BlockType, wr: &[u8], x: &[XRow], vnni: bool) -> [f32; FEW_ROWS] {
    let rows = x.len().min(FEW_ROWS);
    let mut out = [0.0f32; FEW_ROWS];
    #[cfg(target_arch = "x86_64")]
    if vnni {
        macro_rules! call {
            ($r:literal) => {{
                let xs: [XRow; $r] = std::array::from_fn(|i| x[i]);
                // SAFETY: `vnni` is set only where the CPU has the instructions; the
                // row and x hold whole blocks of K steps.
                let (got, done) = unsafe { vector_dots::<$r>(ty, wr, xs) };
                for (i, v) in got.into_iter().enumerate() {
                    out[i] = v + tail(ty, wr, x[i], done);
                }
            }};
        }
        match rows {
            1 => call!(1),
            2 => call!(2),
            3 => call!(3),
            _ => call!(4),
        }
        return out;
    }
    let _ = vnni;
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        *o = plain::dot(ty, wr, x[r]);
    }
    out
}

/// The vector forms for R rows, and the blocks they covered (all but an odd last
/// Q4_0 block).
///
/// # Safety
/// As [`super::x86::dot_k45`].
#[cfg(target_arch = "x86_64")]
unsafe fn vector_dots<const R: usize>(ty: BlockType, wr: &[u8], x: [XRow; R]) -> ([f32; R], usize) {
    use super::x86;
    let blocks = wr.len() / ty.bytes();
    match ty {
        BlockType::Q4_0 => x86::dot_q4_0(wr, x),
        BlockType::Q4K => (x86::dot_k45(wr, x, false), blocks),
        BlockType::Q5K => (x86::dot_k45(wr, x, true), blocks),
        BlockType::Q6K => (x86::dot_q6_k(wr, x), blocks),
    }
}

/// The blocks of `wr` from `done` on, in plain loops.
#[cfg(target_arch = "x86_64")]
fn tail(ty: BlockType, wr: &[u8], (q, s, sums): XRow, done: usize) -> f32 {
    let per = ty.weights();
    if done * ty.bytes() == wr.len() {
        return 0.0;
    }
    let x = (&q[done * per..], &s[done..], &sums[done * per / 16..]);
    plain::dot(ty, &wr[done * ty.bytes()..], x)
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::super::weight::tests::random;
    use super::*;
    use crate::ops::stored::checks;
    use crate::rng::Rng;

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

    /// The vector forms give the plain loops' sums, up to the order of the f32 sums
    /// over blocks, on weights of every byte value.
    #[test]
    fn vector_dots_equal_the_plain_loops() {
        let mut rng = Rng::new(11);
        for ty in BlockType::ALL {
            let k = 8 * QK;
            let w = random(ty, 5, k, 2);
            let x = rng.normals(3 * k, 2.0);
            let xq = QuantizedX::new(&x, 3, k, ty, false);
            let rows: Vec<XRow> = (0..3).map(|r| xq.row(r)).collect();
            for j in 0..5 {
                let got = row_dots(ty, w.row(j), &rows, dot_here());
                let want = row_dots(ty, w.row(j), &rows, false);
                checks::assert_near(&format!("{ty:?} row {j}"), &got, &want, k);
            }
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
