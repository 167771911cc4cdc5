//! The tiled kernels' inner loops on register tiles: scores S = scale·Q·Kᵀ (and
//! dP = dO·Vᵀ), the online softmax of a row of scores, and acc = corr·acc + A·B (P·V,
//! and the backward's Pᵀ·dO, dSᵀ·Q, dS·K). Each has an AVX2 + FMA form,
//! chosen at run time, and a portable form that says what it computes in plain loops;
//! the reference kernel (`reference.rs`) is the readable twin the tests hold them to.
//!
//! Keys are packed once per key block into panels of 8 keys, `[D][8]` each (zero
//! padded to a whole panel), so the scores product reads one vector per (d, panel) and
//! broadcasts one query element per (row, d): 6 rows × 2 panels of accumulators fill the
//! 16 AVX2 registers with the two loads and one broadcast. A·B reads B in place (its
//! rows are contiguous), A through strides (so Pᵀ needs no copy), and keeps 6 rows ×
//! 16 output columns in registers.

use crate::ops::simd::avx2_fma;

/// Keys per panel (one AVX2 vector).
pub(crate) const PANEL: usize = 8;

/// Packs keys `k_rows[c]` (each `d` wide, `c < cols`) into panels: element (c, e) at
/// `(c / 8)·8·d + e·8 + c % 8`; the last panel's missing keys are zeros.
pub(crate) fn pack_keys(
    k_rows: impl Fn(usize) -> *const f32,
    cols: usize,
    d: usize,
    out: &mut [f32],
) {
    let panels = cols.div_ceil(PANEL);
    let out = &mut out[..panels * PANEL * d];
    for c in 0..panels * PANEL {
        let (p, lane) = (c / PANEL, c % PANEL);
        let dst = &mut out[p * PANEL * d..(p + 1) * PANEL * d];
        if c < cols {
            // SAFETY: the caller's `k_rows(c)` points at d readable floats for c < cols.
            let src = unsafe { std::slice::from_raw_parts(k_rows(c), d) };
            for (e, &x) in src.iter().enumerate() {
                dst[e * PANEL + lane] = x;
            }
        } else {
            for e in 0..d {
                dst[e * PANEL + lane] = 0.0;
            }
        }
    }
}

/// `out[r·out_stride + c] = scale · Σ_e q[r·q_stride + e] · key_c[e]` for r < rows and
/// every key c of the `panels` packed panels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    d: usize,
    kp: &[f32],
    panels: usize,
    scale: f32,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(rows == 0 || q.len() >= (rows - 1) * q_stride + d);
    assert!(kp.len() >= panels * PANEL * d);
    assert!(rows == 0 || out.len() >= (rows - 1) * out_stride + panels * PANEL);
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA are present; the bounds were checked above.
        unsafe { x86::scores(q, q_stride, rows, d, kp, panels, scale, out, out_stride) };
        return;
    }
    portable::scores(q, q_stride, rows, d, kp, panels, scale, out, out_stride);
}

/// A strided matrix operand: element (x, y) at `data[x·row + y·col]`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub row: usize,
    pub col: usize,
}

/// `acc[x·acc_stride + e] = c_x·acc[x·acc_stride + e] + Σ_y a(x, y) · b[y·b_stride + e]`
/// for x < m, y < k, e < n, with c_x = `corr[x]` (1 without `corr`): P·V in the
/// forward, and Pᵀ·dO, dSᵀ·Q and dS·K in the backward.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_acc(
    a: Strided,
    m: usize,
    k: usize,
    b: &[f32],
    b_stride: usize,
    n: usize,
    corr: Option<&[f32]>,
    acc: &mut [f32],
    acc_stride: usize,
) {
    if m == 0 || k == 0 || n == 0 {
        // nothing to add; the rows still take their correction
        portable::mul_acc(a, m, 0, b, b_stride, n, corr, acc, acc_stride);
        return;
    }
    assert!(a.data.len() > (m - 1) * a.row + (k - 1) * a.col);
    assert!(b.len() >= (k - 1) * b_stride + n);
    assert!(acc.len() >= (m - 1) * acc_stride + n && corr.is_none_or(|c| c.len() >= m));
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA are present; the bounds were checked above.
        unsafe { x86::mul_acc(a, m, k, b, b_stride, n, corr, acc, acc_stride) };
        return;
    }
    portable::mul_acc(a, m, k, b, b_stride, n, corr, acc, acc_stride);
}

