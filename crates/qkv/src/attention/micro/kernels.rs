//! [`Kernels`]: the micro-kernels in the form this CPU runs, each checking the bounds
//! its unsafe vector body relies on before it runs.

use crate::ops::vector::Isa;

use super::operands::{Dots, MulAcc, Scores, SoftmaxRows, PANEL};
use super::portable;
#[cfg(target_arch = "x86_64")]
use super::x86;

/// Runs kernel `$name` in the form `$isa` names: its AVX-512 or AVX2 entry point in
/// `x86`, or its portable twin.
macro_rules! dispatch {
    ($isa:expr, $name:ident($($arg:expr),*)) => {
        match $isa {
            // SAFETY: the CPU has the form (`Kernels` holds one it runs); the caller
            // checked the bounds the kernel asks for.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { x86::avx512::$name($($arg),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::avx2::$name($($arg),*) },
            _ => portable::$name($($arg),*),
        }
    };
}

/// The kernels in one form: each task of an attention call detects it once (see
/// [`Isa::detect`]) and runs all its blocks in it; the tests build one per form.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernels {
    isa: Isa,
}

impl Kernels {
    /// The best form this CPU runs.
    pub(crate) fn detect() -> Self {
        Kernels { isa: Isa::detect() }
    }

    /// `out[r·out_stride + c] = scale · Σ_e q[r·q_stride + e] · key_c[e]` for r < rows and
    /// every key c of the `panels` packed panels.
    pub(crate) fn scores(&self, s: Scores) {
        assert!(s.rows == 0 || s.q.len() >= (s.rows - 1) * s.q_stride + s.d);
        assert!(s.kp.len() >= s.panels * PANEL * s.d);
        assert!(s.rows == 0 || s.out.len() >= (s.rows - 1) * s.out_stride + s.panels * PANEL);
        dispatch!(self.isa, scores(s))
    }

    /// `acc[x·acc_stride + e] = c_x·acc[x·acc_stride + e] + Σ_y a(x, y) · b[y·b_stride + e]`
    /// for x < m, y < k, e < n, with c_x = `corr[x]` (1 without `corr`): P·V in the
    /// forward, and Pᵀ·dO, dSᵀ·Q and dS·K in the backward.
    pub(crate) fn mul_acc(&self, t: MulAcc) {
        if t.adds_nothing() {
            // the rows still take their correction
            portable::mul_acc(MulAcc { k: 0, ..t });
            return;
        }
        t.check_lengths();
        dispatch!(self.isa, mul_acc(t))
    }

    /// [`Kernels::mul_acc`] with B in bf16 (a KV cache's values, read in place).
    pub(crate) fn mul_acc_bf16(&self, t: MulAcc<u16>) {
        if t.adds_nothing() {
            portable::mul_acc(MulAcc { k: 0, ..t });
            return;
        }
        t.check_lengths();
        dispatch!(self.isa, mul_acc_bf16(t))
    }

    /// `out[r·out_stride + j] = scale · Σ_e q[r·q_stride + e] · k[j·k_stride + e]` for
    /// r < rows, j < n, e < d: a decode step's scores against the cache's keys in place.
    pub(crate) fn dots(&self, t: Dots) {
        if !t.takes_nothing() {
            t.check_lengths();
            dispatch!(self.isa, dots(t))
        }
    }

    /// [`Kernels::dots`] against keys in bf16 (a bf16 cache's).
    pub(crate) fn dots_bf16(&self, t: Dots<u16>) {
        if !t.takes_nothing() {
            t.check_lengths();
            dispatch!(self.isa, dots_bf16(t))
        }
    }

    /// One online-softmax step for each of `rows` rows of scores (row r is
    /// `tile[r·stride..r·stride + cols]`, −∞ where masked), with running maxima `m` and sums
    /// `l`: m' = max(m, max row), row ← exp(row − m'), l ← l·exp(m − m') + Σ row, m ← m'.
    /// `corr[r]` gets the factor exp(m − m') that rescales row r's accumulated output (1
    /// when the max did not move). A row with nothing visible yet is left at zero weight
    /// and changes nothing.
    pub(crate) fn softmax_rows(&self, t: SoftmaxRows) {
        if t.rows == 0 {
            return;
        }
        assert!(t.tile.len() >= (t.rows - 1) * t.stride + t.cols);
        assert!(t.m.len() >= t.rows && t.l.len() >= t.rows && t.corr.len() >= t.rows);
        dispatch!(self.isa, softmax_rows(t))
    }

