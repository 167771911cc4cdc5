//! A `[N, K]` weight of f16 values as a GGUF file stores them (llama.cpp's converter
//! writes F16 by default, and its quantizer keeps F16 where a row is not a whole
//! number of 256-weight super-blocks), computed from as stored, as llama.cpp computes
//! them: the activations rounded to f16 (ggml's `vec_dot_type` for F16), both sides
//! widened to f32 as they are read, products and sums in f32.
//!
//! - up to 4 rows: dot products along each weight row, 16 values a
//!   `vcvtph2ps` on AVX-512, 8 with F16C on AVX2, plain loops elsewhere;
//! - more rows: each slab widened into the f32 product's packed layout.

use crate::error::{Error, Result};
use crate::ops::disjoint::Disjoint;
use crate::ops::for_each_task;
use crate::ops::isa::Isa;
use crate::ops::matmul::SlabSource;
use crate::ops::Par;
use crate::weights::stored::{widened_product, Form, Kernel, Operands, Start, StoredWeight};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Most rows that take the dot products.
const FEW_ROWS: usize = 4;

/// Weight rows a task of the dot products takes, at least.
const ROWS_PER_TASK: usize = 16;

/// An f16 weight, row-major `[N, K]`.
#[derive(Clone)]
pub struct F16Weight {
    n: usize,
    k: usize,
    bits: Vec<u16>,
}

impl std::fmt::Debug for F16Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "F16Weight {{ n: {}, k: {} }}", self.n, self.k)
    }
}

/// The dot products' kernel on this CPU.
fn dot_kernel() -> Kernel {
    match Isa::detect() {
        Isa::Avx512 => Kernel::Avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if is_x86_feature_detected!("f16c") => Kernel::Avx2,
        _ => Kernel::Plain,
    }
}

impl F16Weight {
    /// A `[n, k]` weight whose row r's values `row(r, dst)` writes into `dst` as f16
    /// bits; every value must be finite (an error names the row and column otherwise).
    pub fn from_rows(n: usize, k: usize, mut row: impl FnMut(usize, &mut [u16])) -> Result<Self> {
        if n == 0 || k == 0 {
            return Err(Error::invalid("f16 weight", format!("[{n}, {k}] is empty")));
        }
        let mut bits = vec![0u16; n * k];
        for (r, dst) in bits.chunks_exact_mut(k).enumerate() {
            row(r, dst);
            if let Some(c) = dst.iter().position(|&b| !f16::from_bits(b).is_finite()) {
                let v = f16::from_bits(dst[c]);
                return Err(Error::invalid(
                    "f16 weight",
                    format!("row {r}, column {c} holds {v}"),
                ));
            }
        }
        Ok(F16Weight { n, k, bits })
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes the values take.
    pub fn bytes(&self) -> usize {
        2 * self.bits.len()
    }

    fn row(&self, r: usize) -> &[u16] {
        &self.bits[r * self.k..][..self.k]
    }
}

/// The forms: dot products along each weight row for up to four rows (16 values a
/// `vcvtph2ps` on AVX-512, 8 with F16C on AVX2, plain loops anywhere), and each slab
/// widened into the f32 product for more.
impl StoredWeight for F16Weight {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn element(&self, r: usize, c: usize) -> f32 {
        f16::from_bits(self.bits[r * self.k + c]).to_f32()
    }

    fn bytes(&self) -> usize {
        F16Weight::bytes(self)
    }

    fn type_name(&self) -> &'static str {
        "f16"
    }

    fn forms_here(&self) -> Vec<Form> {
        let mut forms = vec![Form::Rows(Kernel::Plain), Form::Widened];
        match dot_kernel() {
            Kernel::Avx512 => forms.extend([Form::Rows(Kernel::Avx512), Form::Rows(Kernel::Avx2)]),
            Kernel::Avx2 => forms.push(Form::Rows(Kernel::Avx2)),
            _ => {}
        }
        forms
    }

    fn form(&self, rows: usize) -> Form {
        if rows > FEW_ROWS {
            Form::Widened
        } else {
            Form::Rows(dot_kernel())
        }
    }

    fn run(&self, form: Form, ops: Operands, par: Par) -> Result<()> {
        let x = &rounded(ops.x);
        let ops = Operands { x, ..ops };
        match form {
            Form::Rows(kernel) => dot_rows(kernel, self, ops, par),
            _ => widened_product(self, ops, par)?,
        }
        Ok(())
    }
}

