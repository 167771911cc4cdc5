//! The scores tile, S = scale·Q·Kᵀ, against keys packed in panels: row groups of the
//! block against two key vectors at a time, then the block's last rows.

use crate::ops::vector::Vector;

use super::super::operands::{Scores, PANEL};

/// Where the vector of keys u·L..(u+1)·L starts in the packed panels (L lanes; a
/// panel of 16 keys is one AVX-512 vector or two AVX2 ones): step e of it is `e·PANEL`
/// further on.
#[inline(always)]
fn key_vector<V: Vector>(u: usize, d: usize) -> usize {
    let first = u * V::LANES;
    (first / PANEL) * PANEL * d + first % PANEL
}

#[inline(always)]
pub(super) unsafe fn scores<V: Vector, const R: usize>(s: Scores) {
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
