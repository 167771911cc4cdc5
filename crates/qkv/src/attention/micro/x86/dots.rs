//! Query rows against a KV cache's keys read in place, out = scale·q·kᵀ: tiles of up
//! to four query rows (a GQA group's heads) × two keys, each key vector loaded once
//! (and, in bf16, widened in the register it is loaded into) and used by every row of
//! the tile, so a decode step reads the cache's rows once and copies none of them.

use crate::ops::vector::Vector;

use super::super::operands::Dots;
use super::load::Load;

#[inline(always)]
pub(super) unsafe fn dots<V: Vector>(t: Dots) {
    rows_by_four::<V, f32>(t)
}

#[inline(always)]
pub(super) unsafe fn dots_bf16<V: Vector>(t: Dots<u16>) {
    rows_by_four::<V, u16>(t)
}

#[inline(always)]
unsafe fn rows_by_four<V: Vector, K: Load>(t: Dots<K>) {
    let out = t.out.as_mut_ptr();
    let mut r0 = 0;
    while r0 < t.rows {
        match t.rows - r0 {
            1 => rows::<V, K, 1>(&t, r0, out),
            2 => rows::<V, K, 2>(&t, r0, out),
            3 => rows::<V, K, 3>(&t, r0, out),
            _ => rows::<V, K, 4>(&t, r0, out),
        }
        r0 += 4;
    }
}

/// Query rows `r0..r0 + R` against every key, two keys a tile, then the last odd one.
#[inline(always)]
unsafe fn rows<V: Vector, K: Load, const R: usize>(t: &Dots<K>, r0: usize, out: *mut f32) {
    let mut j0 = 0;
    while j0 + 2 <= t.n {
        tile::<V, K, R, 2>(t, (r0, j0), out);
        j0 += 2;
    }
    if j0 < t.n {
        tile::<V, K, R, 1>(t, (r0, j0), out);
    }
}

/// R query rows from `r0` against U keys from `j0`: R·U sums over D in whole vectors
/// (R·U + U + 1 registers: 11 for 4 × 2), then D's last few values one at a time.
#[inline(always)]
unsafe fn tile<V: Vector, K: Load, const R: usize, const U: usize>(
    t: &Dots<K>,
    (r0, j0): (usize, usize),
    out: *mut f32,
) {
    let (lanes, d) = (V::LANES, t.d);
    let whole = d / lanes * lanes;
    let q = t.q.as_ptr().add(r0 * t.q_stride);
    let k = t.k.as_ptr().add(j0 * t.k_stride);
    let mut acc = [[V::zero(); U]; R];
    let mut e = 0;
    while e < whole {
        let mut keys = [V::zero(); U];
        for (u, key) in keys.iter_mut().enumerate() {
            *key = K::load(k.add(u * t.k_stride + e));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let qv = V::load(q.add(r * t.q_stride + e));
            for (a, &key) in row.iter_mut().zip(&keys) {
                *a = qv.mul_add(key, *a);
            }
        }
        e += lanes;
    }
    for (r, row) in acc.iter().enumerate() {
        for (u, a) in row.iter().enumerate() {
            let mut s = a.sum();
            for e in whole..d {
                s += *q.add(r * t.q_stride + e) * (*k.add(u * t.k_stride + e)).value();
            }
            *out.add((r0 + r) * t.out_stride + j0 + u) = t.scale * s;
        }
    }
}
