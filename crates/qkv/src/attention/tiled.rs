//! Tiled attention with an online softmax, in the FlashAttention-2 loop order: each
//! task owns one block of query rows of one head and streams over key blocks, keeping
//! a running row max `m`, a running sum `l` and an unnormalised output `acc`. Nothing
//! T×S is stored; extra memory per task is O(BLOCK_Q·(BLOCK_K + Dv)).
//!
//! For a new key block with scores s: m' = max(m, max s), p = exp(s − m'),
//! l' = l·exp(m − m') + Σp, acc' = acc·exp(m − m') + p·V. At the end out = acc / l and
//! the row's log-sum-exp is m + ln l, which the backward pass and the weights use.

use crate::ops::disjoint::Disjoint;
use crate::ops::for_each_task;
use rayon::prelude::*;

use super::decode::{self, KvRows};
use super::micro::{self, MulAcc, Scores, SoftmaxRows, Strided, PANEL};
use super::output::AttentionOutput;
use super::panels::{Panels, Rows};
use super::scratch::{QueryRows, Scratch, BLOCK_K};
use super::spec::Scorer;
use super::tiled_bf16;
use super::view::HeadsView;
use crate::ops::matmul::gemm_views;
use crate::ops::{MatMut, MatRef};
use crate::tensor::Tensor;

/// Query rows per task. With 128 keys a block, a task's scores (32 × 128), its
/// accumulator (32 × Dv) and a 16-column strip of the value block stay within L1 (32
/// KiB here); 64 rows did not, and measured slower at short lengths.
const BLOCK_Q: usize = 32;
/// q: [B,T,H,D], k: [B,S,G,D], v: [B,S,G,Dv] (validated) → out [B,T,H,Dv], lse [B,H,T].
/// A few query rows (a decode step) go to [`decode`], which splits the keys instead.
/// With `bf16` the two products take bf16 operands ([`tiled_bf16`]).
pub(crate) fn attention(
    [q, k, v]: [&HeadsView; 3],
    scorer: &Scorer,
    want_weights: bool,
    bf16: bool,
) -> AttentionOutput {
    let dims = scorer.dims;
    if dims.t <= decode::MAX_ROWS {
        let (out, lse) = decode::attention(q, KvRows::F32(k), KvRows::F32(v), scorer);
        let weights = want_weights.then(|| weights_from_lse(q, k, scorer, &lse));
        return AttentionOutput { out, lse, weights };
    }
    let (t, h_n, dv) = (dims.t, dims.h, dims.dv);
    let block_q = if bf16 { tiled_bf16::BLOCK_Q } else { BLOCK_Q };
    let n_qblocks = t.div_ceil(block_q);
    let mut out = Tensor::zeros(&[dims.b, t, h_n, dv]);
    let mut lse = Tensor::zeros(&[dims.b, h_n, t]);
    let out_w = Disjoint::new(out.data_mut());
    let lse_w = Disjoint::new(lse.data_mut());
    // each packs a (batch, key head) when a task first reads it: only one is used
    let keys = Panels::new(k);
    let values = Rows::new(v);
    let blocks = bf16.then(|| tiled_bf16::Blocks::new(k, v));

    let sizes = (block_q, dv, if bf16 { dims.d } else { 0 });
    for_each_task(dims.b * h_n * n_qblocks, |task| {
        Scratch::with(sizes, |scratch| {
            let (bh, qb) = (task / n_qblocks, task % n_qblocks);
            let (b, h) = (bh / h_n, bh % h_n);
            let i0 = qb * block_q;
            let rows = block_q.min(t - i0);
            let at = QueryRows { b, h, i0, rows };
            match &blocks {
                Some(blocks) => tiled_bf16::query_block(q, blocks, scorer, at, scratch),
                None => query_block(q, (&keys, &values), scorer, at, scratch),
            }
            for r in 0..rows {
                let i = i0 + r;
                // SAFETY: task (b, h, qb) alone owns out[b, i0..i0+rows, h, :] and
                // lse[b, h, i0..i0+rows].
                let (o, lse_i) = unsafe {
                    (
                        out_w.range(((b * t + i) * h_n + h) * dv, dv),
                        &mut lse_w.range((b * h_n + h) * t + i, 1)[0],
                    )
                };
                let l = scratch.l[r];
                // l ≥ 1 as soon as one key is visible (its max term is e⁰), so exactly 0
                // means every key was masked. Testing `l > 0` instead would also send a
                // NaN sum down this branch and hide a numerical fault as zeros.
                if l == 0.0 {
                    // Every key masked: zeros out, −∞ log-sum-exp, never NaN.
                    o.fill(0.0);
                    *lse_i = f32::NEG_INFINITY;
                } else {
                    let inv = 1.0 / l;
                    for (oc, ac) in o.iter_mut().zip(&scratch.acc[r * dv..(r + 1) * dv]) {
                        *oc = ac * inv;
                    }
                    *lse_i = scratch.m[r] + l.ln();
                }
            }
        })
    });
    let weights = want_weights.then(|| weights_from_lse(q, k, scorer, &lse));
    AttentionOutput { out, lse, weights }
}

