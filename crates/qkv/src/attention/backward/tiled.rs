//! The FlashAttention-2 backward on tiles: nothing T×S is ever stored. Each tile of
//! query rows i0..i0+rows against keys j0..j0+cols recomputes its scores and
//! P = exp(S − lse) from the log-sum-exp the forward saved, so the softmax needs no
//! second sweep; with D_i = rowsum(dO_i ∘ O_i), computed once per row from the saved
//! output, every tile's dS = P∘(dP − D) is local to the tile.
//!
//! dK and dV are sums over query rows, dQ a sum over keys, so no one loop order owns
//! all three. Two passes, each writing only what it owns:
//!
//! - pass A, parallel over (batch, key/value head, key block): the task keeps the
//!   block's dK and dV in scratch, loops over the H/G query heads that share the
//!   key/value head (GQA sums happen here, in a fixed order) and over the query blocks
//!   that can see the key block, and writes the block once at the end;
//! - pass B, parallel over (batch, head, query block): recomputes the same tiles and
//!   accumulates dQ = scale·dS·K for its rows (and, when asked, dbias = dS).
//!
//! Why a second pass rather than the alternatives: CUDA's FlashAttention-2 adds dQ with
//! atomics, whose order (and so whose rounding) varies run to run; per-thread dQ buffers
//! have the same problem under rayon's work stealing, and training must be
//! deterministic; per-task partial dQ buffers cost (S / BLOCK_K)·|Q| memory, gigabytes
//! at long S. Recomputing S and dP in pass B costs two tile products of the five, and
//! the result is bit-identical for any thread count, with O(tile) extra memory.
//!
//! Both passes skip tiles the causal and window rules rule out (their key ranges grow
//! with the query row, so the visible rows of a key block and the visible keys of a
//! query block are contiguous). Masks come from the same [`Scorer`] as the forward.
//!
//! dbias (a learnable dense bias `[Bm, Hm, T, S]`): pass B then runs one task per
//! (bias batch row, bias head, query block), looping over the batch rows and heads that
//! share that slice of the bias, so the broadcast sum is owned by one task, ordered, and
//! still nothing T×S is materialised beyond the bias gradient itself.

use crate::attention::disjoint::Disjoint;
use rayon::prelude::*;

use super::super::spec::Scorer;
use super::super::{AttentionOutput, HeadsView};
use super::AttentionGrads;
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::tensor::Tensor;

const BLOCK_Q: usize = 32;
const BLOCK_K: usize = 64;

/// Per-thread working space, allocated once per rayon worker and reused across tasks.
struct Scratch {
    /// [BLOCK_Q, BLOCK_K]: P of the current tile
    p: Vec<f32>,
    /// [BLOCK_Q, BLOCK_K]: dP, then dS, of the current tile
    ds: Vec<f32>,
    /// pass A: [BLOCK_K, D] dK of the key block; pass B: [BLOCK_Q, D] dQ of the rows
    acc: Vec<f32>,
    /// pass A: [BLOCK_K, Dv] dV of the key block
    acc_v: Vec<f32>,
}

/// `len` consecutive positions of head `n` in batch row `b`, from position `l0`:
/// a `len × E` matrix read in place (row stride N·E).
fn block<'v>(x: &HeadsView<'v>, b: usize, l0: usize, n: usize, len: usize) -> MatRef<'v> {
    MatRef {
        data: &x.data[x.offset(b, l0, n)..],
        rows: len,
        cols: x.dim,
        row_stride: x.heads * x.dim,
        col_stride: 1,
    }
}

/// A `rows × cols` tile at the start of a `[BLOCK_Q, BLOCK_K]` buffer.
fn tile(data: &[f32], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        data,
        rows,
        cols,
        row_stride: BLOCK_K,
        col_stride: 1,
    }
}

fn tile_mut(data: &mut [f32], rows: usize, cols: usize) -> MatMut<'_> {
    MatMut {
        data,
        rows,
        cols,
        row_stride: BLOCK_K,
        col_stride: 1,
    }
}

/// First index in 0..n where `pred` turns false (`pred` holds on a prefix).
fn partition(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// What every tile reads.
struct Ctx<'a> {
    q: &'a HeadsView<'a>,
    k: &'a HeadsView<'a>,
    v: &'a HeadsView<'a>,
    d_out: &'a HeadsView<'a>,
    scorer: &'a Scorer<'a>,
    /// [B, H, T] saved by the forward
    lse: &'a [f32],
    /// [B, H, T]: D_i = Σ_c dO_ic·O_ic
    delta: &'a [f32],
}

