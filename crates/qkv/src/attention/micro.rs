//! The tiled kernels' inner loops on register tiles: scores S = scale·Q·Kᵀ (and
//! dP = dO·Vᵀ), the online softmax of a row of scores, and acc = corr·acc + A·B (P·V,
//! and the backward's Pᵀ·dO, dSᵀ·Q, dS·K). Each has one vector body, generic over
//! [`Vector`](crate::ops::vector::Vector) and compiled for AVX-512 and for AVX2 + FMA
//! (chosen at run time), and a portable form that says what it computes in plain
//! loops; the reference kernel (`reference.rs`) is the readable twin the tests hold
//! them to.
//!
//! Keys are packed once per key block into panels of 16 keys, `[D][16]` each (zero
//! padded to a whole panel), so the scores product reads one AVX-512 vector (or two
//! AVX2 ones) per (d, panel) and broadcasts one query element per (row, d): 6 rows × 2
//! vectors of accumulators, two loads and one broadcast fit either register file. A·B
//! reads B in place (its rows are contiguous), A through strides (so Pᵀ needs no
//! copy), and keeps 6 rows × 2 vectors of output columns in registers.

use crate::ops::vector::Isa;

/// Keys per panel (one AVX-512 vector, two AVX2 ones), packed by
/// [`pack_panels`](crate::ops::matmul::pack_panels).
pub(crate) const PANEL: usize = crate::ops::matmul::PANEL;

/// A strided matrix operand: element (x, y) at `data[x·row + y·col]`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub row: usize,
    pub col: usize,
}

/// The operands of [`Kernels::scores`].
pub(crate) struct Scores<'a> {
    /// `rows` query rows, `q_stride` apart, `d` wide
    pub q: &'a [f32],
    pub q_stride: usize,
    pub rows: usize,
    pub d: usize,
    /// `panels` packed key panels, `[D][PANEL]` each
    pub kp: &'a [f32],
    pub panels: usize,
    pub scale: f32,
    /// `rows` rows of `panels·PANEL` scores, `out_stride` apart
    pub out: &'a mut [f32],
    pub out_stride: usize,
}

/// The operands of [`Kernels::mul_acc`]: A `[m, k]` (strided), B `[k, n]` (rows
/// `b_stride` apart), acc `[m, n]` (rows `acc_stride` apart) and the rows' factors.
pub(crate) struct MulAcc<'a> {
    pub a: Strided<'a>,
    pub m: usize,
    pub k: usize,
    pub b: &'a [f32],
    pub b_stride: usize,
    pub n: usize,
    pub corr: Option<&'a [f32]>,
    pub acc: &'a mut [f32],
    pub acc_stride: usize,
}

/// The operands of [`Kernels::softmax_rows`]: `rows` rows of `cols` scores, `stride`
/// apart, and each row's running max `m`, sum `l` and new factor `corr`.
pub(crate) struct SoftmaxRows<'a> {
    pub tile: &'a mut [f32],
    pub stride: usize,
    pub rows: usize,
    pub cols: usize,
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub corr: &'a mut [f32],
}

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
        if t.m == 0 || t.k == 0 || t.n == 0 {
            // nothing to add; the rows still take their correction
            portable::mul_acc(MulAcc { k: 0, ..t });
            return;
        }
        assert!(t.a.data.len() > (t.m - 1) * t.a.row + (t.k - 1) * t.a.col);
        assert!(t.b.len() >= (t.k - 1) * t.b_stride + t.n);
        assert!(t.acc.len() >= (t.m - 1) * t.acc_stride + t.n);
        assert!(t.corr.is_none_or(|c| c.len() >= t.m));
        dispatch!(self.isa, mul_acc(t))
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

/// The factor exp(m − m') that moves a row's sums from running max m to m'; 1 for a
/// row with nothing visible yet (both −∞).
fn correction(m: f32, m_new: f32) -> f32 {
    if m_new == f32::NEG_INFINITY {
        1.0
    } else {
        (m - m_new).exp()
    }
}

/// The kernels in plain loops: what runs without AVX2, and what the tests hold the
/// vector forms to on any machine. Same contracts as the public functions above.
mod portable {
    use super::{correction, MulAcc, Scores, SoftmaxRows, PANEL};
    use crate::ops::softmax::exp_shifted_sum;

    pub(super) fn scores(s: Scores) {
        let d = s.d;
        for r in 0..s.rows {
            let qr = &s.q[r * s.q_stride..r * s.q_stride + d];
            for p in 0..s.panels {
                let panel = &s.kp[p * PANEL * d..(p + 1) * PANEL * d];
                for lane in 0..PANEL {
                    let dot: f32 = qr
                        .iter()
                        .enumerate()
                        .map(|(e, &x)| x * panel[e * PANEL + lane])
                        .sum();
                    s.out[r * s.out_stride + p * PANEL + lane] = s.scale * dot;
                }
            }
        }
    }

