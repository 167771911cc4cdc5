//! The KV cache for incremental decoding: per layer, keys `[B, cap, G, D]` and values
//! `[B, cap, G, Dv]` with `len ≤ cap` positions in use. Capacity doubles when full, so
//! a step copies only its own new rows (the whole cache moves only on the rare growth).
//! Attention reads the first `len` positions in place through [`HeadsView`].

use super::call::run;
use super::output::AttentionOutput;
use super::spec::AttentionSpec;
use super::view::HeadsView;
use crate::batch::{limit_positions, real_positions};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct LayerKv {
    k: Vec<f32>,
    v: Vec<f32>,
    batch: usize,
    heads: usize,
    dk: usize,
    dv: usize,
    len: usize,
    cap: usize,
}

impl LayerKv {
    pub fn new(batch: usize, heads: usize, dk: usize, dv: usize) -> Self {
        LayerKv {
            k: Vec::new(),
            v: Vec::new(),
            batch,
            heads,
            dk,
            dv,
            len: 0,
            cap: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends k: `[B, T, G, Dk]` and v: `[B, T, G, Dv]` after the cached positions.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (b, g) = (self.batch, self.heads);
        k.expect_shape("cached k", &[Some(b), None, Some(g), Some(self.dk)])?;
        let t = k.shape()[1];
        v.expect_shape("cached v", &[Some(b), Some(t), Some(g), Some(self.dv)])?;
        // checked here, once per row, so that attending over the cache need not scan
        // all of it at every step
        k.check_finite("cached k")?;
        v.check_finite("cached v")?;
        if self.len + t > self.cap {
            self.grow((self.len + t).max(2 * self.cap).max(16));
        }
        let (rk, rv) = (g * self.dk, g * self.dv);
        for bi in 0..b {
            let dst = (bi * self.cap + self.len) * rk;
            self.k[dst..dst + t * rk].copy_from_slice(&k.data()[bi * t * rk..(bi + 1) * t * rk]);
            let dst = (bi * self.cap + self.len) * rv;
            self.v[dst..dst + t * rv].copy_from_slice(&v.data()[bi * t * rv..(bi + 1) * t * rv]);
        }
        self.len += t;
        Ok(())
    }

    /// This layer with row i holding this layer's row `rows[i]` (every index < B).
    fn select_rows(&self, rows: &[usize]) -> LayerKv {
        let (rk, rv) = (self.heads * self.dk, self.heads * self.dv);
        let mut k = vec![0.0; rows.len() * self.cap * rk];
        let mut v = vec![0.0; rows.len() * self.cap * rv];
        for (i, &r) in rows.iter().enumerate() {
            k[i * self.cap * rk..][..self.len * rk]
                .copy_from_slice(&self.k[r * self.cap * rk..][..self.len * rk]);
            v[i * self.cap * rv..][..self.len * rv]
                .copy_from_slice(&self.v[r * self.cap * rv..][..self.len * rv]);
        }
        LayerKv {
            k,
            v,
            batch: rows.len(),
            ..*self
        }
    }

    fn grow(&mut self, cap: usize) {
        let (rk, rv) = (self.heads * self.dk, self.heads * self.dv);
        let mut k = vec![0.0; self.batch * cap * rk];
        let mut v = vec![0.0; self.batch * cap * rv];
        for b in 0..self.batch {
            k[b * cap * rk..][..self.len * rk]
                .copy_from_slice(&self.k[b * self.cap * rk..][..self.len * rk]);
            v[b * cap * rv..][..self.len * rv]
                .copy_from_slice(&self.v[b * self.cap * rv..][..self.len * rv]);
        }
        self.k = k;
        self.v = v;
        self.cap = cap;
    }

    /// Attention of q `[B, T, H, Dk]` over the cached keys and values. Every cached
    /// row was checked finite when appended, so unlike [`super::attention_views`]
    /// this does not read the whole cache for that check.
    pub fn attend(&self, q: &HeadsView, spec: &AttentionSpec) -> Result<AttentionOutput> {
        run(q, &self.keys(), &self.values(), spec, false)
    }

    /// Cached keys `[B, len, G, Dk]`.
    pub fn keys(&self) -> HeadsView<'_> {
        self.view(&self.k, self.dk)
    }

    /// Cached values `[B, len, G, Dv]`.
    pub fn values(&self) -> HeadsView<'_> {
        self.view(&self.v, self.dv)
    }

    fn view<'a>(&self, data: &'a [f32], dim: usize) -> HeadsView<'a> {
        HeadsView {
            data,
            batch: self.batch,
            len: self.len,
            heads: self.heads,
            dim,
            batch_stride: self.cap * self.heads * dim,
            pos_stride: self.heads * dim,
            head_stride: dim,
        }
    }
}

/// A whole decoder's cache: one [`LayerKv`] per layer plus which cached positions are
/// real tokens in each batch row.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    batch: usize,
    /// `[B][len]`: `true` where the cached position holds a real token
    real: Vec<Vec<bool>>,
}

/// What one forward step over new tokens needs from the cache's bookkeeping.
#[derive(Clone, Debug)]
pub struct Step {
    /// [B·T] position of each new token among its row's real tokens
    pub positions: Vec<usize>,
    /// [B, past + T]: which keys are real once the new tokens are appended
    pub key_padding: Vec<bool>,
    /// Positions cached before this step.
    pub past: usize,
}