impl SlabSource for F16Weight {
    fn pack_slab(&self, k0: usize, kc: usize, c0: usize, cols: usize, out: &mut [f32]) {
        const PANEL: usize = 16;
        assert!(c0.is_multiple_of(PANEL) && k0 + kc <= self.k && c0 + cols <= self.n);
        let panels = cols.div_ceil(PANEL);
        out[..panels * kc * PANEL].fill(0.0);
        // each row's run widened at once (the half crate converts slices with F16C),
        // then spread down its panel's column
        let mut widened = vec![0.0f32; kc];
        for c in 0..cols {
            let bits: &[f16] = self.row(c0 + c)[k0..k0 + kc].reinterpret_cast();
            bits.convert_to_f32_slice(&mut widened);
            let dst = &mut out[(c / PANEL) * kc * PANEL + c % PANEL..];
            for (p, &v) in widened.iter().enumerate() {
                dst[p * PANEL] = v;
            }
        }
    }
}

/// The dot products' form: threads split the weight's rows; each task takes its rows
/// [`DOTS`] at a time against every row of x (x rounded already).
fn dot_rows(kernel: Kernel, w: &F16Weight, ops: Operands, par: Par) {
    let Operands { y, x, rows, start } = ops;
    let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
    let (n, k) = (w.n, w.k);
    let chunk = if parallel {
        n.div_ceil(rayon::current_num_threads()).max(ROWS_PER_TASK)
    } else {
        n
    };
    let out = Disjoint::new(y);
    let run = |j0: usize| {
        let j1 = n.min(j0 + chunk);
        for r in 0..rows {
            let xr = &x[r * k..][..k];
            // SAFETY: columns j0..j1 of every row belong to this task alone
            let dst = unsafe { out.range(r * n + j0, j1 - j0) };
            for (q, dst) in (j0..j1).step_by(DOTS).zip(dst.chunks_mut(DOTS)) {
                // a short last quad repeats its last row; those sums are dropped
                let rows = std::array::from_fn(|i| w.row((q + i).min(j1 - 1)));
                for (i, (d, v)) in dst.iter_mut().zip(dots(kernel, rows, xr)).enumerate() {
                    *d = match start {
                        Start::Zero => v,
                        Start::Accumulate => *d + v,
                        Start::Bias(b) => v + b[q + i],
                    };
                }
            }
        }
    };
    if parallel {
        for_each_task(n.div_ceil(chunk), |t| run(t * chunk));
    } else {
        run(0);
    }
}

/// x rounded to f16 (to nearest, ties to even), as llama.cpp rounds the activations of
/// its F16 products; a NaN stays NaN.
pub fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

/// Weight rows a pass of the dot products takes: x is read once for all of them.
const DOTS: usize = 4;

