//! The FlashAttention-2 backward on tiles: nothing T×S is ever stored. Each tile of
//! query rows i0..i0+rows against keys j0..j0+cols recomputes its scores and
//! P = exp(S − lse) from the log-sum-exp the forward saved, so the softmax needs no
//! second sweep; with D_i = rowsum(dO_i ∘ O_i), computed once per row from the saved
//! output, every tile's dS = P∘(dP − D) is local to the tile.
//!
//! One task per (batch, key/value head): it owns the dK and dV of that head (summed
//! over the H/G query heads that share it, in a fixed order) and the dQ of those query
//! heads, so every tile's five products are computed once, each gradient is written by
//! one task, and the result is bit-identical for any thread count. Extra memory is
//! O(S·(D + Dv)) per thread for the key/value head's dK and dV. (CUDA's
//! FlashAttention-2 adds dQ with atomics instead, whose rounding order varies run to
//! run; training here must be deterministic.)
//!
//! Tiles the causal and window rules rule out are skipped (the key ranges grow with the
//! query row, so the visible keys of a query block are contiguous); the mask is applied
//! only to tiles a rule cuts through. Masks come from the same [`Scorer`] as the
//! forward, and the products from [`micro`].
//!
//! dbias (a learnable dense bias `[Bm, Hm, T, S]`): the tasks keep every head's dS in a
//! `[B, H, T, S]` buffer, which is then summed over the axes the bias is broadcast along,
//! in a fixed order (the bias gradient is T×S anyway).

use crate::ops::disjoint::Disjoint;
use rayon::prelude::*;

use super::super::micro::{self, MulAcc, Scores, Strided, PANEL};
use super::super::output::AttentionOutput;
use super::super::panels::{Panels, Rows};
use super::super::spec::{softcap_backward, Dims, Scorer};
use super::super::view::HeadsView;
use super::grads::AttentionGrads;
use crate::tensor::Tensor;

const BLOCK_Q: usize = 64;
const BLOCK_K: usize = 128;

