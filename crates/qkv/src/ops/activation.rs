//! Pointwise activations under the names Hugging Face configs use.

use super::fastmath;
use super::pool::for_each_chunk_mut;
use crate::error::{Error, Result};
use rayon::prelude::*;

/// An elementwise nonlinearity. Serialised under the Hugging Face name of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Activation {
    #[serde(rename = "relu")]
    Relu,
    /// Exact GELU, x·Φ(x) with the error function (`gelu` in HF configs).
    #[serde(rename = "gelu")]
    Gelu,
    /// The tanh approximation (`gelu_new`, `gelu_pytorch_tanh`, GPT-2's choice).
    #[serde(rename = "gelu_new")]
    GeluTanh,
    /// x·σ(x), also called swish (Llama's SwiGLU gate).
    #[serde(rename = "silu")]
    Silu,
}

/// Elements per parallel task of the slice forms; slices shorter than four of these run
/// on the calling thread.
const CHUNK: usize = 1 << 14;
/// Shortest slice whose transcendental activation (not ReLU) is split over the threads.
const SHORT: usize = 1 << 13;

impl Activation {
    /// Maps a config's `hidden_act` / `activation_function` name.
    pub fn from_hf_name(name: &str) -> Result<Self> {
        match name {
            "relu" => Ok(Activation::Relu),
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
            "silu" | "swish" => Ok(Activation::Silu),
            other => Err(Error::invalid(
                "activation",
                format!("unknown activation `{other}` (known: relu, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, silu, swish)"),
            )),
        }
    }

    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Relu => x.max(0.0),
            Activation::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
            Activation::GeluTanh => {
                // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                0.5 * x * (1.0 + fastmath::tanh(SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)))
            }
            Activation::Silu => x / (1.0 + fastmath::exp(-x)),
        }
    }

    /// Applies the activation to every element in place. A long slice (an FFN's
    /// `[tokens, 4C]`) is split over the threads; every activation but ReLU runs 8 lanes
    /// at a time on AVX2 + FMA (the vector `erf` and `exp`), where
    /// [`Activation::apply`] (libm's `erff`, `fastmath`'s `exp` and `tanh`) is the
    /// readable twin.
    pub fn apply_slice(self, xs: &mut [f32]) {
        let threads = rayon::current_num_threads();
        // ReLU is a max per value, too cheap to split below the long-slice size; the
        // others evaluate erf, tanh or exp, about 2.5 ns a value for exact GELU, so a
        // sentence's FFN (13 × 1536 values, 50 µs) is already worth two threads.
        let min = match self {
            Activation::Relu => 4 * CHUNK,
            _ => SHORT,
        };
        if xs.len() >= min && threads > 1 {
            let chunk = xs.len().div_ceil(threads).min(CHUNK);
            for_each_chunk_mut(xs, chunk, |c| self.apply_chunk(c));
        } else {
            self.apply_chunk(xs);
        }
    }

    fn apply_chunk(self, xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self != Activation::Relu && super::simd::avx2_fma() {
            x86::apply(super::isa::Isa::detect(), self, xs);
            return;
        }
        // One loop per variant: with the variant fixed, `apply` inlines to branch-free
        // arithmetic and the loop vectorises.
        fn each(xs: &mut [f32], f: impl Fn(f32) -> f32) {
            for x in xs {
                *x = f(*x);
            }
        }
        match self {
            Activation::Relu => each(xs, |x| Activation::Relu.apply(x)),
            Activation::Gelu => each(xs, |x| Activation::Gelu.apply(x)),
            Activation::GeluTanh => each(xs, |x| Activation::GeluTanh.apply(x)),
            Activation::Silu => each(xs, |x| Activation::Silu.apply(x)),
        }
    }

    /// The derivative f′(x) at the pre-activation value `x` (what `apply` was given).
    ///
    /// Each form is the analytic derivative of the formula in [`Activation::apply`],
    /// written as PyTorch's own backward kernels write it:
    /// - ReLU: 1 for x > 0, else 0 (0 at the kink, as `threshold_backward`).
    /// - GELU: Φ(x) + x·φ(x), with φ the standard normal density.
    /// - GELU tanh: with u = √(2/π)·(x + 0.044715·x³) and t = tanh(u),
    ///   ½(1 + t) + ½x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²).
    /// - SiLU: σ(x)·(1 + x·(1 − σ(x))).
    ///
    /// All are finite for every finite x: the exponentials saturate to 0 or 1 rather
    /// than overflow into NaN.
    #[inline(always)]
    pub fn derivative(self, x: f32) -> f32 {
        match self {
            Activation::Relu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Activation::Gelu => {
                // 1/√(2π)
                const INV_SQRT_2PI: f32 = 0.398_942_3;
                let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
                let pdf = INV_SQRT_2PI * fastmath::exp(-0.5 * x * x);
                cdf + x * pdf
            }
            Activation::GeluTanh => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                const KAPPA: f32 = 0.044_715;
                let x2 = x * x;
                let t = fastmath::tanh(SQRT_2_OVER_PI * (x + KAPPA * x2 * x));
                0.5 * (1.0 + t)
                    + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * KAPPA * x2)
            }
            Activation::Silu => {
                // For x ≪ 0, exp(−x) overflows to +∞ and σ to 0: the result is ±0, not NaN.
                let s = 1.0 / (1.0 + fastmath::exp(-x));
                s * (1.0 + x * (1.0 - s))
            }
        }
    }

    /// Backward of `y = f(x)` elementwise: **accumulates** `dx += dy ∘ f′(x)`.
    /// `x` holds the pre-activation values the forward was given; all three slices
    /// have the same length.
    pub fn backward_slice(self, x: &[f32], dy: &[f32], dx: &mut [f32]) -> Result<()> {
        if x.len() != dy.len() || x.len() != dx.len() {
            return Err(Error::shape(
                "activation backward dy, dx",
                format!("{} elements each, as x", x.len()),
                &[dy.len(), dx.len()],
            ));
        }
        // a long slice is split over the threads, as in `apply_slice`
        if x.len() >= 4 * CHUNK && rayon::current_num_threads() > 1 {
            dx.par_chunks_mut(CHUNK)
                .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
                .for_each(|(dx, (x, dy))| self.backward_chunk(x, dy, dx));
        } else {
            self.backward_chunk(x, dy, dx);
        }
        Ok(())
    }

    /// [`Activation::backward_slice`] on one thread.
    fn backward_chunk(self, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if matches!(self, Activation::GeluTanh | Activation::Silu) && super::simd::avx2_fma() {
            x86::backward(super::isa::Isa::detect(), self, x, dy, dx);
            return;
        }
        // One loop per variant, as in `apply_chunk`.
        fn each(x: &[f32], dy: &[f32], dx: &mut [f32], f: impl Fn(f32) -> f32) {
            for ((d, &xi), &g) in dx.iter_mut().zip(x).zip(dy) {
                *d += g * f(xi);
            }
        }
        match self {
            Activation::Relu => each(x, dy, dx, |v| Activation::Relu.derivative(v)),
            Activation::Gelu => each(x, dy, dx, |v| Activation::Gelu.derivative(v)),
            Activation::GeluTanh => each(x, dy, dx, |v| Activation::GeluTanh.derivative(v)),
            Activation::Silu => each(x, dy, dx, |v| Activation::Silu.derivative(v)),
        }
    }
}