impl Ctx<'_> {
    /// For query rows i0..i0+rows of head h against keys j0..j0+cols of batch row b,
    /// leaves P in `p` and dS in `ds` (both `[rows, cols]` with row stride BLOCK_K).
    #[allow(clippy::too_many_arguments)]
    fn tile(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        rows: usize,
        j0: usize,
        cols: usize,
        p: &mut [f32],
        ds: &mut [f32],
    ) {
        let dims = self.scorer.dims;
        let g = dims.kv_head(h);
        let row0 = (b * dims.h + h) * dims.t + i0;
        // (1) S = scale·Q·Kᵀ (+ bias and masks below), recomputed.
        gemm(
            tile_mut(p, rows, cols),
            block(self.q, b, i0, h, rows),
            block(self.k, b, j0, g, cols).t(),
            self.scorer.scale,
            false,
            Par::Single,
        );
        // (2) P = exp(S − lse): the softmax, normalised by the forward's saved sum.
        for r in 0..rows {
            let row = &mut p[r * BLOCK_K..r * BLOCK_K + cols];
            self.scorer.apply_row(b, h, i0 + r, j0, row);
            let l = self.lse[row0 + r];
            if l == f32::NEG_INFINITY {
                // Fully masked row: output zeros, no gradient.
                row.fill(0.0);
            } else {
                for x in row.iter_mut() {
                    *x = (*x - l).exp();
                }
            }
        }
        // dP = dO·Vᵀ, from (3) O = P·V.
        gemm(
            tile_mut(ds, rows, cols),
            block(self.d_out, b, i0, h, rows),
            block(self.v, b, j0, g, cols).t(),
            1.0,
            false,
            Par::Single,
        );
        // dS = P∘(dP − D), from (2).
        for r in 0..rows {
            let dl = self.delta[row0 + r];
            let p_row = &p[r * BLOCK_K..r * BLOCK_K + cols];
            let ds_row = &mut ds[r * BLOCK_K..r * BLOCK_K + cols];
            for (x, &pij) in ds_row.iter_mut().zip(p_row) {
                *x = pij * (*x - dl);
            }
        }
    }
}

/// q: [B,T,H,D], k: [B,S,G,D], v: [B,S,G,Dv], d_out: [B,T,H,Dv] (validated), with the
/// forward's out [B,T,H,Dv] and lse [B,H,T].
pub(super) fn backward(
    q: &HeadsView,
    k: &HeadsView,
    v: &HeadsView,
    fwd: &AttentionOutput,
    d_out: &HeadsView,
    scorer: &Scorer,
    dbias_shape: Option<[usize; 4]>,
) -> AttentionGrads {
    let dims = scorer.dims;
    let (t, h_n, dv) = (dims.t, dims.h, dims.dv);

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

    let ctx = Ctx {
        q,
        k,
        v,
        d_out,
        scorer,
        lse: fwd.lse.data(),
        delta: &delta,
    };
    let (dk, dv_grad) = pass_a(&ctx);
    let (dq, dbias) = pass_b(&ctx, dbias_shape);
    AttentionGrads {
        dq,
        dk,
        dv: dv_grad,
        dbias,
    }
}

/// dK and dV, one task per (batch, key/value head, key block).
fn pass_a(ctx: &Ctx) -> (Tensor, Tensor) {
    let dims = ctx.scorer.dims;
    let (t, s, h_n, g_n, d, dv) = (dims.t, dims.s, dims.h, dims.g, dims.d, dims.dv);
    let group = h_n / g_n;
    let n_kblocks = s.div_ceil(BLOCK_K);
    let mut dk = Tensor::zeros(&[dims.b, s, g_n, d]);
    let mut dv_grad = Tensor::zeros(&[dims.b, s, g_n, dv]);
    let dk_w = Disjoint::new(dk.data_mut());
    let dv_w = Disjoint::new(dv_grad.data_mut());

    (0..dims.b * g_n * n_kblocks).into_par_iter().for_each_init(
        || Scratch {
            p: vec![0.0; BLOCK_Q * BLOCK_K],
            ds: vec![0.0; BLOCK_Q * BLOCK_K],
            acc: vec![0.0; BLOCK_K * d],
            acc_v: vec![0.0; BLOCK_K * dv],
        },
        |sc, task| {
            let (bg, kb) = (task / n_kblocks, task % n_kblocks);
            let (b, g) = (bg / g_n, bg % g_n);
            let j0 = kb * BLOCK_K;
            let cols = BLOCK_K.min(s - j0);
            // Query rows that may see a key in j0..j0+cols: those whose range ends after
            // j0 and starts before j0 + cols, a contiguous run since both bounds grow.
            let ia = partition(t, |i| ctx.scorer.key_range(i).1 <= j0);
            let ib = partition(t, |i| ctx.scorer.key_range(i).0 < j0 + cols);
            sc.acc[..cols * d].fill(0.0);
            sc.acc_v[..cols * dv].fill(0.0);
            for h in g * group..(g + 1) * group {
                let mut i0 = ia;
                while i0 < ib {
                    let rows = BLOCK_Q.min(ib - i0);
                    ctx.tile(b, h, i0, rows, j0, cols, &mut sc.p, &mut sc.ds);
                    // dV_blk += Pᵀ·dO, from (3) O = P·V.
                    gemm(
                        MatMut::row_major(&mut sc.acc_v[..cols * dv], cols, dv),
                        tile(&sc.p, rows, cols).t(),
                        block(ctx.d_out, b, i0, h, rows),
                        1.0,
                        true,
                        Par::Single,
                    );
                    // dK_blk += scale·dSᵀ·Q, from (1) S = scale·Q·Kᵀ.
                    gemm(
                        MatMut::row_major(&mut sc.acc[..cols * d], cols, d),
                        tile(&sc.ds, rows, cols).t(),
                        block(ctx.q, b, i0, h, rows),
                        ctx.scorer.scale,
                        true,
                        Par::Single,
                    );
                    i0 += rows;
                }
            }
            for c in 0..cols {
                let j = j0 + c;
                // SAFETY: task (b, g, kb) alone owns dk[b, j0..j0+cols, g, :] and the
                // same rows of dv; each row slice is taken once.
                unsafe {
                    dk_w.range(((b * s + j) * g_n + g) * d, d)
                        .copy_from_slice(&sc.acc[c * d..(c + 1) * d]);
                    dv_w.range(((b * s + j) * g_n + g) * dv, dv)
                        .copy_from_slice(&sc.acc_v[c * dv..(c + 1) * dv]);
                }
            }
        },
    );
    (dk, dv_grad)
}