/// Per-thread working space, allocated once per rayon worker and reused across tasks.
struct Scratch {
    /// [BLOCK_Q, BLOCK_K]: P of the current tile
    p: Vec<f32>,
    /// [BLOCK_Q, BLOCK_K]: dP, then dS, of the current tile
    ds: Vec<f32>,
    /// [BLOCK_Q, BLOCK_K]: the tile's scaled scores before a soft cap (empty without one)
    raw: Vec<f32>,
    /// [BLOCK_Q, D]: dQ of the current query block
    dq: Vec<f32>,
    /// [BLOCK_Q, D] and [BLOCK_Q, Dv]: the query block's rows of Q and dO, contiguous.
    /// In place, rows lie H·D floats apart, and at common sizes (a multiple of 1 KiB)
    /// a block's rows fall into a handful of L1 sets, so every row group of dSᵀ·Q and
    /// Pᵀ·dO would read them again from L2.
    q_rows: Vec<f32>,
    do_rows: Vec<f32>,
    /// [S, D] and [S, Dv]: dK and dV of the task's key/value head
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// q: [B,T,H,D], k: [B,S,G,D], v: [B,S,G,Dv], d_out: [B,T,H,Dv] (validated), with the
/// forward's out [B,T,H,Dv] and lse [B,H,T].
pub(super) fn backward(
    [q, k, v, d_out]: [&HeadsView; 4],
    fwd: &AttentionOutput,
    scorer: &Scorer,
    dbias_shape: Option<[usize; 4]>,
) -> AttentionGrads {
    let dims = scorer.dims;
    let (t, s, h_n, g_n, d, dv) = (dims.t, dims.s, dims.h, dims.g, dims.d, dims.dv);
    let group = h_n / g_n;

    // D_i = rowsum(dO ∘ O) per (b, h, i), laid out like lse.
    let mut delta = vec![0.0f32; dims.b * h_n * t];
    let out = fwd.out.data();
    delta.par_chunks_mut(t).enumerate().for_each(|(bh, d_bh)| {
        let (b, h) = (bh / h_n, bh % h_n);
        for (i, x) in d_bh.iter_mut().enumerate() {
            let o = &out[((b * t + i) * h_n + h) * dv..][..dv];
            *x = d_out
                .vector(b, i, h)
                .iter()
                .zip(o)
                .map(|(a, c)| a * c)
                .sum();
        }
    });
    let keys = Panels::new(k);
    let values = Panels::new(v);
    // K as contiguous rows for dQ = dS·K, for the same reason as `Scratch::q_rows`
    let key_rows = Rows::new(k);
    let lse = fwd.lse.data();

    let mut dq = Tensor::zeros(&[dims.b, t, h_n, d]);
    let mut dk = Tensor::zeros(&[dims.b, s, g_n, d]);
    let mut dv_grad = Tensor::zeros(&[dims.b, s, g_n, dv]);
    // every head's dS, when the bias gradient is asked for
    let mut ds_all = dbias_shape.map(|_| vec![0.0f32; dims.b * h_n * t * s]);
    let (dq_w, dk_w, dv_w) = (
        Disjoint::new(dq.data_mut()),
        Disjoint::new(dk.data_mut()),
        Disjoint::new(dv_grad.data_mut()),
    );
    let ds_w = ds_all.as_mut().map(|x| Disjoint::new(x));

    (0..dims.b * g_n).into_par_iter().for_each_init(
        || Scratch {
            p: vec![0.0; BLOCK_Q * BLOCK_K],
            ds: vec![0.0; BLOCK_Q * BLOCK_K],
            raw: vec![
                0.0;
                if scorer.softcap().is_some() {
                    BLOCK_Q * BLOCK_K
                } else {
                    0
                }
            ],
            dq: vec![0.0; BLOCK_Q * d],
            q_rows: vec![0.0; BLOCK_Q * d],
            do_rows: vec![0.0; BLOCK_Q * dv],
            dk: vec![0.0; s * d],
            dv: vec![0.0; s * dv],
        },
        |sc, task| {
            let (b, g) = (task / g_n, task % g_n);
            sc.dk.fill(0.0);
            sc.dv.fill(0.0);
            for h in g * group..(g + 1) * group {
                for i0 in (0..t).step_by(BLOCK_Q) {
                    let rows = BLOCK_Q.min(t - i0);
                    sc.dq[..rows * d].fill(0.0);
                    for r in 0..rows {
                        sc.q_rows[r * d..(r + 1) * d].copy_from_slice(q.vector(b, i0 + r, h));
                        sc.do_rows[r * dv..(r + 1) * dv].copy_from_slice(d_out.vector(
                            b,
                            i0 + r,
                            h,
                        ));
                    }
                    // SAFETY: task (b, g) alone owns dS[b, h, i0..i0+rows, :] for its h.
                    let ds_rows = ds_w
                        .as_ref()
                        .map(|w| unsafe { w.range(((b * h_n + h) * t + i0) * s, rows * s) });
                    let blk = Block { b, h, g, i0, rows };
                    let panels = (&keys, &values, &key_rows);
                    query_block(&blk, scorer, lse, &delta, panels, sc, ds_rows);
                    for r in 0..rows {
                        // SAFETY: only this task writes dq[b, i, h, :] for its heads h.
                        let dst = unsafe { dq_w.range(((b * t + i0 + r) * h_n + h) * d, d) };
                        for (o, &x) in dst.iter_mut().zip(&sc.dq[r * d..(r + 1) * d]) {
                            // dQ = scale·dS·K, from (1) S = scale·Q·Kᵀ
                            *o = scorer.scale * x;
                        }
                    }
                }
            }
            for j in 0..s {
                // SAFETY: task (b, g) alone owns dk[b, :, g, :] and dv[b, :, g, :].
                let (dk_j, dv_j) = unsafe {
                    (
                        dk_w.range(((b * s + j) * g_n + g) * d, d),
                        dv_w.range(((b * s + j) * g_n + g) * dv, dv),
                    )
                };
                // dK = scale·dSᵀ·Q, from (1)
                for (o, &x) in dk_j.iter_mut().zip(&sc.dk[j * d..(j + 1) * d]) {
                    *o = scorer.scale * x;
                }
                dv_j.copy_from_slice(&sc.dv[j * dv..(j + 1) * dv]);
            }
        },
    );
    let dbias = dbias_shape
        .zip(ds_all)
        .map(|(shape, ds)| sum_to_bias(&ds, dims, shape));
    AttentionGrads {
        dq,
        dk,
        dv: dv_grad,
        dbias,
    }
}

/// Which query rows of which head, against which key/value head.
struct Block {
    b: usize,
    h: usize,
    g: usize,
    i0: usize,
    rows: usize,
}

/// The tiles of one query block against every key block its rows may see: adds its
/// unscaled dQ into `sc.dq` and its key blocks' dK (unscaled) and dV into `sc.dk`,
/// `sc.dv`; writes dS into `ds_rows` (`[rows, S]`) when the bias gradient is asked for.
/// The block's rows of Q and dO are in `sc.q_rows` and `sc.do_rows`.
#[allow(clippy::too_many_arguments)]
fn query_block(
    blk: &Block,
    scorer: &Scorer,
    lse: &[f32],
    delta: &[f32],
    (keys, values, key_rows): (&Panels, &Panels, &Rows),
    sc: &mut Scratch,
    mut ds_rows: Option<&mut [f32]>,
) {
    let dims = scorer.dims;
    let kernels = micro::Kernels::detect();
    let (h_n, d, dv) = (dims.h, dims.d, dims.dv);
    let Block { b, h, g, i0, rows } = *blk;
    let row0 = (b * h_n + h) * dims.t + i0;
    let (lo, hi_first) = scorer.key_range(i0);
    let (lo_last, hi) = scorer.key_range(i0 + rows - 1);
    let (q_blk, do_blk) = (&sc.q_rows[..], &sc.do_rows[..]);
    let mut j0 = lo - lo % PANEL;
    while j0 < hi {
        let cols = BLOCK_K.min(hi - j0);
        let panels = cols.div_ceil(PANEL);
        // (1) S = scale·Q·Kᵀ (+ bias and masks), recomputed
        let k_panels = keys.from(b, g, j0);
        kernels.scores(Scores {
            q: q_blk,
            q_stride: d,
            rows,
            d,
            kp: k_panels,
            panels,
            scale: scorer.scale,
            out: &mut sc.p,
            out_stride: BLOCK_K,
        });
        // (2) P = exp(S − lse): the softmax, normalised by the forward's saved sum
        let whole = j0 >= lo_last && j0 + cols <= hi_first && !scorer.needs_row_pass();
        for r in 0..rows {
            let row = &mut sc.p[r * BLOCK_K..r * BLOCK_K + cols];
            if !sc.raw.is_empty() {
                sc.raw[r * BLOCK_K..r * BLOCK_K + cols].copy_from_slice(row);
            }
            match whole {
                true => scorer.cap_row(row),
                false => scorer.apply_row(b, h, i0 + r, j0, row),
            }
            kernels.exp_shift(row, lse[row0 + r]);
        }
        // dP = dO·Vᵀ, from (3) O = P·V
        let v_panels = values.from(b, g, j0);
        kernels.scores(Scores {
            q: do_blk,
            q_stride: dv,
            rows,
            d: dv,
            kp: v_panels,
            panels,
            scale: 1.0,
            out: &mut sc.ds,
            out_stride: BLOCK_K,
        });
        // dS = P∘(dP − D), from (2)
        for r in 0..rows {
            let dl = delta[row0 + r];
            let p_row = &sc.p[r * BLOCK_K..r * BLOCK_K + cols];
            let ds_row = &mut sc.ds[r * BLOCK_K..r * BLOCK_K + cols];
            for (x, &pij) in ds_row.iter_mut().zip(p_row) {
                *x = pij * (*x - dl);
            }
        }
        // dbias = dS, from (1) S = cap(…) + bias
        if let Some(dst) = ds_rows.as_deref_mut() {
            for r in 0..rows {
                dst[r * dims.s + j0..r * dims.s + j0 + cols]
                    .copy_from_slice(&sc.ds[r * BLOCK_K..r * BLOCK_K + cols]);
            }
        }
        // dS of the raw scores, through the cap: cap·tanh(s/cap)
        if let Some(cap) = scorer.softcap() {
            for r in 0..rows {
                let span = r * BLOCK_K..r * BLOCK_K + cols;
                softcap_backward(cap, &sc.raw[span.clone()], &mut sc.ds[span]);
            }
        }
        let p_t = Strided {
            data: &sc.p,
            row: 1,
            col: BLOCK_K,
        };
        let ds_t = Strided {
            data: &sc.ds,
            row: 1,
            col: BLOCK_K,
        };
        let ds = Strided {
            data: &sc.ds,
            row: BLOCK_K,
            col: 1,
        };
        // dV_blk += Pᵀ·dO, from (3)
        let dv_blk = &mut sc.dv[j0 * dv..];
        kernels.mul_acc(MulAcc {
            a: p_t,
            m: cols,
            k: rows,
            b: do_blk,
            b_stride: dv,
            n: dv,
            corr: None,
            acc: dv_blk,
            acc_stride: dv,
        });
        // dK_blk += dSᵀ·Q and dQ += dS·K (both times scale, applied at the end), from (1)
        kernels.mul_acc(MulAcc {
            a: ds_t,
            m: cols,
            k: rows,
            b: q_blk,
            b_stride: d,
            n: d,
            corr: None,
            acc: &mut sc.dk[j0 * d..],
            acc_stride: d,
        });
        let k_blk = key_rows.from(b, g, j0);
        kernels.mul_acc(MulAcc {
            a: ds,
            m: rows,
            k: cols,
            b: k_blk,
            b_stride: d,
            n: d,
            corr: None,
            acc: &mut sc.dq,
            acc_stride: d,
        });
        j0 += cols;
    }
}

/// The bias gradient `[Bm, Hm, T, S]` from every head's dS `[B, H, T, S]`: summed over
/// the batch rows and heads the bias is broadcast along, in a fixed order.
fn sum_to_bias(ds: &[f32], dims: Dims, shape: [usize; 4]) -> Tensor {
    let [bm, hm, t, s] = shape;
    let mut out = Tensor::zeros(&shape);
    for b in 0..dims.b {
        for h in 0..dims.h {
            let src = &ds[(b * dims.h + h) * t * s..][..t * s];
            let (ob, oh) = (if bm == 1 { 0 } else { b }, if hm == 1 { 0 } else { h });
            let dst = &mut out.data_mut()[(ob * hm + oh) * t * s..][..t * s];
            for (o, x) in dst.iter_mut().zip(src) {
                *o += x;
            }
        }
    }
    out
}