/// Runs the online softmax for query rows i0..i0+rows of head h in batch b,
/// leaving acc, m and l in `scratch`. Key blocks no row of the block may see are
/// skipped; the mask is applied only to blocks where some row sees only part of it.
fn query_block(
    q: &HeadsView,
    (keys, values): (&Panels, &Rows),
    scorer: &Scorer,
    at: QueryRows,
    scratch: &mut Scratch,
) {
    let QueryRows { b, h, i0, rows } = at;
    let dims = scorer.dims;
    let kernels = micro::Kernels::detect();
    let (d, dv) = (dims.d, dims.dv);
    let g = dims.kv_head(h);
    scratch.m[..rows].fill(f32::NEG_INFINITY);
    scratch.l[..rows].fill(0.0);
    scratch.acc[..rows * dv].fill(0.0);

    // Key ranges grow with the row: the block's union is [lo of the first row, hi of
    // the last), and every row sees all of [lo of the last, hi of the first).
    let (lo, hi_first) = scorer.key_range(i0);
    let (lo_last, hi) = scorer.key_range(i0 + rows - 1);
    let q_blk = &q.data[q.offset(b, i0, h)..];
    // from a panel boundary: the keys before `lo` in the first panel are masked
    let mut j0 = lo - lo % PANEL;
    while j0 < hi {
        let cols = BLOCK_K.min(hi - j0);
        let panels = cols.div_ceil(PANEL);
        kernels.scores(Scores {
            q: q_blk,
            q_stride: q.pos_stride,
            rows,
            d,
            kp: keys.from(b, g, j0),
            panels,
            scale: scorer.scale,
            out: &mut scratch.tile,
            out_stride: BLOCK_K,
        });
        let whole = j0 >= lo_last && j0 + cols <= hi_first && !scorer.needs_row_pass();
        for r in 0..rows {
            let row = &mut scratch.tile[r * BLOCK_K..r * BLOCK_K + cols];
            match whole {
                true => scorer.cap_row(row),
                false => scorer.apply_row(b, h, i0 + r, j0, row),
            }
        }
        let (m, l, corr) = (&mut scratch.m, &mut scratch.l, &mut scratch.corr);
        kernels.softmax_rows(SoftmaxRows {
            tile: &mut scratch.tile,
            stride: BLOCK_K,
            rows,
            cols,
            m,
            l,
            corr,
        });
        // acc = corr·acc + P · V[j0..j0+cols, g, :]
        let p = Strided {
            data: &scratch.tile,
            row: BLOCK_K,
            col: 1,
        };
        let corr = Some(&scratch.corr[..]);
        kernels.mul_acc(MulAcc {
            a: p,
            m: rows,
            k: cols,
            b: values.from(b, g, j0),
            b_stride: dv,
            n: dv,
            corr,
            acc: &mut scratch.acc,
            acc_stride: dv,
        });
        j0 += cols;
    }
}

/// Softmax weights [B,H,T,S] recomputed from the saved log-sum-exp: P = exp(s − lse).
/// Lets a caller inspect weights without running the reference kernel.
fn weights_from_lse(q: &HeadsView, k: &HeadsView, scorer: &Scorer, lse: &Tensor) -> Tensor {
    let dims = scorer.dims;
    let (t, s, h_n, d) = (dims.t, dims.s, dims.h, dims.d);
    let mut w = Tensor::zeros(&[dims.b, h_n, t, s]);
    w.data_mut()
        .par_chunks_mut(t * s)
        .enumerate()
        .for_each(|(bh, w_bh)| {
            let (b, h) = (bh / h_n, bh % h_n);
            let g = dims.kv_head(h);
            gemm_views(
                MatMut::row_major(w_bh, t, s),
                MatRef {
                    data: &q.data[q.offset(b, 0, h)..],
                    rows: t,
                    cols: d,
                    row_stride: q.pos_stride,
                    col_stride: 1,
                },
                MatRef {
                    data: &k.data[k.offset(b, 0, g)..],
                    rows: s,
                    cols: d,
                    row_stride: k.pos_stride,
                    col_stride: 1,
                }
                .t(),
                scorer.scale,
            );
            for (i, row) in w_bh.chunks_exact_mut(s).enumerate() {
                scorer.apply_row(b, h, i, 0, row);
                let l = lse.data()[bh * t + i];
                for x in row.iter_mut() {
                    *x = if l == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (*x - l).exp()
                    };
                }
            }
        });
    w
}