/// Σ_c w[i][c]·x[c] for each of the rows w[i], by the given kernel.
fn dots(kernel: Kernel, w: [&[u16]; DOTS], x: &[f32]) -> [f32; DOTS] {
    match kernel {
        // SAFETY: the form is one the CPU runs (`forms_here`); the lengths are equal.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { x86::dots512(w, x) },
        // SAFETY: as above
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::dots256(w, x) },
        _ => w.map(|w| {
            w.iter()
                .zip(x)
                .map(|(&b, &x)| f16::from_bits(b).to_f32() * x)
                .sum()
        }),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::DOTS;
    use crate::ops::vector::Vector;
    use std::arch::x86_64::*;

    /// A vector width that f16 weights widen into.
    trait HalfWidth: Vector {
        /// `LANES` f16 values from memory, widened to f32.
        unsafe fn widen(p: *const u16) -> Self;
    }

    impl HalfWidth for __m512 {
        #[inline(always)]
        unsafe fn widen(p: *const u16) -> Self {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
        }
    }

    impl HalfWidth for __m256 {
        #[inline(always)]
        unsafe fn widen(p: *const u16) -> Self {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        }
    }

    /// The values of `w` and `x` from `at` on, fewer than a vector's `L`, as vectors
    /// padded with zeros (zero times zero adds nothing to the sums).
    fn padded<const L: usize>(w: &[u16], x: &[f32], at: usize) -> ([u16; L], [f32; L]) {
        let (mut wt, mut xt) = ([0u16; L], [0.0f32; L]);
        wt[..w.len() - at].copy_from_slice(&w[at..]);
        xt[..x.len() - at].copy_from_slice(&x[at..]);
        (wt, xt)
    }

    /// acc[i] += w[i][0..L]·x[0..L], lane by lane.
    #[inline(always)]
    unsafe fn step<V: HalfWidth>(acc: &mut [V; DOTS], w: [*const u16; DOTS], x: *const f32) {
        let xv = V::load(x);
        for (a, w) in acc.iter_mut().zip(w) {
            *a = V::widen(w).mul_add(xv, *a);
        }
    }

    /// The dot products on vectors of `L` = `V::LANES` lanes: whole vectors, then the
    /// tail zero-padded to one.
    #[inline(always)]
    unsafe fn dots<V: HalfWidth, const L: usize>(w: [&[u16]; DOTS], x: &[f32]) -> [f32; DOTS] {
        debug_assert_eq!(L, V::LANES);
        let whole = x.len() / L * L;
        let mut acc = [V::zero(); DOTS];
        for c in (0..whole).step_by(L) {
            step(&mut acc, w.map(|w| w.as_ptr().add(c)), x.as_ptr().add(c));
        }
        if whole < x.len() {
            let tails = w.map(|w| padded::<L>(w, x, whole));
            step(
                &mut acc,
                tails.each_ref().map(|t| t.0.as_ptr()),
                tails[0].1.as_ptr(),
            );
        }
        acc.map(|a| a.sum())
    }

    /// # Safety
    /// AVX-512 F and F16C; every row of `w` as long as `x`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dots512(w: [&[u16]; DOTS], x: &[f32]) -> [f32; DOTS] {
        dots::<__m512, 16>(w, x)
    }

    /// # Safety
    /// AVX2, FMA and F16C; every row of `w` as long as `x`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dots256(w: [&[u16]; DOTS], x: &[f32]) -> [f32; DOTS] {
        dots::<__m256, 8>(w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::stored::{self, checks, reference_product};

    fn weight(n: usize, k: usize, seed: u64) -> F16Weight {
        let v = crate::rng::Rng::new(seed).normals(n * k, 1.0);
        F16Weight::from_rows(n, k, |r, dst| {
            for (d, &v) in dst.iter_mut().zip(&v[r * k..]) {
                *d = f16::from_f32(v).to_bits();
            }
        })
        .unwrap()
    }

    /// Every form equals the twin (x rounded to f16, the weight widened, then the f32
    /// product) within f32 rounding: a row and a few, odd K (a tail past the vectors),
    /// each start.
    #[test]
    fn every_form_equals_the_twin() {
        let mut rng = crate::rng::Rng::new(3);
        for ((rows, k, n), [x, _, y0]) in checks::cases(5) {
            let w = weight(n, k, rows as u64);
            let bias = rng.normals(n, 1.0);
            for start in [Start::Zero, Start::Accumulate, Start::Bias(&bias)] {
                let xr = rounded(&x);
                let want = checks::twin(&y0, n, start, |y, acc| {
                    reference_product(y, &xr, rows, &w, acc)
                });
                for f in w.forms_here() {
                    let got = checks::run_form(&w, f, (&x, &y0), rows, start, Par::Auto);
                    checks::assert_near(&format!("{f:?} {rows}x{k}x{n} {start:?}"), &got, &want, k);
                }
            }
        }
        checks::assert_slabs(&weight(37, 45, 1), &[(0, 45, 0, 37), (3, 33, 16, 21)]);
    }

    #[test]
    fn bad_weights_and_operands_are_refused() {
        let err = F16Weight::from_rows(2, 3, |r, dst| {
            dst.fill(0);
            if r == 1 {
                dst[2] = f16::INFINITY.to_bits();
            }
        });
        assert!(err.unwrap_err().to_string().contains("row 1, column 2"));
        let w = weight(2, 3, 1);
        let mut y = vec![0.0; 2];
        assert!(stored::product(&w, &mut y, &[1.0; 4], 1, Start::Zero, Par::Auto).is_err());
        let mut x = vec![1.0; 3];
        x[1] = f32::NAN;
        stored::product(&w, &mut y, &x, 1, Start::Zero, Par::Auto).unwrap();
        assert!(y.iter().all(|v| v.is_nan()));
    }
}
