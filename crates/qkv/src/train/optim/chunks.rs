//! How the elementwise passes over a tensor (the update, the gradient norms) split it
//! over the pool.

/// Elements per rayon task in the elementwise update; small tensors run inline.
pub(super) const PAR_CHUNK: usize = 1 << 15;