impl KvCache {
    pub fn new(n_layers: usize, batch: usize, kv_heads: usize, dk: usize, dv: usize) -> Self {
        KvCache {
            layers: (0..n_layers)
                .map(|_| LayerKv::new(batch, kv_heads, dk, dv))
                .collect(),
            batch,
            real: vec![Vec::new(); batch],
        }
    }

    /// A cache whose row i is this cache's row `rows[i]`: beam search continues some
    /// beams more than once and drops others.
    pub fn select_rows(&self, rows: &[usize]) -> Result<KvCache> {
        if let Some(&bad) = rows.iter().find(|&&r| r >= self.batch) {
            return Err(Error::invalid(
                "rows",
                format!("row {bad} of a cache of {} rows", self.batch),
            ));
        }
        Ok(KvCache {
            layers: self.layers.iter().map(|l| l.select_rows(rows)).collect(),
            batch: rows.len(),
            real: rows.iter().map(|&r| self.real[r].clone()).collect(),
        })
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.real.first().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Errors unless the cache has one [`LayerKv`] per layer of a model with `layers`
    /// layers (a cache made by another model).
    pub fn check_layers(&self, layers: usize) -> Result<()> {
        if self.layers.len() != layers {
            return Err(Error::invalid(
                "kv cache",
                format!("has {} layers, the model {layers}", self.layers.len()),
            ));
        }
        Ok(())
    }

    /// Records new tokens' mask (`[B, T]`) and returns their positions and the key
    /// padding the layers use for this step. Layers then append their K/V.
    ///
    /// With `max_positions` (a model with a table of positions), every real token must
    /// fall inside it, else the step is rejected with [`Error::OutOfRange`]; padding
    /// positions are clamped into it, so all of [`Step::positions`] index the table. A
    /// rejected step changes nothing: the cache stays usable.
    pub fn begin_step(
        &mut self,
        mask: &[bool],
        t: usize,
        max_positions: Option<usize>,
    ) -> Result<Step> {
        if t == 0 {
            return Err(Error::invalid(
                "attention_mask",
                "a step needs at least one new token",
            ));
        }
        if mask.len() != self.batch * t {
            return Err(Error::Shape {
                tensor: "attention_mask".into(),
                expected: format!("[{}, {t}] for this cache", self.batch),
                got: vec![mask.len()],
            });
        }
        let past = self.len();
        let starts: Vec<usize> = self
            .real
            .iter()
            .map(|row| row.iter().filter(|&&r| r).count())
            .collect();
        let mut positions = real_positions(mask, t, &starts);
        if let Some(max) = max_positions {
            limit_positions(&mut positions, mask, max)?;
        }
        // Only now, with every check passed, does the cache change.
        for (row, new) in self.real.iter_mut().zip(mask.chunks_exact(t)) {
            row.extend_from_slice(new);
        }
        let key_padding = self.real.concat();
        Ok(Step {
            positions,
            key_padding,
            past,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_step_leaves_the_cache_usable() {
        // batch 2, a table of 4 positions; row 1 is left-padded.
        let mut cache = KvCache::new(1, 2, 1, 2, 2);
        let mask = [true, true, true, false, true, true];
        let step = cache.begin_step(&mask, 3, Some(4)).unwrap();
        assert_eq!(step.positions, [0, 1, 2, 0, 0, 1]);
        assert_eq!(cache.len(), 3);

        // Two more real tokens in row 0 would reach position 4: rejected, nothing kept.
        let err = cache
            .begin_step(&[true, true, true, true], 2, Some(4))
            .unwrap_err();
        match &err {
            Error::OutOfRange { index, size, what } => {
                assert_eq!((*index, *size), (4, 4));
                assert!(what.contains("sequence longer"), "{what}");
            }
            other => panic!("expected OutOfRange, got {other:?}"),
        }
        // A mask of the wrong size is rejected the same way.
        assert!(cache.begin_step(&[true; 3], 2, Some(4)).is_err());
        assert!(cache.begin_step(&[], 0, None).is_err());
        assert_eq!(cache.len(), 3);

        // The cache goes on as if the bad steps never happened. Padding may sit one
        // past the last real token; it is clamped into the table, not rejected.
        let step = cache.begin_step(&[true, false], 1, Some(4)).unwrap();
        assert_eq!(step.past, 3);
        assert_eq!(step.positions, [3, 2]);
        assert_eq!(
            step.key_padding,
            [true, true, true, true, false, true, true, false]
        );
        let step = cache.begin_step(&[false, true], 1, Some(4)).unwrap();
        assert_eq!(step.positions, [3, 2]);
        assert_eq!(cache.len(), 5);
    }

    #[test]
    fn without_a_limit_positions_grow_freely() {
        let mut cache = KvCache::new(1, 1, 1, 2, 2);
        cache.begin_step(&[true; 5], 5, None).unwrap();
        let step = cache.begin_step(&[true], 1, None).unwrap();
        assert_eq!(step.positions, [5]);
    }

    #[test]
    fn a_cache_from_another_model_is_named() {
        let cache = KvCache::new(2, 1, 1, 2, 2);
        assert!(cache.check_layers(2).is_ok());
        let msg = cache.check_layers(3).unwrap_err().to_string();
        assert!(msg.contains("kv cache"), "{msg}");
    }
}