/// One row's online-softmax step over its scores `row` (−∞ where masked): with the
/// running max `m` and sum `l`, m' = max(m, max row), row ← exp(row − m'),
/// l ← l·exp(m − m') + Σ row, m ← m'. Returns the factor exp(m − m') that rescales the
/// row's accumulated output (1 when the max did not move). A row with nothing visible
/// yet is left at zero weight and changes nothing.
pub(crate) fn softmax_step(row: &mut [f32], m: &mut f32, l: &mut f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { x86::softmax_step(row, m, l) };
    }
    portable::softmax_step(row, m, l)
}

/// `row[c] ← exp(row[c] − l)`: probabilities from scores and the row's saved
/// log-sum-exp; a row whose `l` is −∞ (every key masked) becomes zeros.
pub(crate) fn exp_shift(row: &mut [f32], l: f32) {
    if l == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA are present.
        unsafe { x86::exp_shift(row, l) };
        return;
    }
    portable::exp_shift(row, l);
}

/// Folds a row whose max is `m_new` and whose exponentials sum to `sum` into the
/// running max and sum; returns the factor exp(m − m') for the accumulated output.
fn update(m: &mut f32, l: &mut f32, m_new: f32, sum: f32) -> f32 {
    let correction = (*m - m_new).exp();
    *l = *l * correction + sum;
    *m = m_new;
    correction
}

/// The kernels in plain loops: what runs without AVX2, and what the tests hold the
/// vector forms to on any machine. Same contracts as the public functions above.
mod portable {
    use super::{update, Strided, PANEL};

