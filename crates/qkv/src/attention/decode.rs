//! Flash-decoding: a few query rows (one decode step, or a short draft) against a long
//! key/value cache. The tiled kernel's tasks are query blocks, so one query row would
//! give one task per head and a cache read by as many tasks as there are heads; here
//! the keys are split instead:
//!
//! - a task is (batch row b, key head g, a split of [`SPLIT`] keys). It scores every
//!   query row i < T of the H/G query heads that share g against its keys, reading
//!   each key and value once for the whole group, and keeps the split's own softmax
//!   state: max m, sum l = Σ e^(s − m) and unnormalised output acc = Σ e^(s − m)·v;
//! - then each (b, h, i) merges its splits: M = max m, L = Σ l·e^(m − M),
//!   out = Σ acc·e^(m − M) / L, and the log-sum-exp is M + ln L.
//!
//! Keys are read in place (no packing), so a step reads the cache exactly once. The
//! split size is fixed, so results do not depend on the number of threads. Tasks are
//! numbered (b, g, split) and claimed in that order by the thread team
//! ([`for_each_task`]): tasks taken one after another go on along one head's run of
//! the cache, which the cache stores heads-major ([B, G, cap, D]) so that a task's keys
//! are one contiguous block. (With a positions-major cache, (b, split, g) had been
//! 1.11× at S = 32768 on an AVX-512 Xeon; heads-major, the order measured level on a
//! Zen 3.)

use std::cell::Cell;
use std::sync::Mutex;

use super::micro::{self, Dots, MulAcc, SoftmaxRows, Strided};
use super::spec::Scorer;
use super::view::HeadsView;
use crate::ops::for_each_task;
use crate::tensor::Tensor;

/// Query rows up to this many take this path.
pub(super) const MAX_ROWS: usize = 4;
/// Keys per task: enough work to amortise a task (a 128-wide head: 64K multiply-adds
/// per query row), few enough that a 512-key cache of 8 key heads gives 8 tasks.
const SPLIT: usize = 512;

/// Keys per step of a split's online softmax (see `one_split`).
const KEY_BLOCK: usize = 32;

/// A task's working space, kept by each thread between tasks and decoding steps
/// (`KEPT`): `one_split` sizes it and writes every element before it reads it.
#[derive(Default)]
struct Scratch {
    /// [H/G, KEY_BLOCK] scores, then probabilities
    scores: Vec<f32>,
    /// [H/G] rescale factors of the accumulated output
    corr: Vec<f32>,
}

thread_local! {
    /// This thread's scratch between tasks (its vectors keep their capacity).
    static KEPT: Cell<Scratch> = Cell::default();
}

/// Keys or values as a decode step reads them, in place: f32, or a bf16 cache's bit
/// patterns, which the kernels widen in the registers they load into (a shift each, so
/// exact). The cache's traffic is what halves; the arithmetic is the f32 kernels'.
#[derive(Clone, Copy)]
pub(super) enum KvRows<'a> {
    F32(&'a HeadsView<'a>),
    Bf16(&'a HeadsView<'a, u16>),
}

impl KvRows<'_> {
    /// Asks for rows `keys` of head g in batch row b ahead of their use.
    fn prefetch(&self, (b, g): (usize, usize), keys: std::ops::Range<usize>) {
        match self {
            KvRows::F32(v) => {
                let start = v.offset(b, keys.start, g);
                prefetch_rows(v.data, start, keys.len(), v.pos_stride, v.dim)
            }
            KvRows::Bf16(v) => {
                let start = v.offset(b, keys.start, g);
                prefetch_rows(v.data, start, keys.len(), v.pos_stride, v.dim)
            }
        }
    }
}

/// One split's softmax state for one (query row, head): running max and sum.
#[derive(Clone, Copy)]
struct State {
    m: f32,
    l: f32,
}

