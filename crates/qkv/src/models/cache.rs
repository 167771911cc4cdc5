//! The KV cache for incremental decoding: per layer, keys `[B, cap, G, D]` and values
//! `[B, cap, G, Dv]` with `len ≤ cap` positions in use. Capacity doubles when full, so
//! a step copies only its own new rows (the whole cache moves only on the rare growth).
//! Attention reads the first `len` positions in place through [`HeadsView`].

use super::batch::real_positions;
use crate::attention::HeadsView;
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
        }
    }
}

/// A whole decoder's cache: one [`LayerKv`] per layer plus which cached positions are
/// real tokens in each batch row.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    batch: usize,
    /// [B][len]: `true` where the cached position holds a real token
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

    /// Records new tokens' mask (`[B, T]`) and returns their positions and the key
    /// padding the layers use for this step. Layers then append their K/V.
    pub fn begin_step(&mut self, mask: &[bool], t: usize) -> Result<Step> {
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
        let positions = real_positions(mask, t, &starts);
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
