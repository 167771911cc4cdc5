//! The KV cache for incremental decoding: per layer, keys `[B, cap, G, D]` and values
//! `[B, cap, G, Dv]` with `len ≤ cap` positions in use. Capacity doubles when full, so
//! a step copies only its own new rows (the whole cache moves only on the rare growth).
//! Attention reads the first `len` positions in place through [`HeadsView`].
//!
//! The rows are stored in f32 or, with [`KvDType::Bf16`], rounded to bf16: half the
//! bytes that each decode step reads from the cache, which is what a step over a long
//! context spends its time on. A decode step's kernels read the bf16 rows in place,
//! widening them in registers; any other call (a prompt over the cache, weights asked for) widens the cache
//! to f32 first. Either way attention sees the rounded keys and values, so the result
//! does not depend on which path ran.

use super::call::run;
use super::decode::{self, KvRows};
use super::output::AttentionOutput;
use super::spec::{validate_inner, AttentionSpec, Kernel, Scorer};
use super::view::HeadsView;
use crate::batch::{limit_positions, real_positions};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::weights::bf16::convert::widen_rows;
use crate::weights::bf16::{bf16_to_f32, f32_to_bf16};

/// The number type a KV cache stores its rows in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDType {
    #[default]
    F32,
    /// Round to nearest even, as `Tensor.to(torch.bfloat16)`.
    Bf16,
}

impl KvDType {
    /// `f32`, `bf16`: the name `--kv-dtype` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvDType::F32 => "f32",
            KvDType::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for KvDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(KvDType::F32),
            "bf16" => Ok(KvDType::Bf16),
            _ => Err(Error::invalid(
                "kv dtype",
                format!("`{s}`: a KV cache stores f32 or bf16"),
            )),
        }
    }
}

/// One tensor's rows: f32, or bf16 bit patterns.
#[derive(Clone, Debug)]
pub(super) enum Rows {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Rows {
    fn empty(dtype: KvDType) -> Self {
        match dtype {
            KvDType::F32 => Rows::F32(Vec::new()),
            KvDType::Bf16 => Rows::Bf16(Vec::new()),
        }
    }

    /// Elements held.
    pub(super) fn len(&self) -> usize {
        match self {
            Rows::F32(d) => d.len(),
            Rows::Bf16(d) => d.len(),
        }
    }

    /// Bytes each element takes.
    pub(super) fn width(&self) -> usize {
        match self {
            Rows::F32(_) => 4,
            Rows::Bf16(_) => 2,
        }
    }

    /// Zeros of the same type, `n` elements.
    fn zeros_like(&self, n: usize) -> Self {
        match self {
            Rows::F32(_) => Rows::F32(vec![0.0; n]),
            Rows::Bf16(_) => Rows::Bf16(vec![0; n]),
        }
    }

    /// Copies `n` elements of `src` from `at` to `dst` here (both of one type).
    fn copy_from(&mut self, dst: usize, src: &Rows, at: usize, n: usize) {
        match (self, src) {
            (Rows::F32(d), Rows::F32(s)) => d[dst..dst + n].copy_from_slice(&s[at..at + n]),
            (Rows::Bf16(d), Rows::Bf16(s)) => d[dst..dst + n].copy_from_slice(&s[at..at + n]),
            _ => unreachable!("a layer's rows keep one type"),
        }
    }