/// q: [B,T,H,D], k: [B,S,G,D], v: [B,S,G,Dv] (validated, T ≤ [`MAX_ROWS`]) →
/// out [B,T,H,Dv], lse [B,H,T].
pub(super) fn attention(q: &HeadsView, k: KvRows, v: KvRows, scorer: &Scorer) -> (Tensor, Tensor) {
    let dims = scorer.dims;
    let (b_n, t, s, h_n, g_n, dv) = (dims.b, dims.t, dims.s, dims.h, dims.g, dims.dv);
    let hg = h_n / g_n;
    let splits = s.div_ceil(SPLIT).max(1);
    // per task: T·(H/G) rows of state and of acc, row r = i·(H/G) + head within group
    let rows = t * hg;
    let tasks = b_n * splits * g_n;
    let mut states = vec![
        State {
            m: f32::NEG_INFINITY,
            l: 0.0
        };
        tasks * rows
    ];
    let mut accs = vec![0.0f32; tasks * rows * dv];
    // each task's own rows of state and of acc, locked once by that task alone
    let parts: Vec<Mutex<(&mut [State], &mut [f32])>> = states
        .chunks_mut(rows)
        .zip(accs.chunks_mut(rows * dv))
        .map(Mutex::new)
        .collect();
    for_each_task(tasks, |task| {
        let (b, g, split) = (task / (splits * g_n), task / splits % g_n, task % splits);
        let keys = split * SPLIT..s.min((split + 1) * SPLIT);
        let mut part = parts[task].lock().unwrap_or_else(|e| e.into_inner());
        let (state, acc) = &mut *part;
        // taken out of its slot for the call: a nested call on this thread makes its own
        let mut scratch = KEPT.take();
        one_split(q, [k, v], scorer, (b, g), keys, &mut scratch, state, acc);
        KEPT.set(scratch);
    });
    drop(parts);

    let mut out = Tensor::zeros(&[b_n, t, h_n, dv]);
    let mut lse = Tensor::zeros(&[b_n, h_n, t]);
    let lse_data = lse.data_mut();
    for (bti, o_row) in out.data_mut().chunks_exact_mut(h_n * dv).enumerate() {
        let (b, i) = (bti / t, bti % t);
        for (h, o) in o_row.chunks_exact_mut(dv).enumerate() {
            let (g, r) = (h / hg, i * hg + h % hg);
            let parts = (0..splits).map(|sp| (b * g_n + g) * splits + sp);
            let big_m = parts
                .clone()
                .map(|p| states[p * rows + r].m)
                .fold(f32::NEG_INFINITY, f32::max);
            let lse_at = &mut lse_data[(b * h_n + h) * t + i];
            if big_m == f32::NEG_INFINITY {
                // every key masked: zeros out, −∞ log-sum-exp (as the other kernels)
                *lse_at = f32::NEG_INFINITY;
                continue;
            }
            let mut big_l = 0.0;
            for p in parts {
                let st = states[p * rows + r];
                if st.l == 0.0 {
                    continue;
                }
                let w = (st.m - big_m).exp();
                big_l += st.l * w;
                for (oc, ac) in o.iter_mut().zip(&accs[(p * rows + r) * dv..][..dv]) {
                    *oc += w * ac;
                }
            }
            let inv = 1.0 / big_l;
            o.iter_mut().for_each(|x| *x *= inv);
            *lse_at = big_m + big_l.ln();
        }
    }
    (out, lse)
}

