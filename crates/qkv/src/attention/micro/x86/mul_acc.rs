//! The product tile, acc = corr·acc + A·B (P·V forward; Pᵀ·dO, dSᵀ·Q and dS·K
//! backward): A read through strides, B in place, 6 or 8 rows × one or two vectors of
//! output columns in registers. B in f32, or in bf16 (a KV cache's values), widened in
//! the registers it is loaded into.

use crate::ops::vector::Vector;

use super::super::operands::MulAcc;
use super::load::Load;

#[inline(always)]
pub(super) unsafe fn mul_acc<V: Vector, const R: usize>(t: MulAcc) {
    product::<V, R, f32>(t)
}

#[inline(always)]
pub(super) unsafe fn mul_acc_bf16<V: Vector, const R: usize>(t: MulAcc<u16>) {
    product::<V, R, u16>(t)
}

#[inline(always)]
unsafe fn product<V: Vector, const R: usize, B: Load>(t: MulAcc<B>) {
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
                tile::<V, R, 2, B>(&args, c, out, acc_stride);
            } else {
                tile::<V, R, 1, B>(&args, c, out, acc_stride);
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
        1 => tile_rows::<V, 1, B>(&args, n, c, out, acc_stride),
        2 => tile_rows::<V, 2, B>(&args, n, c, out, acc_stride),
        3 => tile_rows::<V, 3, B>(&args, n, c, out, acc_stride),
        4 => tile_rows::<V, 4, B>(&args, n, c, out, acc_stride),
        5 => tile_rows::<V, 5, B>(&args, n, c, out, acc_stride),
        6 => tile_rows::<V, 6, B>(&args, n, c, out, acc_stride),
        _ => tile_rows::<V, 7, B>(&args, n, c, out, acc_stride),
    }
    // columns past the last whole vector, one at a time
    for x in 0..m {
        let c = corr.map_or(1.0, |c| c[x]);
        for e in e0..n {
            let mut v = acc[x * acc_stride + e] * c;
            for y in 0..k {
                v += a.data[x * a.row + y * a.col] * b[y * b_stride + e].value();
            }
            acc[x * acc_stride + e] = v;
        }
    }
}

/// NR < R rows (the block's last) over the whole vectors of n columns (`t.b` at column 0), four
/// vectors a step under 4 rows for the same reason as `qk_rows` (scores.rs).
#[inline(always)]
unsafe fn tile_rows<V: Vector, const NR: usize, B: Load>(
    t: &Tile<B>,
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
            4 => tile::<V, NR, 4, B>(&at, corr, acc.add(e0), acc_stride),
            2 => tile::<V, NR, 2, B>(&at, corr, acc.add(e0), acc_stride),
            _ => tile::<V, NR, 1, B>(&at, corr, acc.add(e0), acc_stride),
        }
        e0 += vectors * lanes;
    }
}

/// The operands of one register tile (see [`tile`]).
struct Tile<B> {
    a: *const f32,
    a_row: usize,
    a_col: usize,
    k: usize,
    b: *const B,
    b_stride: usize,
}

// by hand: a derive would ask B: Copy of the pointer's target
impl<B> Clone for Tile<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Tile<B> {}

/// NR rows × NV vectors of columns of acc = c·acc + A·B.
#[inline(always)]
unsafe fn tile<V: Vector, const NR: usize, const NV: usize, B: Load>(
    t: &Tile<B>,
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
    // one pointer per row of A, as in `qk` (scores.rs)
    let mut a_rows = [t.a; NR];
    for (x, a) in a_rows.iter_mut().enumerate() {
        *a = t.a.add(x * t.a_row);
    }
    for y in 0..t.k {
        let mut bv = [V::zero(); NV];
        for (u, v) in bv.iter_mut().enumerate() {
            *v = B::load::<V>(t.b.add(y * t.b_stride + u * lanes));
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