    pub(super) fn mul_acc(t: MulAcc) {
        let (n, a) = (t.n, t.a);
        for x in 0..t.m {
            let row = &mut t.acc[x * t.acc_stride..x * t.acc_stride + n];
            let c = t.corr.map_or(1.0, |c| c[x]);
            row.iter_mut().for_each(|v| *v *= c);
            for y in 0..t.k {
                let w = a.data[x * a.row + y * a.col];
                let b = &t.b[y * t.b_stride..y * t.b_stride + n];
                for (v, &bv) in row.iter_mut().zip(b) {
                    *v += w * bv;
                }
            }
        }
    }

    pub(super) fn softmax_rows(t: SoftmaxRows) {
        let (m, l, corr) = (t.m, t.l, t.corr);
        for r in 0..t.rows {
            let row = &mut t.tile[r * t.stride..r * t.stride + t.cols];
            let m_new = row.iter().copied().fold(m[r], f32::max);
            corr[r] = correction(m[r], m_new);
            // nothing visible yet in this row: zeros, and l and m stay as they are
            let sum = exp_shifted_sum(row, m_new);
            l[r] = l[r] * corr[r] + sum;
            m[r] = m_new;
        }
    }

    pub(super) fn exp_shift(row: &mut [f32], l: f32) {
        for x in row.iter_mut() {
            *x = (*x - l).exp();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MulAcc, Scores, SoftmaxRows, PANEL};
    use crate::ops::vector::Vector;
    use std::arch::x86_64::{__m256, __m512};

    /// Defines the kernels' entry points, one module per instruction set (`avx2` and
    /// `avx512`) with one function per kernel: compiled with that set's target
    /// features, it instantiates the generic body for the set's vector type (the body
    /// is `#[inline(always)]`, so it is compiled in there) and, where the kernel takes
    /// them, for the rows of its register tiles: 6 with AVX2's 16 registers (6 × 2
    /// sums, two loads, a broadcast), 8 with AVX-512's 32.
    macro_rules! entry_points {
        ($($generic:ident $(<$r2:literal, $r512:literal>)? ($($arg:ident: $ty:ty),*);)*) => {
            pub(super) mod avx2 {
                use super::*;
                $(
                    /// # Safety
                    /// AVX2 and FMA; the bounds asserted by the `Kernels` method of
                    /// this name.
                    #[target_feature(enable = "avx2,fma")]
                    pub(crate) unsafe fn $generic($($arg: $ty),*) {
                        super::$generic::<__m256 $(, $r2)?>($($arg),*)
                    }
                )*
            }

            pub(super) mod avx512 {
                use super::*;
                $(
                    /// # Safety
                    /// AVX-512 F, AVX2 and FMA; as the AVX2 entry point.
                    #[target_feature(enable = "avx512f,avx2,fma")]
                    pub(crate) unsafe fn $generic($($arg: $ty),*) {
                        super::$generic::<__m512 $(, $r512)?>($($arg),*)
                    }
                )*
            }
        };
    }

    entry_points! {
        scores<6, 8>(s: Scores);
        mul_acc<6, 8>(t: MulAcc);
        softmax_rows(t: SoftmaxRows);
        exp_shift(row: &mut [f32], l: f32);
    }

    /// Where the vector of keys u·L..(u+1)·L starts in the packed panels (L lanes; a
    /// panel of 16 keys is one AVX-512 vector or two AVX2 ones): step e of it is `e·PANEL`
    /// further on.
    #[inline(always)]
    fn key_vector<V: Vector>(u: usize, d: usize) -> usize {
        let first = u * V::LANES;
        (first / PANEL) * PANEL * d + first % PANEL
    }

    #[inline(always)]
    unsafe fn scores<V: Vector, const R: usize>(s: Scores) {
        let (rows, d, panels, scale) = (s.rows, s.d, s.panels, s.scale);
        let (q_stride, out_stride) = (s.q_stride, s.out_stride);
        let (q, kp, out) = (s.q.as_ptr(), s.kp.as_ptr(), s.out.as_mut_ptr());
        let vectors = panels * PANEL / V::LANES;
        let full = rows / R * R;
        // key vectors outside, whole row groups inside: two vectors of keys × D stay in
        // L1 while every row group of the block reads them
        let mut u = 0;
        while u < vectors {
            let two = vectors - u >= 2;
            for r0 in (0..full).step_by(R) {
                let at = Qk {
                    q: q.add(r0 * q_stride),
                    q_stride,
                    d,
                    kp,
                    u,
                    scale,
                    out: out.add(r0 * out_stride),
                    out_stride,
                };
                if two {
                    qk::<V, R, 2>(&at);
                } else {
                    qk::<V, R, 1>(&at);
                }
            }
            u += if two { 2 } else { 1 };
        }
        let tail = Qk {
            q: q.add(full * q_stride),
            q_stride,
            d,
            kp,
            u: 0,
            scale,
            out: out.add(full * out_stride),
            out_stride,
        };
        match rows - full {
            0 => {}
            1 => qk_rows::<V, 1>(&tail, vectors),
            2 => qk_rows::<V, 2>(&tail, vectors),
            3 => qk_rows::<V, 3>(&tail, vectors),
            4 => qk_rows::<V, 4>(&tail, vectors),
            5 => qk_rows::<V, 5>(&tail, vectors),
            6 => qk_rows::<V, 6>(&tail, vectors),
            _ => qk_rows::<V, 7>(&tail, vectors),
        }
    }

    /// The operands of one scores tile: rows from `q` (each `q_stride` apart, `d` wide)
    /// against the key vectors from `u` on; out = scale·Q·Kᵀ from column u·L of `out`.
    #[derive(Clone, Copy)]
    struct Qk {
        q: *const f32,
        q_stride: usize,
        d: usize,
        kp: *const f32,
        u: usize,
        scale: f32,
        out: *mut f32,
        out_stride: usize,
    }

    /// NR < R rows (the block's last) against every key vector. Under 4 rows, four vectors a step, so that
    /// at least 8 sums are in flight: an FMA's latency (4 cycles) times the two it starts
    /// a cycle. With two, 2 rows ran at half the rate of a whole row group.
    #[inline(always)]
    unsafe fn qk_rows<V: Vector, const NR: usize>(t: &Qk, vectors: usize) {
        let wide = NR <= 3;
        let mut u = 0;
        while u < vectors {
            let step = match vectors - u {
                n if wide && n >= 4 => 4,
                n if n >= 2 => 2,
                _ => 1,
            };
            let at = Qk { u, ..*t };
            match step {
                4 => qk::<V, NR, 4>(&at),
                2 => qk::<V, NR, 2>(&at),
                _ => qk::<V, NR, 1>(&at),
            }
            u += step;
        }
    }

    /// NR query rows × NV key vectors: out = scale·Q·Kᵀ.
    #[inline(always)]
    unsafe fn qk<V: Vector, const NR: usize, const NV: usize>(t: &Qk) {
        let mut acc = [[V::zero(); NV]; NR];
        let mut keys = [t.kp; NV];
        for (v, k) in keys.iter_mut().enumerate() {
            *k = t.kp.add(key_vector::<V>(t.u + v, t.d));
        }
        // one pointer per row, so a step's broadcasts are (row pointer + e) with no
        // address arithmetic in the loop
        let mut q_rows = [t.q; NR];
        for (r, q) in q_rows.iter_mut().enumerate() {
            *q = t.q.add(r * t.q_stride);
        }
        for e in 0..t.d {
            let mut kv = [V::zero(); NV];
            for (k, at) in kv.iter_mut().zip(&keys) {
                *k = V::load(at.add(e * PANEL));
            }
            for (row, q) in acc.iter_mut().zip(&q_rows) {
                let qb = V::splat_from(q.add(e));
                for (a, k) in row.iter_mut().zip(&kv) {
                    *a = qb.mul_add(*k, *a);
                }
            }
        }
        let s = V::splat(t.scale);
        for (r, row) in acc.iter().enumerate() {
            for (v, a) in row.iter().enumerate() {
                a.times(s)
                    .store(t.out.add(r * t.out_stride + (t.u + v) * V::LANES));
            }
        }
    }

    #[inline(always)]
    unsafe fn mul_acc<V: Vector, const R: usize>(t: MulAcc) {
        let (m, k, n) = (t.m, t.k, t.n);
        let (b_stride, acc_stride) = (t.b_stride, t.acc_stride);
        let MulAcc {
            a, b, corr, acc, ..
        } = t;
        let lanes = V::LANES;
        let (ap, bp, cp) = (a.data.as_ptr(), b.as_ptr(), acc.as_mut_ptr());
        let ones = [1.0f32; R];
        let c_of = |x0: usize| -> &[f32] {
            match corr {
                Some(c) => &c[x0..],
                None => &ones,
            }
        };
        let full = m / R * R;
        // column chunks outside, whole row groups inside: a chunk of B (k rows × two
        // vectors) stays in L1 while every row group reads it
        let mut e0 = 0;
        while e0 + lanes <= n {
            let two = n - e0 >= 2 * lanes;
            for x0 in (0..full).step_by(R) {
                let args = Tile {
                    a: ap.add(x0 * a.row),
                    a_row: a.row,
                    a_col: a.col,
                    k,
                    b: bp.add(e0),
                    b_stride,
                };
                let (c, out) = (c_of(x0), cp.add(x0 * acc_stride + e0));
                if two {
                    tile::<V, R, 2>(&args, c, out, acc_stride);
                } else {
                    tile::<V, R, 1>(&args, c, out, acc_stride);
                }
            }
            e0 += if two { 2 * lanes } else { lanes };
        }
        let args = Tile {
            a: ap.add(full * a.row),
            a_row: a.row,
            a_col: a.col,
            k,
            b: bp,
            b_stride,
        };
        let (c, out) = (c_of(full), cp.add(full * acc_stride));
        match m - full {
            0 => {}
            1 => tile_rows::<V, 1>(&args, n, c, out, acc_stride),
            2 => tile_rows::<V, 2>(&args, n, c, out, acc_stride),
            3 => tile_rows::<V, 3>(&args, n, c, out, acc_stride),
            4 => tile_rows::<V, 4>(&args, n, c, out, acc_stride),
            5 => tile_rows::<V, 5>(&args, n, c, out, acc_stride),
            6 => tile_rows::<V, 6>(&args, n, c, out, acc_stride),
            _ => tile_rows::<V, 7>(&args, n, c, out, acc_stride),
        }
        // columns past the last whole vector, one at a time
        for x in 0..m {
            let c = corr.map_or(1.0, |c| c[x]);
            for e in e0..n {
                let mut v = acc[x * acc_stride + e] * c;
                for y in 0..k {
                    v += a.data[x * a.row + y * a.col] * b[y * b_stride + e];
                }
                acc[x * acc_stride + e] = v;
            }
        }
    }

    /// NR < R rows (the block's last) over the whole vectors of n columns (`t.b` at column 0), four
    /// vectors a step under 4 rows for the same reason as [`qk_rows`].
    #[inline(always)]
    unsafe fn tile_rows<V: Vector, const NR: usize>(
        t: &Tile,
        n: usize,
        corr: &[f32],
        acc: *mut f32,
        acc_stride: usize,
    ) {
        let lanes = V::LANES;
        let wide = NR <= 3;
        let mut e0 = 0;
        while e0 + lanes <= n {
            let vectors = match (n - e0) / lanes {
                left if wide && left >= 4 => 4,
                left if left >= 2 => 2,
                _ => 1,
            };
            let at = Tile {
                b: t.b.add(e0),
                ..*t
            };
            match vectors {
                4 => tile::<V, NR, 4>(&at, corr, acc.add(e0), acc_stride),
                2 => tile::<V, NR, 2>(&at, corr, acc.add(e0), acc_stride),
                _ => tile::<V, NR, 1>(&at, corr, acc.add(e0), acc_stride),
            }
            e0 += vectors * lanes;
        }
    }

    /// The operands of one register tile (see [`tile`]).
    #[derive(Clone, Copy)]
    struct Tile {
        a: *const f32,
        a_row: usize,
        a_col: usize,
        k: usize,
        b: *const f32,
        b_stride: usize,
    }

    /// NR rows × NV vectors of columns of acc = c·acc + A·B.
    #[inline(always)]
    unsafe fn tile<V: Vector, const NR: usize, const NV: usize>(
        t: &Tile,
        corr: &[f32],
        acc: *mut f32,
        acc_stride: usize,
    ) {
        let lanes = V::LANES;
        let mut regs = [[V::zero(); NV]; NR];
        for (x, row) in regs.iter_mut().enumerate() {
            let c = V::splat(corr[x]);
            for (u, v) in row.iter_mut().enumerate() {
                *v = V::load(acc.add(x * acc_stride + u * lanes)).times(c);
            }
        }
        // one pointer per row of A, as in [`qk`]
        let mut a_rows = [t.a; NR];
        for (x, a) in a_rows.iter_mut().enumerate() {
            *a = t.a.add(x * t.a_row);
        }
        for y in 0..t.k {
            let mut bv = [V::zero(); NV];
            for (u, v) in bv.iter_mut().enumerate() {
                *v = V::load(t.b.add(y * t.b_stride + u * lanes));
            }
            let step = y * t.a_col;
            for (row, a) in regs.iter_mut().zip(&a_rows) {
                let w = V::splat_from(a.add(step));
                for (v, bb) in row.iter_mut().zip(&bv) {
                    *v = w.mul_add(*bb, *v);
                }
            }
        }
        for (x, row) in regs.iter().enumerate() {
            for (u, v) in row.iter().enumerate() {
                v.store(acc.add(x * acc_stride + u * lanes));
            }
        }
    }

    #[inline(always)]
    unsafe fn exp_shift<V: Vector>(row: &mut [f32], l: f32) {
        exp_sub_sum::<V>(row, l);
    }

    /// `row[c] ← exp(row[c] − shift)` for every c; returns the sum of the new values.
    /// Two vectors a step: one exp is a chain of about 15 dependent operations, and two
    /// independent chains in flight took a fifth less time per value than one.
    #[inline(always)]
    unsafe fn exp_sub_sum<V: Vector>(row: &mut [f32], shift: f32) -> f32 {
        let lanes = V::LANES;
        let sv = V::splat(shift);
        let (mut s0, mut s1) = (V::zero(), V::zero());
        let mut pairs = row.chunks_exact_mut(2 * lanes);
        for c in &mut pairs {
            let p = c.as_mut_ptr();
            let e0 = V::load(p).minus(sv).exp();
            let e1 = V::load(p.add(lanes)).minus(sv).exp();
            e0.store(p);
            e1.store(p.add(lanes));
            s0 = s0.plus(e0);
            s1 = s1.plus(e1);
        }
        // the rest, under two vectors, through a copy padded with −∞ (whose exp is 0)
        for c in pairs.into_remainder().chunks_mut(lanes) {
            let mut padded = [f32::NEG_INFINITY; 16];
            padded[..c.len()].copy_from_slice(c);
            let e = V::load(padded.as_ptr()).minus(sv).exp();
            e.store(padded.as_mut_ptr());
            c.copy_from_slice(&padded[..c.len()]);
            s0 = s0.plus(e);
        }
        s0.plus(s1).sum()
    }

    /// Rows go by in groups of 16: the maxima of a group first (its rows' reductions
    /// are independent and overlap), then its exponentials, then its corrections
    /// exp(m − m') as one or two vectors rather than a scalar `exp` call per row.
    #[inline(always)]
    unsafe fn softmax_rows<V: Vector>(t: SoftmaxRows) {
        let SoftmaxRows {
            tile,
            stride,
            rows,
            cols,
            m,
            l,
            corr,
        } = t;
        const GROUP: usize = 16;
        let lanes = V::LANES;
        let whole = cols / lanes * lanes;
        for g0 in (0..rows).step_by(GROUP) {
            let n = GROUP.min(rows - g0);
            let mut m_new = [0.0f32; GROUP];
            for (i, mx) in m_new.iter_mut().enumerate().take(n) {
                let row = &tile[(g0 + i) * stride..(g0 + i) * stride + cols];
                let (mut a, mut b) = (V::splat(f32::NEG_INFINITY), V::splat(f32::NEG_INFINITY));
                let mut c = 0;
                while c + 2 * lanes <= whole {
                    a = a.max(V::load(row.as_ptr().add(c)));
                    b = b.max(V::load(row.as_ptr().add(c + lanes)));
                    c += 2 * lanes;
                }
                if c < whole {
                    a = a.max(V::load(row.as_ptr().add(c)));
                }
                *mx = row[whole..]
                    .iter()
                    .copied()
                    .fold(a.max(b).max_lane().max(m[g0 + i]), f32::max);
            }
            // exp(m − m') for the group; a lane whose m' is −∞ (nothing visible, so m is
            // −∞ too) takes a difference of 0, a factor of 1
            let mut diff = [0.0f32; GROUP];
            for i in 0..n {
                if m_new[i] != f32::NEG_INFINITY {
                    diff[i] = m[g0 + i] - m_new[i];
                }
            }
            let mut factor = [0.0f32; GROUP];
            for i in (0..n).step_by(lanes) {
                V::load(diff.as_ptr().add(i))
                    .exp()
                    .store(factor.as_mut_ptr().add(i));
            }
            corr[g0..g0 + n].copy_from_slice(&factor[..n]);
            for (i, &mx) in m_new.iter().enumerate().take(n) {
                let r = g0 + i;
                let row = &mut tile[r * stride..r * stride + cols];
                if mx == f32::NEG_INFINITY {
                    row.fill(0.0);
                    continue;
                }
                let sum = exp_sub_sum::<V>(row, mx);
                l[r] = l[r] * corr[r] + sum;
                m[r] = mx;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matmul::pack_panels;
    use crate::ops::MatRef;
    use crate::rng::Rng;

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