/// The softmax state and unnormalised output of every query row and head of group g
/// in batch row b over `keys`. `state`/`acc` come in at m = −∞, l = 0, acc = 0.
///
/// Keys go by in blocks of [`KEY_BLOCK`] with the online softmax across blocks. The
/// next block's K and V rows are requested while this block is computed: views laid
/// positions-major hold a key's row as only D floats, a run too short for the hardware
/// prefetcher to get ahead of. (Over the heads-major cache, dropping the requests
/// measured level on a Zen 3: bf16 at S = 32768 1.1× faster, f32 1.05× slower.)
#[allow(clippy::too_many_arguments)]
fn one_split(
    q: &HeadsView,
    [k, v]: [KvRows; 2],
    scorer: &Scorer,
    (b, g): (usize, usize),
    keys: std::ops::Range<usize>,
    scratch: &mut Scratch,
    state: &mut [State],
    acc: &mut [f32],
) {
    let dims = scorer.dims;
    let kernels = micro::Kernels::detect();
    let (h_n, g_n, dv) = (dims.h, dims.g, dims.dv);
    let hg = h_n / g_n;
    scratch.scores.resize(hg * KEY_BLOCK, 0.0);
    scratch.corr.resize(hg, 1.0);
    for i in 0..dims.t {
        let (lo, hi) = scorer.key_range(i);
        let (lo, hi) = (lo.max(keys.start), hi.min(keys.end));
        for j0 in (lo..hi).step_by(KEY_BLOCK) {
            let n = KEY_BLOCK.min(hi - j0);
            let next = j0 + n..hi.min(j0 + n + KEY_BLOCK);
            k.prefetch((b, g), next.clone());
            v.prefetch((b, g), next);
            let scores = &mut scratch.scores[..hg * n];
            let at = (b, i, g, j0);
            match k {
                KvRows::F32(keys) => kernels.dots(query_dots(q, keys, at, n, scorer, scores)),
                KvRows::Bf16(keys) => kernels.dots_bf16(query_dots(q, keys, at, n, scorer, scores)),
            }
            for (x, row) in scores.chunks_exact_mut(n).enumerate() {
                match scorer.needs_row_pass() {
                    true => scorer.apply_row(b, g * hg + x, i, j0, row),
                    false => scorer.cap_row(row),
                }
                let st = &mut state[i * hg + x];
                let (m, l) = (
                    std::slice::from_mut(&mut st.m),
                    std::slice::from_mut(&mut st.l),
                );
                kernels.softmax_rows(SoftmaxRows {
                    tile: row,
                    stride: n,
                    rows: 1,
                    cols: n,
                    m,
                    l,
                    corr: &mut scratch.corr[x..=x],
                });
            }
            // acc = corr·acc + P · V[j0..j0+n]: values read in place, a row every
            // position stride
            let p = Strided {
                data: scores,
                row: n,
                col: 1,
            };
            let acc = &mut acc[i * hg * dv..];
            let rows = (hg, n);
            match v {
                KvRows::F32(values) => kernels.mul_acc(p_times_values(
                    p,
                    values,
                    (b, g, j0),
                    rows,
                    &scratch.corr,
                    acc,
                )),
                KvRows::Bf16(values) => kernels.mul_acc_bf16(p_times_values(
                    p,
                    values,
                    (b, g, j0),
                    rows,
                    &scratch.corr,
                    acc,
                )),
            }
        }
    }
}

/// Asks the CPU to start loading `rows` runs of `len` elements, `stride` apart from
/// `start` in `data`: a hint with no effect on any result; runs past the end of
/// `data` are left out.
fn prefetch_rows<T>(data: &[T], start: usize, rows: usize, stride: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for r in 0..rows {
        let Some(run) = data.get(start + r * stride..start + r * stride + len) else {
            break;
        };
        // into L2, not L1: a block's K and V rows are hundreds of lines, more than L1's
        // fill buffers hold, and a T0 request that finds them full stalls the loop (on
        // the AVX-512 Xeon: S = 512 1.20×, S = 4096 1.05× over T0; T2 was no better)
        for line in run.chunks(64 / std::mem::size_of::<T>()) {
            // SAFETY: a prefetch reads nothing architecturally and cannot fault; the
            // address is inside `data` anyway.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast());
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, start, rows, stride, len);
}

/// The operands of the scores of query row i's H/G heads of group g (`out` holds H/G
/// rows of `n`; in q they lie a head stride apart) against keys `j0..j0 + n` of head g,
/// in batch row b, read in place (a row every position stride), f32 or a bf16 cache's
/// bit patterns.
fn query_dots<'a, T>(
    q: &HeadsView<'a>,
    keys: &HeadsView<'a, T>,
    (b, i, g, j0): (usize, usize, usize, usize),
    n: usize,
    scorer: &Scorer,
    out: &'a mut [f32],
) -> Dots<'a, T> {
    let rows = out.len() / n;
    Dots {
        q: &q.data[q.offset(b, i, g * rows)..],
        q_stride: q.head_stride,
        rows,
        d: q.dim,
        k: &keys.data[keys.offset(b, j0, g)..],
        k_stride: keys.pos_stride,
        n,
        scale: scorer.scale,
        out,
        out_stride: n,
    }
}

/// The operands of acc = corr·acc + P · V for `rows` = (hg query rows, n keys): values
/// from key j0 of head g in batch row b, read in place (a row every position stride),
/// f32 or a bf16 cache's bit patterns.
fn p_times_values<'a, T>(
    p: Strided<'a>,
    values: &HeadsView<'a, T>,
    (b, g, j0): (usize, usize, usize),
    (hg, n): (usize, usize),
    corr: &'a [f32],
    acc: &'a mut [f32],
) -> MulAcc<'a, T> {
    MulAcc {
        a: p,
        m: hg,
        k: n,
        b: &values.data[values.offset(b, j0, g)..],
        b_stride: values.pos_stride,
        n: values.dim,
        corr: Some(corr),
        acc,
        acc_stride: values.dim,
    }
}
