//! The kernels in plain loops: what runs without AVX2, and what the tests hold the
//! vector forms to on any machine. Same contracts as the [`Kernels`] methods of the
//! same names.
//!
//! [`Kernels`]: super::kernels::Kernels

use crate::ops::softmax::exp_shifted_sum;

use super::operands::{Dots, Element, MulAcc, Scores, SoftmaxRows, PANEL};

/// The factor exp(m − m') that moves a row's sums from running max m to m'; 1 for a
/// row with nothing visible yet (both −∞).
fn correction(m: f32, m_new: f32) -> f32 {
    if m_new == f32::NEG_INFINITY {
        1.0
    } else {
        (m - m_new).exp()
    }
}

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

pub(super) fn dots_bf16(t: Dots<u16>) {
    dots(t)
}

pub(super) fn dots<K: Element>(t: Dots<K>) {
    for r in 0..t.rows {
        let qr = &t.q[r * t.q_stride..r * t.q_stride + t.d];
        for j in 0..t.n {
            let key = &t.k[j * t.k_stride..j * t.k_stride + t.d];
            let dot: f32 = qr.iter().zip(key).map(|(&x, &k)| x * k.value()).sum();
            t.out[r * t.out_stride + j] = t.scale * dot;
        }
    }
}

pub(super) fn mul_acc_bf16(t: MulAcc<u16>) {
    mul_acc(t)
}

pub(super) fn mul_acc<B: Element>(t: MulAcc<B>) {
    let (n, a) = (t.n, t.a);
    for x in 0..t.m {
        let row = &mut t.acc[x * t.acc_stride..x * t.acc_stride + n];
        let c = t.corr.map_or(1.0, |c| c[x]);
        row.iter_mut().for_each(|v| *v *= c);
        for y in 0..t.k {
            let w = a.data[x * a.row + y * a.col];
            let b = &t.b[y * t.b_stride..y * t.b_stride + n];
            for (v, &bv) in row.iter_mut().zip(b) {
                *v += w * bv.value();
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
