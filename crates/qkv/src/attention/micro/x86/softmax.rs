//! The online softmax of rows of scores, and exp(row − shift): vector exponentials two
//! at a time, rows' maxima and corrections a group at a time. Every exponent here is a
//! score minus its row's running max (or logsumexp, which is no smaller), so ≤ 0: each
//! is [`Vector::exp_nonpositive`], FlashAttention's exp2 form.

use crate::ops::vector::Vector;

use super::super::operands::SoftmaxRows;

#[inline(always)]
pub(super) unsafe fn exp_shift<V: Vector>(row: &mut [f32], l: f32) {
    exp_sub_sum::<V>(row, l);
}

/// `row[c] ← exp(row[c] − shift)` for every c (shift ≥ every value); returns the sum of
/// the new values.
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
        let e0 = V::load(p).minus(sv).exp_nonpositive();
        let e1 = V::load(p.add(lanes)).minus(sv).exp_nonpositive();
        e0.store(p);
        e1.store(p.add(lanes));
        s0 = s0.plus(e0);
        s1 = s1.plus(e1);
    }
    // the rest, under two vectors, through a copy padded with −∞ (whose exp is 0)
    for c in pairs.into_remainder().chunks_mut(lanes) {
        let mut padded = [f32::NEG_INFINITY; 16];
        padded[..c.len()].copy_from_slice(c);
        let e = V::load(padded.as_ptr()).minus(sv).exp_nonpositive();
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
pub(super) unsafe fn softmax_rows<V: Vector>(t: SoftmaxRows) {
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
                .exp_nonpositive()
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