    /// Writes f32 `src` at `dst`, rounded for a bf16 store. `src` was checked finite;
    /// a value beyond bf16's range (|x| > 3.39e38) would round to infinity, so it is
    /// refused as `name`.
    fn write(&mut self, dst: usize, src: &[f32], name: &str) -> Result<()> {
        match self {
            Rows::F32(d) => d[dst..dst + src.len()].copy_from_slice(src),
            Rows::Bf16(d) => {
                for (i, (out, &x)) in d[dst..dst + src.len()].iter_mut().zip(src).enumerate() {
                    *out = f32_to_bf16(x);
                    if !bf16_to_f32(*out).is_finite() {
                        return Err(Error::invalid(
                            name,
                            format!("element {i} of the new rows, {x}, is beyond bf16's range"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
pub struct LayerKv {
    k: Rows,
    v: Rows,
    batch: usize,
    heads: usize,
    dk: usize,
    dv: usize,
    len: usize,
    cap: usize,
}

impl LayerKv {
    pub fn new(batch: usize, heads: usize, dk: usize, dv: usize) -> Self {
        LayerKv::new_as(KvDType::F32, batch, heads, dk, dv)
    }

    /// An empty cache storing its rows in `dtype`.
    pub fn new_as(dtype: KvDType, batch: usize, heads: usize, dk: usize, dv: usize) -> Self {
        LayerKv {
            k: Rows::empty(dtype),
            v: Rows::empty(dtype),
            batch,
            heads,
            dk,
            dv,
            len: 0,
            cap: 0,
        }
    }

    pub fn dtype(&self) -> KvDType {
        match self.k {
            Rows::F32(_) => KvDType::F32,
            Rows::Bf16(_) => KvDType::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends k: `[B, T, G, Dk]` and v: `[B, T, G, Dv]` after the cached positions.
    /// A rejected append (bad shape, a non-finite value) leaves the cache unchanged.
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
            let src = &k.data()[bi * t * rk..(bi + 1) * t * rk];
            self.k.write(dst, src, "cached k")?;
            let dst = (bi * self.cap + self.len) * rv;
            let src = &v.data()[bi * t * rv..(bi + 1) * t * rv];
            self.v.write(dst, src, "cached v")?;
        }
        self.len += t;
        Ok(())
    }

    /// A one-row layer's keys and values at positions `start..start + len`, copied in
    /// their own type: `[len, G, Dk]` and `[len, G, Dv]`.
    pub(super) fn span(&self, start: usize, len: usize) -> (Rows, Rows) {
        debug_assert!(self.batch == 1 && start + len <= self.len);
        let (rk, rv) = (self.heads * self.dk, self.heads * self.dv);
        let mut k = self.k.zeros_like(len * rk);
        let mut v = self.v.zeros_like(len * rv);
        k.copy_from(0, &self.k, start * rk, len * rk);
        v.copy_from(0, &self.v, start * rv, len * rv);
        (k, v)
    }

    /// Forgets the positions from `len` on (none when it holds fewer).
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Errors unless `len` positions of keys `k` and values `v` fit this one-row layer
    /// (taken by [`LayerKv::span`] from a layer of the same shape and type).
    pub(super) fn check_span(&self, k: &Rows, v: &Rows, len: usize) -> Result<()> {
        let (rk, rv) = (self.heads * self.dk, self.heads * self.dv);
        let same_type = std::mem::discriminant(k) == std::mem::discriminant(&self.k);
        if self.batch != 1 || !same_type || k.len() != len * rk || v.len() != len * rv {
            return Err(Error::invalid(
                "kv cache",
                format!(
                    "{len} positions of {} and {} elements ({}-byte) for a {}-row {} layer of {rk} and {rv} a position",
                    k.len(),
                    v.len(),
                    k.width(),
                    self.batch,
                    self.dtype()
                ),
            ));
        }
        Ok(())
    }

    /// Appends `len` positions of keys and values that [`LayerKv::check_span`] passed.
    pub(super) fn push_span(&mut self, k: &Rows, v: &Rows, len: usize) {
        let (rk, rv) = (self.heads * self.dk, self.heads * self.dv);
        if self.len + len > self.cap {
            self.grow((self.len + len).max(2 * self.cap).max(16));
        }
        self.k.copy_from(self.len * rk, k, 0, len * rk);
        self.v.copy_from(self.len * rv, v, 0, len * rv);
        self.len += len;
    }

    /// This layer with row i holding this layer's row `rows[i]` (every index < B).
    fn select_rows(&self, rows: &[usize]) -> LayerKv {
        let (rk, rv) = (self.heads * self.dk, self.heads * self.dv);
        let mut k = self.k.zeros_like(rows.len() * self.cap * rk);
        let mut v = self.v.zeros_like(rows.len() * self.cap * rv);
        for (i, &r) in rows.iter().enumerate() {
            k.copy_from(i * self.cap * rk, &self.k, r * self.cap * rk, self.len * rk);
            v.copy_from(i * self.cap * rv, &self.v, r * self.cap * rv, self.len * rv);
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
        let mut k = self.k.zeros_like(self.batch * cap * rk);
        let mut v = self.v.zeros_like(self.batch * cap * rv);
        for b in 0..self.batch {
            k.copy_from(b * cap * rk, &self.k, b * self.cap * rk, self.len * rk);
            v.copy_from(b * cap * rv, &self.v, b * self.cap * rv, self.len * rv);
        }
        self.k = k;
        self.v = v;
        self.cap = cap;
    }

    /// Attention of q `[B, T, H, Dk]` over the cached keys and values. Every cached
    /// row was checked finite when appended, so unlike [`super::attention_views`]
    /// this does not read the whole cache for that check.
    pub fn attend(&self, q: &HeadsView, spec: &AttentionSpec) -> Result<AttentionOutput> {
        match (&self.k, &self.v) {
            (Rows::F32(k), Rows::F32(v)) => run(
                q,
                &self.view(k, self.dk),
                &self.view(v, self.dv),
                spec,
                false,
            ),
            (Rows::Bf16(k), Rows::Bf16(v)) => {
                let (k, v) = (self.view(k, self.dk), self.view(v, self.dv));
                let dims = validate_inner(q, &k, &v, spec)?;
                let decoding = spec.kernel == Kernel::Tiled && !spec.want_weights;
                if decoding && dims.t <= decode::MAX_ROWS {
                    let scorer = Scorer::new(dims, spec);
                    let (out, lse) =
                        decode::attention(q, KvRows::Bf16(&k), KvRows::Bf16(&v), &scorer);
                    return Ok(AttentionOutput {
                        out,
                        lse,
                        weights: None,
                    });
                }
                let (k, v) = (widen(&k), widen(&v));
                run(
                    q,
                    &HeadsView::of(&k, "k")?,
                    &HeadsView::of(&v, "v")?,
                    spec,
                    false,
                )
            }
            _ => unreachable!("a layer's keys and values keep one type"),
        }
    }

    /// The cached keys `[B, len, G, Dk]` and values `[B, len, G, Dv]` as f32 (a bf16
    /// cache's rows widened).
    pub fn to_tensors(&self) -> Result<(Tensor, Tensor)> {
        let tensor = |rows: &Rows, dim: usize| match rows {
            Rows::F32(data) => {
                let view = self.view(data, dim);
                let mut out = Vec::with_capacity(self.batch * self.len * self.heads * dim);
                for b in 0..self.batch {
                    let start = view.offset(b, 0, 0);
                    out.extend_from_slice(&data[start..start + self.len * self.heads * dim]);
                }
                Tensor::new(&[self.batch, self.len, self.heads, dim], out)
            }
            Rows::Bf16(data) => Ok(widen(&self.view(data, dim))),
        };
        Ok((tensor(&self.k, self.dk)?, tensor(&self.v, self.dv)?))
    }

    fn view<'a, T>(&self, data: &'a [T], dim: usize) -> HeadsView<'a, T> {
        HeadsView::strided(
            data,
            [self.batch, self.len, self.heads, dim],
            [self.cap * self.heads * dim, self.heads * dim, dim],
        )
    }
}

/// A bf16 view's elements widened into a contiguous f32 `[B, L, N, E]` tensor (each
/// batch row's positions are contiguous in the store: one row of L·N·E to widen).
fn widen(view: &HeadsView<u16>) -> Tensor {
    let [b_n, len, heads, dim] = view.shape();
    let row = len * heads * dim;
    let mut out = vec![0.0f32; b_n * row];
    if row > 0 {
        for (b, dst) in out.chunks_exact_mut(row).enumerate() {
            let start = view.offset(b, 0, 0);
            widen_rows(&view.data[start..start + row], row, row, dst);
        }
    }
    Tensor::new(&[b_n, len, heads, dim], out).expect("the view's own shape")
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
        KvCache::new_as(KvDType::F32, n_layers, batch, kv_heads, dk, dv)
    }

    /// An empty cache whose layers store their rows in `dtype`.
    pub fn new_as(
        dtype: KvDType,
        n_layers: usize,
        batch: usize,
        kv_heads: usize,
        dk: usize,
        dv: usize,
    ) -> Self {
        KvCache {
            layers: (0..n_layers)
                .map(|_| LayerKv::new_as(dtype, batch, kv_heads, dk, dv))
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

    /// Real tokens cached in row `r` (its padding left out): the position its next
    /// token takes.
    pub fn real_len(&self, r: usize) -> usize {
        self.real[r].iter().filter(|&&real| real).count()
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.real.first().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the positions from `len` on, in every layer: a step that failed part
    /// way (some layers appended, some not) is undone by cutting back to the length
    /// before it.
    pub fn truncate(&mut self, len: usize) {
        for row in &mut self.real {
            row.truncate(len);
        }
        for layer in &mut self.layers {
            layer.truncate(len);
        }
    }

    /// Records `len` real positions appended to every layer outside a step (a cached
    /// prefix restored); the layers must already hold them.
    pub(super) fn extend_real(&mut self, len: usize) {
        debug_assert_eq!(self.batch, 1);
        self.real[0].extend(std::iter::repeat_n(true, len));
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

    use crate::attention::{attention, CausalAlign};
    use crate::rng::Rng;
    use crate::weights::bf16::convert::round_to_bf16;

    /// Positions `start..start + len` of a `[B, S, G, D]` tensor.
    fn positions(t: &Tensor, start: usize, len: usize) -> Tensor {
        let [b, s, g, d] = t.shape()[..] else {
            unreachable!()
        };
        let mut out = Vec::new();
        for bi in 0..b {
            out.extend_from_slice(&t.data()[(bi * s + start) * g * d..][..len * g * d]);
        }
        Tensor::new(&[b, len, g, d], out).unwrap()
    }

    fn rounded(t: &Tensor) -> Tensor {
        Tensor::new(
            t.shape(),
            t.data().iter().map(|&x| round_to_bf16(x)).collect(),
        )
        .unwrap()
    }

    /// A bf16 cache attends as f32 attention over its keys and values rounded to bf16,
    /// by the reference kernel: a decode step through the kernels that read bf16, a
    /// longer query (and a request for weights) through the widened cache; with
    /// grouped heads, two batch rows, padding, a causal mask and more than one split of
    /// keys (the decode kernel's 512).
    #[test]
    fn a_bf16_cache_attends_as_f32_over_rounded_rows() {
        let (b, s, h, g, d) = (2, 700, 4, 2, 24);
        let mut rng = Rng::new(7);
        let (k, v) = (
            rng.tensor(&[b, s, g, d], 1.0),
            rng.tensor(&[b, s, g, d], 1.0),
        );
        let mut cache = LayerKv::new_as(KvDType::Bf16, b, g, d, d);
        // appended in two steps, so that the store grows and moves once
        cache
            .append(&positions(&k, 0, 300), &positions(&v, 0, 300))
            .unwrap();
        cache
            .append(&positions(&k, 300, 400), &positions(&v, 300, 400))
            .unwrap();
        assert_eq!((cache.len(), cache.dtype()), (s, KvDType::Bf16));
        let (kr, vr) = (rounded(&k), rounded(&v));
        let (ck, cv) = cache.to_tensors().unwrap();
        assert_eq!((ck.data(), cv.data()), (kr.data(), vr.data()));
        let mut padding = vec![true; b * s];
        padding[s..s + 5].fill(false); // row 1 left-padded
        for t in [1, 3, 9] {
            let q = rng.tensor(&[b, t, h, d], 1.0);
            for want_weights in [false, true] {
                let spec = AttentionSpec {
                    causal: Some(CausalAlign::BottomRight),
                    key_padding: Some(&padding),
                    want_weights,
                    ..Default::default()
                };
                let got = cache
                    .attend(&HeadsView::of(&q, "q").unwrap(), &spec)
                    .unwrap();
                let reference = AttentionSpec {
                    kernel: Kernel::Reference,
                    ..spec
                };
                let want = attention(&q, &kr, &vr, &reference).unwrap();
                let err = got.out.max_abs_diff(&want.out);
                assert!(err < 2e-6, "T = {t}, weights {want_weights}: {err}");
                assert!(got.lse.max_abs_diff(&want.lse) < 2e-5, "T = {t}");
                assert_eq!(got.weights.is_some(), want_weights);
            }
        }
        // beam search's row selection keeps the type and the rows
        let picked = cache.select_rows(&[1, 1, 0]);
        assert_eq!(picked.dtype(), KvDType::Bf16);
        let (pk, _) = picked.to_tensors().unwrap();
        let row = s * g * d;
        assert_eq!(&pk.data()[2 * row..], &kr.data()[..row]);
        assert_eq!(&pk.data()[..row], &kr.data()[row..]);
    }

    #[test]
    fn a_value_beyond_bf16_is_refused_and_the_cache_kept() {
        let mut cache = LayerKv::new_as(KvDType::Bf16, 1, 1, 2, 2);
        let ok = Tensor::new(&[1, 1, 1, 2], vec![1.0, 2.0]).unwrap();
        cache.append(&ok, &ok).unwrap();
        let huge = Tensor::new(&[1, 1, 1, 2], vec![1.0, f32::MAX]).unwrap();
        let msg = cache.append(&huge, &ok).unwrap_err().to_string();
        assert!(msg.contains("cached k") && msg.contains("bf16"), "{msg}");
        assert_eq!(cache.len(), 1);
        assert_eq!("bf16".parse::<KvDType>().unwrap(), KvDType::Bf16);
        let msg = "int8".parse::<KvDType>().unwrap_err().to_string();
        assert!(msg.contains("kv dtype") && msg.contains("int8"), "{msg}");
    }

    #[test]
    fn a_cache_from_another_model_is_named() {
        let cache = KvCache::new(2, 1, 1, 2, 2);
        assert!(cache.check_layers(2).is_ok());
        let msg = cache.check_layers(3).unwrap_err().to_string();
        assert!(msg.contains("kv cache"), "{msg}");
    }
}