    #[allow(clippy::too_many_arguments)]
    pub(super) fn scores(
        q: &[f32],
        q_stride: usize,
        rows: usize,
        d: usize,
        kp: &[f32],
        panels: usize,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
    ) {
        for r in 0..rows {
            let qr = &q[r * q_stride..r * q_stride + d];
            for p in 0..panels {
                let panel = &kp[p * PANEL * d..(p + 1) * PANEL * d];
                for lane in 0..PANEL {
                    let dot: f32 = qr
                        .iter()
                        .enumerate()
                        .map(|(e, &x)| x * panel[e * PANEL + lane])
                        .sum();
                    out[r * out_stride + p * PANEL + lane] = scale * dot;
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn mul_acc(
        a: Strided,
        m: usize,
        k: usize,
        b: &[f32],
        b_stride: usize,
        n: usize,
        corr: Option<&[f32]>,
        acc: &mut [f32],
        acc_stride: usize,
    ) {
        for x in 0..m {
            let row = &mut acc[x * acc_stride..x * acc_stride + n];
            let c = corr.map_or(1.0, |c| c[x]);
            row.iter_mut().for_each(|v| *v *= c);
            for y in 0..k {
                let w = a.data[x * a.row + y * a.col];
                for (v, &bv) in row.iter_mut().zip(&b[y * b_stride..y * b_stride + n]) {
                    *v += w * bv;
                }
            }
        }
    }

    pub(super) fn softmax_step(row: &mut [f32], m: &mut f32, l: &mut f32) -> f32 {
        let m_new = row.iter().copied().fold(*m, f32::max);
        if m_new == f32::NEG_INFINITY {
            // nothing visible yet in this row: contribute nothing
            row.fill(0.0);
            return 1.0;
        }
        let mut sum = 0.0;
        for x in row.iter_mut() {
            *x = (*x - m_new).exp();
            sum += *x;
        }
        update(m, l, m_new, sum)
    }

    pub(super) fn exp_shift(row: &mut [f32], l: f32) {
        for x in row.iter_mut() {
            *x = (*x - l).exp();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{update, Strided, PANEL};
    use crate::ops::simd::x86::{exp8, hmax, hsum};
    use std::arch::x86_64::*;

    /// Rows per register tile.
    const R: usize = 6;

    /// # Safety
    /// AVX2 and FMA; the bounds asserted by [`super::scores`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores(
        q: &[f32],
        q_stride: usize,
        rows: usize,
        d: usize,
        kp: &[f32],
        panels: usize,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let (q, kp, out) = (q.as_ptr(), kp.as_ptr(), out.as_mut_ptr());
        let full = rows / R * R;
        // panels outside, whole row groups inside: a pair of panels (16 keys × D) stays
        // in L1 while every row group of the block reads it
        let mut p = 0;
        while p < panels {
            let two = panels - p >= 2;
            let k0 = kp.add(p * PANEL * d);
            for r0 in (0..full).step_by(R) {
                let q0 = q.add(r0 * q_stride);
                let o = out.add(r0 * out_stride + p * PANEL);
                if two {
                    qk::<R, 2>(q0, q_stride, d, k0, scale, o, out_stride);
                } else {
                    qk::<R, 1>(q0, q_stride, d, k0, scale, o, out_stride);
                }
            }
            p += if two { 2 } else { 1 };
        }
        let (q0, o) = (q.add(full * q_stride), out.add(full * out_stride));
        let tail = (q0, q_stride, d, kp, panels, scale, o, out_stride);
        match rows - full {
            0 => {}
            1 => qk_rows::<1>(tail),
            2 => qk_rows::<2>(tail),
            3 => qk_rows::<3>(tail),
            4 => qk_rows::<4>(tail),
            _ => qk_rows::<5>(tail),
        }
    }

    /// The arguments of [`qk`] with a whole run of panels: (q, q_stride, d, kp, panels,
    /// scale, out, out_stride).
    type QkRows = (
        *const f32,
        usize,
        usize,
        *const f32,
        usize,
        f32,
        *mut f32,
        usize,
    );

    /// NR < R rows against every panel. Under 4 rows, four panels a step, so that at
    /// least 8 sums are in flight: an FMA's latency (4 cycles) times the two it starts
    /// a cycle. With two panels, 2 rows ran at half the rate of a whole row group.
    #[inline(always)]
    unsafe fn qk_rows<const NR: usize>(args: QkRows) {
        let (q, q_stride, d, kp, panels, scale, out, out_stride) = args;
        let wide = NR <= 3;
        let mut p = 0;
        while p < panels {
            let (k0, o) = (kp.add(p * PANEL * d), out.add(p * PANEL));
            let step = match panels - p {
                n if wide && n >= 4 => 4,
                n if n >= 2 => 2,
                _ => 1,
            };
            match step {
                4 => qk::<NR, 4>(q, q_stride, d, k0, scale, o, out_stride),
                2 => qk::<NR, 2>(q, q_stride, d, k0, scale, o, out_stride),
                _ => qk::<NR, 1>(q, q_stride, d, k0, scale, o, out_stride),
            }
            p += step;
        }
    }

    /// NR query rows × NP key panels: out = scale·Q·Kᵀ.
    #[inline(always)]
    unsafe fn qk<const NR: usize, const NP: usize>(
        q: *const f32,
        q_stride: usize,
        d: usize,
        kp: *const f32,
        scale: f32,
        out: *mut f32,
        out_stride: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); NP]; NR];
        for e in 0..d {
            let mut kv = [_mm256_setzero_ps(); NP];
            for (p, k) in kv.iter_mut().enumerate() {
                *k = _mm256_loadu_ps(kp.add(p * PANEL * d + e * PANEL));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let qb = _mm256_broadcast_ss(&*q.add(r * q_stride + e));
                for (a, k) in row.iter_mut().zip(&kv) {
                    *a = _mm256_fmadd_ps(qb, *k, *a);
                }
            }
        }
        let s = _mm256_set1_ps(scale);
        for (r, row) in acc.iter().enumerate() {
            for (p, a) in row.iter().enumerate() {
                _mm256_storeu_ps(out.add(r * out_stride + p * PANEL), _mm256_mul_ps(*a, s));
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA; the bounds asserted by [`super::mul_acc`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn mul_acc(
        a: Strided,
        m: usize,
        k: usize,
        b: &[f32],
        b_stride: usize,
        n: usize,
        corr: Option<&[f32]>,
        acc: &mut [f32],
        acc_stride: usize,
    ) {
        let (ap, bp, cp) = (a.data.as_ptr(), b.as_ptr(), acc.as_mut_ptr());
        let ones = [1.0f32; R];
        let c_of = |x0: usize| -> &[f32] {
            match corr {
                Some(c) => &c[x0..],
                None => &ones,
            }
        };
        let full = m / R * R;
        // column chunks outside, whole row groups inside: a chunk of B (k rows × 16
        // columns) stays in L1 while every row group reads it
        let mut e0 = 0;
        while e0 + 8 <= n {
            let two = n - e0 >= 16;
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
                    tile::<R, 2>(&args, c, out, acc_stride);
                } else {
                    tile::<R, 1>(&args, c, out, acc_stride);
                }
            }
            e0 += if two { 16 } else { 8 };
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
            1 => tile_rows::<1>(&args, n, c, out, acc_stride),
            2 => tile_rows::<2>(&args, n, c, out, acc_stride),
            3 => tile_rows::<3>(&args, n, c, out, acc_stride),
            4 => tile_rows::<4>(&args, n, c, out, acc_stride),
            _ => tile_rows::<5>(&args, n, c, out, acc_stride),
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

    /// NR < R rows over the whole vectors of n columns (`t.b` at column 0), 32 columns
    /// a step under 4 rows for the same reason as [`qk_rows`].
    #[inline(always)]
    unsafe fn tile_rows<const NR: usize>(
        t: &Tile,
        n: usize,
        corr: &[f32],
        acc: *mut f32,
        acc_stride: usize,
    ) {
        let wide = NR <= 3;
        let mut e0 = 0;
        while e0 + 8 <= n {
            let step = match n - e0 {
                left if wide && left >= 32 => 32,
                left if left >= 16 => 16,
                _ => 8,
            };
            let at = Tile {
                b: t.b.add(e0),
                ..*t
            };
            match step {
                32 => tile::<NR, 4>(&at, corr, acc.add(e0), acc_stride),
                16 => tile::<NR, 2>(&at, corr, acc.add(e0), acc_stride),
                _ => tile::<NR, 1>(&at, corr, acc.add(e0), acc_stride),
            }
            e0 += step;
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

    /// NR rows × NV·8 columns of acc = c·acc + A·B.
    #[inline(always)]
    unsafe fn tile<const NR: usize, const NV: usize>(
        t: &Tile,
        corr: &[f32],
        acc: *mut f32,
        acc_stride: usize,
    ) {
        let mut regs = [[_mm256_setzero_ps(); NV]; NR];
        for (x, row) in regs.iter_mut().enumerate() {
            let c = _mm256_set1_ps(corr[x]);
            for (u, v) in row.iter_mut().enumerate() {
                *v = _mm256_mul_ps(_mm256_loadu_ps(acc.add(x * acc_stride + u * 8)), c);
            }
        }
        for y in 0..t.k {
            let mut bv = [_mm256_setzero_ps(); NV];
            for (u, v) in bv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(t.b.add(y * t.b_stride + u * 8));
            }
            for (x, row) in regs.iter_mut().enumerate() {
                let w = _mm256_broadcast_ss(&*t.a.add(x * t.a_row + y * t.a_col));
                for (v, bb) in row.iter_mut().zip(&bv) {
                    *v = _mm256_fmadd_ps(w, *bb, *v);
                }
            }
        }
        for (x, row) in regs.iter().enumerate() {
            for (u, v) in row.iter().enumerate() {
                _mm256_storeu_ps(acc.add(x * acc_stride + u * 8), *v);
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shift(row: &mut [f32], l: f32) {
        exp_sub_sum(row, l);
    }

    /// `row[c] ← exp(row[c] − shift)` for every c; returns the sum of the new values.
    /// Two vectors a step: one exp is a chain of about 15 dependent operations, and two
    /// independent chains in flight took a fifth less time per value than one.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_sub_sum(row: &mut [f32], shift: f32) -> f32 {
        let sv = _mm256_set1_ps(shift);
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut pairs = row.chunks_exact_mut(16);
        for c in &mut pairs {
            let p = c.as_mut_ptr();
            let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), sv));
            let e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), sv));
            _mm256_storeu_ps(p, e0);
            _mm256_storeu_ps(p.add(8), e1);
            s0 = _mm256_add_ps(s0, e0);
            s1 = _mm256_add_ps(s1, e1);
        }
        // the rest, under 16 values, through a copy padded with −∞ (whose exp is 0)
        for c in pairs.into_remainder().chunks_mut(8) {
            let mut lanes = [f32::NEG_INFINITY; 8];
            lanes[..c.len()].copy_from_slice(c);
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(lanes.as_ptr()), sv));
            _mm256_storeu_ps(lanes.as_mut_ptr(), e);
            c.copy_from_slice(&lanes[..c.len()]);
            s0 = _mm256_add_ps(s0, e);
        }
        hsum(_mm256_add_ps(s0, s1))
    }

    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax_step(row: &mut [f32], m: &mut f32, l: &mut f32) -> f32 {
        let n = row.len();
        let whole = n / 8 * 8;
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        for c in (0..whole).step_by(8) {
            vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(row.as_ptr().add(c)));
        }
        let m_new = row[whole..]
            .iter()
            .copied()
            .fold(hmax(vmax).max(*m), f32::max);
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0);
            return 1.0;
        }
        let sum = exp_sub_sum(row, m_new);
        update(m, l, m_new, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Both forms of each kernel against sums in f64, on shapes that leave partial
    /// register tiles, partial panels and partial vectors.
    /// Rows past the last whole group of 6 are 1 to 5 here, and take every panel and
    /// column step of the narrow-row tiles.
    const SHAPES: [(usize, usize, usize); 9] = [
        (1, 1, 1),
        (5, 3, 7),
        (6, 16, 8),
        (7, 17, 64),
        (8, 40, 33),
        (9, 48, 16),
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

    /// Runs `f` with the vector form (where this CPU has it) and with the portable form.
    fn both_forms(mut f: impl FnMut(bool)) {
        f(false);
        if cfg!(target_arch = "x86_64") && avx2_fma() {
            f(true);
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
            pack_keys(|c| k[c * d..].as_ptr(), cols, d, &mut kp);
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
            both_forms(|vector| {
                let mut out = vec![0.0f32; rows * out_stride];
                let args = (&q[..], q_stride, rows, d, &kp[..], panels, scale);
                if vector {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `both_forms` asks only where AVX2 and FMA are present.
                    unsafe {
                        x86::scores(
                            args.0, args.1, args.2, args.3, args.4, args.5, args.6, &mut out,
                            out_stride,
                        )
                    };
                } else {
                    portable::scores(
                        args.0, args.1, args.2, args.3, args.4, args.5, args.6, &mut out,
                        out_stride,
                    );
                }
                for r in 0..rows {
                    let span = r * out_stride..r * out_stride + panels * PANEL;
                    close(
                        &out[span.clone()],
                        &want[span],
                        &format!("scores {rows}x{cols}x{d}"),
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
                both_forms(|vector| {
                    let mut acc = acc0.clone();
                    if vector {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `both_forms` asks only where AVX2 and FMA are present.
                        unsafe {
                            x86::mul_acc(strided, m, k, &b, b_stride, n, c, &mut acc, acc_stride)
                        };
                    } else {
                        portable::mul_acc(strided, m, k, &b, b_stride, n, c, &mut acc, acc_stride);
                    }
                    for x in 0..m {
                        let span = x * acc_stride..x * acc_stride + n;
                        close(
                            &acc[span.clone()],
                            &want[span],
                            &format!("mul_acc {m}x{k}x{n}"),
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

    #[test]
    fn softmax_steps_over_blocks_equal_one_softmax() {
        let mut rng = Rng::new(3);
        for n in [1, 7, 8, 9, 31, 130] {
            let mut scores = rng.normals(n, 3.0);
            // masked keys, including a whole leading block
            for (i, s) in scores.iter_mut().enumerate() {
                if i % 5 == 3 || i < n / 3 {
                    *s = f32::NEG_INFINITY;
                }
            }
            let max = scores
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
            let total: f64 = scores.iter().map(|&s| (s as f64 - max).exp()).sum();
            both_forms(|vector| {
                let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
                let mut weights = Vec::new();
                for block in scores.chunks(n.div_ceil(3).max(1)) {
                    let mut row = block.to_vec();
                    let corr = if vector {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `both_forms` asks only where AVX2 and FMA are present.
                        unsafe {
                            x86::softmax_step(&mut row, &mut m, &mut l)
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        unreachable!()
                    } else {
                        portable::softmax_step(&mut row, &mut m, &mut l)
                    };
                    weights.iter_mut().for_each(|w| *w *= corr);
                    weights.extend(row);
                }
                let want: Vec<f64> = scores
                    .iter()
                    .map(|&s| (s as f64 - max).exp() / total)
                    .collect();
                let got: Vec<f32> = weights.iter().map(|w| w / l).collect();
                close(&got, &want, &format!("softmax of {n}"));
                // the saved log-sum-exp turns scores back into the same weights
                let lse = m + l.ln();
                let mut again = scores.clone();
                if vector {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    unsafe {
                        x86::exp_shift(&mut again, lse)
                    };
                } else {
                    portable::exp_shift(&mut again, lse);
                }
                close(&again, &want, &format!("exp_shift of {n}"));
            });
        }
    }

    #[test]
    fn fully_masked_rows_give_zero_weight() {
        let mut row = vec![f32::NEG_INFINITY; 11];
        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0);
        assert_eq!(softmax_step(&mut row, &mut m, &mut l), 1.0);
        assert!(row.iter().all(|&w| w == 0.0) && l == 0.0 && m == f32::NEG_INFINITY);
        let mut row = vec![1.0f32; 11];
        exp_shift(&mut row, f32::NEG_INFINITY);
        assert!(row.iter().all(|&w| w == 0.0));
    }
}