/// dQ (and dbias), one task per (batch group, head group, query block): a group is a
/// single batch row or head, except that the batch rows (heads) a dense bias is
/// broadcast over form one group when its gradient is asked for.
fn pass_b(ctx: &Ctx, dbias_shape: Option<[usize; 4]>) -> (Tensor, Option<Tensor>) {
    let dims = ctx.scorer.dims;
    let (t, s, h_n, d) = (dims.t, dims.s, dims.h, dims.d);
    let n_qblocks = t.div_ceil(BLOCK_Q);
    // Number of groups along batch and heads (= the bias's extent when it is asked for).
    let (nb, nh) = match dbias_shape {
        Some([bm, hm, _, _]) => (bm, hm),
        None => (dims.b, h_n),
    };
    let (per_b, per_h) = (dims.b / nb, h_n / nh);
    let mut dq = Tensor::zeros(&[dims.b, t, h_n, d]);
    let mut dbias = dbias_shape.map(|shape| Tensor::zeros(&shape));
    let dq_w = Disjoint::new(dq.data_mut());
    let db_w = dbias.as_mut().map(|x| Disjoint::new(x.data_mut()));

    (0..nb * nh * n_qblocks).into_par_iter().for_each_init(
        || Scratch {
            p: vec![0.0; BLOCK_Q * BLOCK_K],
            ds: vec![0.0; BLOCK_Q * BLOCK_K],
            acc: vec![0.0; BLOCK_Q * d],
            acc_v: Vec::new(),
        },
        |sc, task| {
            let (grp, qb) = (task / n_qblocks, task % n_qblocks);
            let (bi, hi) = (grp / nh, grp % nh);
            let i0 = qb * BLOCK_Q;
            let rows = BLOCK_Q.min(t - i0);
            // SAFETY: task (bi, hi, qb) alone owns dbias[bi, hi, i0..i0+rows, :].
            let mut db_rows = db_w
                .as_ref()
                .map(|w| unsafe { w.range(((bi * nh + hi) * t + i0) * s, rows * s) });
            // Keys any row of the block may see (ranges grow with the row).
            let lo = ctx.scorer.key_range(i0).0;
            let hi_key = ctx.scorer.key_range(i0 + rows - 1).1;
            for b in bi * per_b..(bi + 1) * per_b {
                for h in hi * per_h..(hi + 1) * per_h {
                    let g = dims.kv_head(h);
                    sc.acc[..rows * d].fill(0.0);
                    let mut j0 = lo;
                    while j0 < hi_key {
                        let cols = BLOCK_K.min(hi_key - j0);
                        ctx.tile(b, h, i0, rows, j0, cols, &mut sc.p, &mut sc.ds);
                        // dQ_blk += scale·dS·K, from (1) S = scale·Q·Kᵀ.
                        gemm(
                            MatMut::row_major(&mut sc.acc[..rows * d], rows, d),
                            tile(&sc.ds, rows, cols),
                            block(ctx.k, b, j0, g, cols),
                            ctx.scorer.scale,
                            true,
                            Par::Single,
                        );
                        // dbias += dS, from (1) S = … + bias.
                        if let Some(db) = db_rows.as_deref_mut() {
                            for r in 0..rows {
                                let dst = &mut db[r * s + j0..r * s + j0 + cols];
                                for (a, x) in dst.iter_mut().zip(&sc.ds[r * BLOCK_K..]) {
                                    *a += x;
                                }
                            }
                        }
                        j0 += cols;
                    }
                    for r in 0..rows {
                        // SAFETY: only this task writes dq[b, i0..i0+rows, h, :]
                        // (b and h belong to its groups alone); each row slice is
                        // taken once.
                        unsafe {
                            dq_w.range(((b * t + i0 + r) * h_n + h) * d, d)
                                .copy_from_slice(&sc.acc[r * d..(r + 1) * d]);
                        }
                    }
                }
            }
        },
    );
    (dq, dbias)
}
