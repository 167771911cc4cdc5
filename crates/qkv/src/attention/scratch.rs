//! What a task of the tiled kernels ([`super::tiled`], [`super::tiled_bf16`]) works in:
//! the key block's width, the rows a task takes and the per-thread buffers.

use std::cell::RefCell;

use crate::ops::aligned::AlignedBuf;

/// Keys per block (a whole number of panels).
pub(super) const BLOCK_K: usize = 128;

/// The query rows one task computes: rows `i0..i0 + rows` of head h in batch b.
#[derive(Clone, Copy, Debug)]
pub(super) struct QueryRows {
    pub b: usize,
    pub h: usize,
    pub i0: usize,
    pub rows: usize,
}

/// Per-thread working space, kept by each thread between tasks and calls
/// ([`Scratch::with`]); `rows` query rows a task.
pub(super) struct Scratch {
    /// [rows, BLOCK_K] scores, then probabilities
    pub tile: AlignedBuf,
    /// [rows, Dv]
    pub acc: AlignedBuf,
    /// [rows] running max, sum, and this block's rescale factor
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    pub corr: Vec<f32>,
    /// [rows, D] the block's query rows, contiguous (the bf16 products only)
    pub q_rows: Vec<f32>,
}

thread_local! {
    /// This thread's scratch, between tasks.
    static KEPT: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

impl Scratch {
    /// Space for `rows` query rows of `dv` output columns, with room for their `q_dim`
    /// query columns (0: none).
    fn new(rows: usize, dv: usize, q_dim: usize) -> Self {
        Scratch {
            tile: AlignedBuf::zeros(rows * BLOCK_K),
            acc: AlignedBuf::zeros(rows * dv),
            m: vec![0.0; rows],
            l: vec![0.0; rows],
            corr: vec![0.0; rows],
            q_rows: vec![0.0; rows * q_dim],
        }
    }

    /// Runs `f` on this thread's scratch for these sizes ([`Scratch::new`]'s), made
    /// only when the thread has none of them. A task writes every element it reads
    /// back, so what an earlier task left needs no clearing. The scratch is taken
    /// out of its slot for the call: a nested call on the same thread makes its own.
    pub(super) fn with<R>(
        (rows, dv, q_dim): (usize, usize, usize),
        f: impl FnOnce(&mut Scratch) -> R,
    ) -> R {
        let fits = |s: &Scratch| {
            s.m.len() == rows && s.acc.len() == rows * dv && s.q_rows.len() == rows * q_dim
        };
        let mut scratch = match KEPT.with(|k| k.borrow_mut().take()) {
            Some(s) if fits(&s) => s,
            _ => Scratch::new(rows, dv, q_dim),
        };
        let result = f(&mut scratch);
        KEPT.with(|k| *k.borrow_mut() = Some(scratch));
        result
    }
}