    /// `row[c] ← exp(row[c] − l)`: probabilities from scores and the row's saved
    /// log-sum-exp; a row whose `l` is −∞ (every key masked) becomes zeros.
    pub(crate) fn exp_shift(&self, row: &mut [f32], l: f32) {
        if l == f32::NEG_INFINITY {
            row.fill(0.0);
            return;
        }
        dispatch!(self.isa, exp_shift(row, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::micro::operands::Strided;
    use crate::ops::matmul::pack_panels;
    use crate::ops::MatRef;
    use crate::rng::Rng;
    use crate::weights::bf16::{bf16_to_f32, f32_to_bf16};

    /// Every form of each kernel against sums in f64, on shapes that leave partial
    /// register tiles, partial panels and partial vectors. Rows past the last whole
    /// group (of 6 on AVX2, 8 on AVX-512) take every count from 1 to 5 (7) here, and
    /// every key and column step of the narrow-row tiles.
    const SHAPES: [(usize, usize, usize); 12] = [
        (1, 1, 1),
        (5, 3, 7),
        (6, 16, 8),
        (7, 17, 64),
        (8, 40, 33),
        (9, 48, 16),
        (10, 20, 64),
        (11, 24, 32),
        (12, 40, 48),
        (13, 9, 23),
        (15, 33, 40),
        (64, 128, 80),
    ];

    fn close(got: &[f32], want: &[f64], what: &str) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol = 1e-5 * (1.0 + w.abs());
            assert!((g as f64 - w).abs() <= tol, "{what}[{i}]: {g} against {w}");
        }
    }

    /// Runs `f` with every form this CPU has: AVX-512, AVX2 and portable.
    fn every_form(mut f: impl FnMut(Kernels)) {
        for isa in Isa::available() {
            f(Kernels { isa });
        }
    }

    #[test]
    fn scores_equal_plain_dot_products() {
        let mut rng = Rng::new(1);
        for (rows, cols, d) in SHAPES {
            let q_stride = d + 3;
            let q = rng.normals(rows * q_stride, 1.0);
            let k = rng.normals(cols * d, 1.0);
            let panels = cols.div_ceil(PANEL);
            let mut kp = vec![f32::NAN; panels * PANEL * d];
            pack_panels(&MatRef::row_major(&k, cols, d).t(), &mut kp);
            let out_stride = panels * PANEL + 2;
            let scale = 0.3;
            let mut want = vec![0.0f64; rows * out_stride];
            for r in 0..rows {
                for c in 0..panels * PANEL {
                    want[r * out_stride + c] = if c < cols {
                        (0..d)
                            .map(|e| q[r * q_stride + e] as f64 * k[c * d + e] as f64)
                            .sum::<f64>()
                            * scale as f64
                    } else {
                        0.0
                    };
                }
            }
            every_form(|kernels| {
                let mut out = vec![0.0f32; rows * out_stride];
                let (q, k) = (&q[..], &kp[..]);
                kernels.scores(Scores {
                    q,
                    q_stride,
                    rows,
                    d,
                    kp: k,
                    panels,
                    scale,
                    out: &mut out,
                    out_stride,
                });
                for r in 0..rows {
                    let span = r * out_stride..r * out_stride + panels * PANEL;
                    close(
                        &out[span.clone()],
                        &want[span],
                        &format!("{:?} scores {rows}x{cols}x{d}", kernels.isa),
                    );
                }
            });
        }
    }

    /// Keys read in place, f32 and bf16: each form against dot products in f64 (of the
    /// widened values for bf16).
    #[test]
    fn dots_equal_plain_dot_products() {
        let mut rng = Rng::new(4);
        for (rows, n, d) in SHAPES {
            let (q_stride, k_stride, out_stride) = (d + 3, d + 5, n + 2);
            let q = rng.normals(rows * q_stride, 1.0);
            let k32 = rng.normals(n * k_stride, 1.0);
            let k16: Vec<u16> = k32.iter().map(|&x| f32_to_bf16(x)).collect();
            let scale = 0.3;
            for bf16 in [false, true] {
                let key = |i: usize| match bf16 {
                    false => k32[i] as f64,
                    true => bf16_to_f32(k16[i]) as f64,
                };
                let mut want = vec![0.0f64; rows * out_stride];
                for r in 0..rows {
                    for j in 0..n {
                        let dot: f64 = (0..d)
                            .map(|e| q[r * q_stride + e] as f64 * key(j * k_stride + e))
                            .sum();
                        want[r * out_stride + j] = scale as f64 * dot;
                    }
                }
                every_form(|kernels| {
                    let mut out = vec![0.0f32; rows * out_stride];
                    // one set of operands, keys of either type
                    macro_rules! dots_of {
                        ($k:expr) => {
                            Dots {
                                q: &q,
                                q_stride,
                                rows,
                                d,
                                k: $k,
                                k_stride,
                                n,
                                scale,
                                out: &mut out,
                                out_stride,
                            }
                        };
                    }
                    match bf16 {
                        false => kernels.dots(dots_of!(&k32)),
                        true => kernels.dots_bf16(dots_of!(&k16)),
                    }
                    for r in 0..rows {
                        let span = r * out_stride..r * out_stride + n;
                        close(
                            &out[span.clone()],
                            &want[span],
                            &format!("{:?} dots (bf16 {bf16}) {rows}x{n}x{d}", kernels.isa),
                        );
                    }
                });
            }
        }
    }

    /// B in bf16, widened in registers, gives the f32 product of the widened values bit
    /// for bit (the widening is exact and the arithmetic the same), in each form.
    #[test]
    fn bf16_mul_acc_equals_the_f32_product_of_the_widened_values() {
        let mut rng = Rng::new(5);
        for (m, k, n) in SHAPES {
            let a = rng.normals(m * k, 1.0);
            let b_stride = n + 5;
            let b16: Vec<u16> = rng
                .normals(k * b_stride, 1.0)
                .into_iter()
                .map(f32_to_bf16)
                .collect();
            let wide: Vec<f32> = b16.iter().map(|&x| bf16_to_f32(x)).collect();
            let acc0 = rng.normals(m * n, 1.0);
            let corr: Vec<f32> = (0..m).map(|x| 0.5 + x as f32 * 0.1).collect();
            let a = Strided {
                data: &a,
                row: k,
                col: 1,
            };
            every_form(|kernels| {
                let (mut got, mut want) = (acc0.clone(), acc0.clone());
                kernels.mul_acc_bf16(MulAcc {
                    a,
                    m,
                    k,
                    b: &b16,
                    b_stride,
                    n,
                    corr: Some(&corr),
                    acc: &mut got,
                    acc_stride: n,
                });
                kernels.mul_acc(MulAcc {
                    a,
                    m,
                    k,
                    b: &wide,
                    b_stride,
                    n,
                    corr: Some(&corr),
                    acc: &mut want,
                    acc_stride: n,
                });
                assert_eq!(got, want, "{:?} mul_acc_bf16 {m}x{k}x{n}", kernels.isa);
            });
        }
    }

    #[test]
    fn mul_acc_equals_a_plain_product_with_strided_a_and_correction() {
        let mut rng = Rng::new(2);
        for (m, k, n) in SHAPES {
            // A read transposed: element (x, y) at y·(m + 1) + x
            let (a_row, a_col) = (1, m + 1);
            let a = rng.normals(k * (m + 1), 1.0);
            let b_stride = n + 5;
            let b = rng.normals(k * b_stride, 1.0);
            let acc_stride = n + 1;
            let acc0 = rng.normals(m * acc_stride, 1.0);
            let corr: Vec<f32> = (0..m).map(|x| 0.5 + x as f32 * 0.1).collect();
            for use_corr in [false, true] {
                let mut want: Vec<f64> = acc0.iter().map(|&v| v as f64).collect();
                for x in 0..m {
                    let c = if use_corr { corr[x] as f64 } else { 1.0 };
                    for e in 0..n {
                        let dot: f64 = (0..k)
                            .map(|y| a[x * a_row + y * a_col] as f64 * b[y * b_stride + e] as f64)
                            .sum();
                        want[x * acc_stride + e] = c * want[x * acc_stride + e] + dot;
                    }
                }
                let strided = Strided {
                    data: &a,
                    row: a_row,
                    col: a_col,
                };
                let c = use_corr.then_some(&corr[..]);
                every_form(|kernels| {
                    let mut acc = acc0.clone();
                    kernels.mul_acc(MulAcc {
                        a: strided,
                        m,
                        k,
                        b: &b,
                        b_stride,
                        n,
                        corr: c,
                        acc: &mut acc,
                        acc_stride,
                    });
                    for x in 0..m {
                        let span = x * acc_stride..x * acc_stride + n;
                        close(
                            &acc[span.clone()],
                            &want[span],
                            &format!("{:?} mul_acc {m}x{k}x{n}", kernels.isa),
                        );
                    }
                    // the column past n in each row is not written
                    for x in 0..m {
                        assert_eq!(acc[x * acc_stride + n], acc0[x * acc_stride + n]);
                    }
                });
            }
        }
    }

    /// Rows of scores fed to `softmax_rows` a block of columns at a time (as the tiled
    /// kernel does) give each row's softmax, for row counts on both sides of a group of
    /// 16, with masked keys, a row masked in its whole first block and a row masked
    /// throughout.
    #[test]
    fn softmax_rows_over_blocks_equal_one_softmax_per_row() {
        let mut rng = Rng::new(3);
        for n in [1, 7, 8, 9, 31, 130] {
            for rows in [1, 5, 17, 33] {
                let mut scores = rng.normals(rows * n, 3.0);
                for (i, s) in scores.iter_mut().enumerate() {
                    let (r, c) = (i / n, i % n);
                    let masked = match r % 3 {
                        0 => c % 5 == 3 || c < n / 3,
                        1 => c % 4 == 1,
                        _ => r == rows - 1 && rows > 1,
                    };
                    if masked {
                        *s = f32::NEG_INFINITY;
                    }
                }
                every_form(|kernels| {
                    let mut m = vec![f32::NEG_INFINITY; rows];
                    let mut l = vec![0.0f32; rows];
                    let mut corr = vec![0.0f32; rows];
                    let mut weights = vec![Vec::new(); rows];
                    let width = n.div_ceil(3).max(1);
                    for c0 in (0..n).step_by(width) {
                        let cols = width.min(n - c0);
                        let mut tile: Vec<f32> = (0..rows)
                            .flat_map(|r| scores[r * n + c0..r * n + c0 + cols].to_vec())
                            .collect();
                        let (m, l, corr) = (&mut m, &mut l, &mut corr);
                        kernels.softmax_rows(SoftmaxRows {
                            tile: &mut tile,
                            stride: cols,
                            rows,
                            cols,
                            m,
                            l,
                            corr,
                        });
                        for (r, w) in weights.iter_mut().enumerate() {
                            w.iter_mut().for_each(|x| *x *= corr[r]);
                            w.extend(&tile[r * cols..(r + 1) * cols]);
                        }
                    }
                    for r in 0..rows {
                        let row = &scores[r * n..(r + 1) * n];
                        let max = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
                        let what = format!("{:?} softmax of row {r} of {rows}x{n}", kernels.isa);
                        if max == f64::NEG_INFINITY {
                            assert!(weights[r].iter().all(|&w| w == 0.0), "{what}");
                            assert!(l[r] == 0.0 && m[r] == f32::NEG_INFINITY, "{what}");
                            continue;
                        }
                        let total: f64 = row.iter().map(|&s| (s as f64 - max).exp()).sum();
                        let want: Vec<f64> = row
                            .iter()
                            .map(|&s| (s as f64 - max).exp() / total)
                            .collect();
                        let got: Vec<f32> = weights[r].iter().map(|w| w / l[r]).collect();
                        close(&got, &want, &what);
                        // the saved log-sum-exp turns scores back into the same weights
                        let mut again = row.to_vec();
                        kernels.exp_shift(&mut again, m[r] + l[r].ln());
                        close(
                            &again,
                            &want,
                            &format!("{:?} exp_shift of {n}", kernels.isa),
                        );
                    }
                });
            }
        }
    }

    #[test]
    fn fully_masked_rows_give_zero_weight() {
        every_form(|kernels| {
            let mut row = vec![f32::NEG_INFINITY; 11];
            let (mut m, mut l, mut corr) = ([f32::NEG_INFINITY], [0.0], [0.0]);
            kernels.softmax_rows(SoftmaxRows {
                tile: &mut row,
                stride: 11,
                rows: 1,
                cols: 11,
                m: &mut m,
                l: &mut l,
                corr: &mut corr,
            });
            assert_eq!(corr[0], 1.0);
            assert!(row.iter().all(|&w| w == 0.0) && l[0] == 0.0 && m[0] == f32::NEG_INFINITY);
            let mut row = vec![1.0f32; 11];
            kernels.exp_shift(&mut row, f32::NEG_INFINITY);
            assert!(row.iter().all(|&w| w == 0.0));
        });
    }
}