/// The label model summaries use (`ModelInfo.ffn`, `qkv inspect`): "ReLU", "GELU (erf)",
/// "GELU (tanh approximation)", "SiLU".
impl std::fmt::Display for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Activation::Relu => "ReLU",
            Activation::Gelu => "GELU (erf)",
            Activation::GeluTanh => "GELU (tanh approximation)",
            Activation::Silu => "SiLU",
        })
    }
}

/// Exact GELU, GELU-tanh and SiLU a vector at a time, 8 lanes on AVX2 + FMA and 16 on
/// AVX-512, one generic body with the vector `erf`, `tanh` and σ of `ops::vmath` (both
/// widths give the same bits); [`Activation::apply`] and [`Activation::derivative`] are
/// their readable twins, and the tests hold them together. Without these, the
/// compiler's baseline (SSE2, no FMA) left the scalar loops at about 3.6 ns a value: 5%
/// of a GPT-2 training step went to GELU-tanh; at 8 lanes exact GELU was still an
/// eighth of a MiniLM batch in int8.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Activation;
    use crate::ops::isa::Isa;
    use crate::ops::vector::Vector;
    use crate::ops::vmath::{erf, sigmoid, tanh};
    use std::arch::x86_64::*;

    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const KAPPA: f32 = 0.044_715;

    /// f(x) in place for every activation, on `isa`'s vectors (not `Portable`).
    pub(super) fn apply(isa: Isa, act: Activation, xs: &mut [f32]) {
        match isa {
            // SAFETY: `isa` is this CPU's (Isa::detect) or one of Isa::available.
            Isa::Avx512 => unsafe { apply_avx512(act, xs) },
            // SAFETY: as above.
            Isa::Avx2 => unsafe { apply_avx2(act, xs) },
            Isa::Portable => unreachable!("the portable form is the scalar loop"),
        }
    }

    /// dx += dy ∘ f′(x) for GELU-tanh and SiLU (the formulas of
    /// [`Activation::derivative`]), on `isa`'s vectors (not `Portable`); the three
    /// slices have one length.
    pub(super) fn backward(isa: Isa, act: Activation, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        assert!(x.len() == dy.len() && x.len() == dx.len());
        match isa {
            // SAFETY: as in `apply`; the lengths were checked above.
            Isa::Avx512 => unsafe { backward_avx512(act, x, dy, dx) },
            // SAFETY: as above.
            Isa::Avx2 => unsafe { backward_avx2(act, x, dy, dx) },
            Isa::Portable => unreachable!("the portable form is the scalar loop"),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn apply_avx2(act: Activation, xs: &mut [f32]) {
        apply_body::<__m256>(act, xs)
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn apply_avx512(act: Activation, xs: &mut [f32]) {
        apply_body::<__m512>(act, xs)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn backward_avx2(act: Activation, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        backward_body::<__m256>(act, x, dy, dx)
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn backward_avx512(act: Activation, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        backward_body::<__m512>(act, x, dy, dx)
    }

    /// (t, u′) for GELU-tanh: t = tanh(u) with u = √(2/π)·(x + κx³), and
    /// u′ = √(2/π)·(1 + 3κx²).
    #[inline(always)]
    unsafe fn gelu_tanh_parts<V: Vector>(x: V) -> (V, V) {
        let c = V::splat(SQRT_2_OVER_PI);
        let x2 = x.times(x);
        let inner = V::splat(KAPPA).times(x2).mul_add(x, x);
        let t = tanh(c.times(inner));
        let du = c.times(V::splat(3.0 * KAPPA).mul_add(x2, V::splat(1.0)));
        (t, du)
    }

    #[inline(always)]
    unsafe fn apply_body<V: Vector>(act: Activation, xs: &mut [f32]) {
        let half = V::splat(0.5);
        let mut lanes = xs.chunks_exact_mut(V::LANES);
        for v in &mut lanes {
            let x = V::load(v.as_ptr());
            let y = match act {
                Activation::Gelu => {
                    // 0.5·x·(1 + erf(x/√2))
                    let e = erf(x.times(V::splat(std::f32::consts::FRAC_1_SQRT_2)));
                    let half_x = x.times(half);
                    half_x.mul_add(e, half_x)
                }
                Activation::GeluTanh => {
                    // 0.5·x·(1 + tanh(u))
                    let (t, _) = gelu_tanh_parts(x);
                    let half_x = x.times(half);
                    half_x.mul_add(t, half_x)
                }
                Activation::Silu => x.times(sigmoid(x)),
                Activation::Relu => x.max(V::zero()),
            };
            y.store(v.as_mut_ptr());
        }
        for x in lanes.into_remainder() {
            *x = act.apply(*x);
        }
    }

    #[inline(always)]
    unsafe fn backward_body<V: Vector>(act: Activation, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (one, half) = (V::splat(1.0), V::splat(0.5));
        let whole = x.len() / V::LANES * V::LANES;
        for i in (0..whole).step_by(V::LANES) {
            let xv = V::load(x.as_ptr().add(i));
            let d = match act {
                Activation::GeluTanh => {
                    // ½(1 + t) + ½x·(1 − t²)·u′
                    let (t, du) = gelu_tanh_parts(xv);
                    let sech2 = V::zero().minus(t).mul_add(t, one);
                    let left = half.times(one.plus(t));
                    let right = half.times(xv).times(sech2.times(du));
                    left.plus(right)
                }
                Activation::Silu => {
                    // σ(x)·(1 + x·(1 − σ(x)))
                    let s = sigmoid(xv);
                    s.times(xv.mul_add(one.minus(s), one))
                }
                Activation::Relu | Activation::Gelu => {
                    unreachable!("only GELU-tanh and SiLU take the vector backward")
                }
            };
            let out = dx.as_mut_ptr().add(i);
            let g = V::load(dy.as_ptr().add(i));
            g.mul_add(d, V::load(out)).store(out);
        }
        for i in whole..x.len() {
            dx[i] += dy[i] * act.derivative(x[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast slice path (vector erf, threads) against `apply` with libm's erff, on
    /// a slice long enough to be split, with values across GELU's whole shape.
    #[test]
    fn gelu_slice_equals_the_libm_formula() {
        let xs: Vec<f32> = (0..100_003)
            .map(|i| (i as f32 - 50_000.0) * 2.5e-4 * (1.0 + (i % 7) as f32))
            .collect();
        let mut fast = xs.clone();
        Activation::Gelu.apply_slice(&mut fast);
        for (&x, &got) in xs.iter().zip(&fast) {
            let want = Activation::Gelu.apply(x);
            assert!(
                (got - want).abs() <= 3e-7 * x.abs().max(1e-30),
                "gelu({x}): {got} vs {want}"
            );
        }
    }

    /// The vector forms of GELU-tanh and SiLU, forward and backward, against `apply`
    /// and `derivative` (the scalar `exp` and `tanh` of `fastmath`), on slices long
    /// enough to be split, with a tail shorter than a vector, and values from deep in
    /// each saturated side to the middle.
    #[test]
    fn vector_gelu_tanh_and_silu_equal_the_scalar_formulas() {
        let xs: Vec<f32> = (0..50_005)
            .map(|i| (i as f32 - 25_000.0) * 4e-4 * (1.0 + (i % 5) as f32 * 10.0))
            .collect();
        let dy: Vec<f32> = (0..xs.len())
            .map(|i| 1.0 - (i % 13) as f32 * 0.15)
            .collect();
        let close = |got: f32, want: f32| (got - want).abs() <= 2e-6 * want.abs().max(1.0);
        for act in [Activation::GeluTanh, Activation::Silu] {
            let mut fast = xs.clone();
            act.apply_slice(&mut fast);
            for (&x, &got) in xs.iter().zip(&fast) {
                let want = act.apply(x);
                assert!(close(got, want), "{act:?}({x}): {got} vs {want}");
            }
            let mut dx = vec![0.25f32; xs.len()];
            act.backward_slice(&xs, &dy, &mut dx).unwrap();
            for ((&x, &g), &got) in xs.iter().zip(&dy).zip(&dx) {
                let want = 0.25 + g * act.derivative(x);
                assert!(close(got, want), "{act:?}′({x}): {got} vs {want}");
            }
        }
    }

    /// Every vector width this CPU runs gives the same bits, forward and backward, on a
    /// slice with a tail shorter than either vector.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_vector_width_gives_the_same_bits() {
        use super::super::isa::Isa;
        let xs: Vec<f32> = (0..4099)
            .map(|i| (i as f32 - 2049.0) * 7e-3 * (1.0 + (i % 3) as f32 * 3.0))
            .collect();
        let dy: Vec<f32> = (0..xs.len()).map(|i| 1.0 - (i % 11) as f32 * 0.2).collect();
        let widths: Vec<Isa> = Isa::available()
            .into_iter()
            .filter(|&isa| isa != Isa::Portable)
            .collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
            let mut runs = widths.iter().map(|&isa| {
                let mut y = xs.clone();
                x86::apply(isa, act, &mut y);
                let mut dx = vec![0.5f32; xs.len()];
                if act != Activation::Gelu {
                    x86::backward(isa, act, &xs, &dy, &mut dx);
                }
                (isa, bits(&y), bits(&dx))
            });
            if let Some(first) = runs.next() {
                for run in runs {
                    assert_eq!(
                        (&first.1, &first.2),
                        (&run.1, &run.2),
                        "{act:?}: {:?} against {:?}",
                        run.0,
                        first.0
                    );
                }
            }
        }
    }

    #[test]
    fn names_map_and_unknown_is_named() {
        assert_eq!(
            Activation::from_hf_name("gelu_new").unwrap(),
            Activation::GeluTanh
        );
        let err = Activation::from_hf_name("mish").unwrap_err().to_string();
        assert!(err.contains("mish"));
    }

    #[test]
    fn derivatives_at_known_points() {
        // ReLU′(0) = 0 as in PyTorch; GELU′(0) = ½; SiLU′(0) = ½.
        assert_eq!(Activation::Relu.derivative(0.0), 0.0);
        assert_eq!(Activation::Relu.derivative(0.5), 1.0);
        for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
            assert!((act.derivative(0.0) - 0.5).abs() < 1e-7, "{act:?}");
        }
        // GELU′(1) = Φ(1) + 1·φ(1) = 0.8413447 + 0.2419707
        assert!((Activation::Gelu.derivative(1.0) - 1.083_315_5).abs() < 1e-6);
        for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
            for x in [-1e4f32, -100.0, -30.0, 30.0, 100.0, 1e4] {
                let d = act.derivative(x);
                assert!(d.is_finite(), "{act:?}′({x}) = {d}");
                assert!(
                    (d - if x > 0.0 { 1.0 } else { 0.0 }).abs() < 1e-6,
                    "{act:?}′({x}) = {d}"
                );
            }
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(Activation::Relu.apply(-2.0), 0.0);
        assert!((Activation::Silu.apply(0.0)).abs() < 1e-7);
        // GELU(1) = Φ(1) = 0.8413447
        assert!((Activation::Gelu.apply(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((Activation::GeluTanh.apply(1.0) - 0.841_192).abs() < 1e-5);
    }
}
