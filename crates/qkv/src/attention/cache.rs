//! The KV cache for incremental decoding: per layer, keys `[B, G, cap, D]` and values
//! `[B, G, cap, Dv]` with `len ≤ cap` positions in use. Capacity doubles when full, so
//! a step copies only its own new rows (the whole cache moves only on the rare growth).
//! Attention reads the first `len` positions in place through [`HeadsView`].
//!
//! Heads-major, because a decode step's task reads one key head over a run of
//! positions: here that run is one contiguous block (512 keys of a 128-wide head:
//! 256 KiB in f32), where positions-major (`[B, cap, G, D]`, the model's own order)
//! scattered it over 512 rows G·D apart, a few lines of each page. Measured on a
//! 2-vCPU Zen 3 (docs/speed.md, "Speed, round 3"): decode steps 1.0–1.3× from the
//! layout alone, bf16 at S = 32768 1.2×.
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
    /// refused as `name`, `first` being `src[0]`'s index among the new rows.
    fn write(&mut self, dst: usize, src: &[f32], (name, first): (&str, usize)) -> Result<()> {
        match self {
            Rows::F32(d) => d[dst..dst + src.len()].copy_from_slice(src),
            Rows::Bf16(d) => {
                for (i, (out, &x)) in d[dst..dst + src.len()].iter_mut().zip(src).enumerate() {
                    *out = f32_to_bf16(x);
                    if !bf16_to_f32(*out).is_finite() {
                        return Err(Error::invalid(
                            name,
                            format!(
                                "element {} of the new rows, {x}, is beyond bf16's range",
                                first + i
                            ),
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
        // the new rows arrive positions-major ([B, T, G, D]); each head's vector goes
        // to its own run of the store
        let (dk, dv) = (self.dk, self.dv);
        for row in 0..b * t * g {
            let (bi, ti, gi) = (row / (t * g), row / g % t, row % g);
            let at = self.run(bi, gi) + self.len + ti;
            let (kr, vr) = (&k.data()[row * dk..][..dk], &v.data()[row * dv..][..dv]);
            self.k.write(at * dk, kr, ("cached k", row * dk))?;
            self.v.write(at * dv, vr, ("cached v", row * dv))?;
        }
        self.len += t;
        Ok(())
    }

    /// Position 0 of head g's run in batch row b, counted in vectors of the store.
    fn run(&self, b: usize, g: usize) -> usize {
        (b * self.heads + g) * self.cap
    }

    /// A one-row layer's keys and values at positions `start..start + len`, copied in
    /// their own type and layout: `[G, len, Dk]` and `[G, len, Dv]`.
    pub(super) fn span(&self, start: usize, len: usize) -> (Rows, Rows) {
        debug_assert!(self.batch == 1 && start + len <= self.len);
        let (g_n, dk, dv) = (self.heads, self.dk, self.dv);
        let mut k = self.k.zeros_like(g_n * len * dk);
        let mut v = self.v.zeros_like(g_n * len * dv);
        for g in 0..g_n {
            let from = self.run(0, g) + start;
            k.copy_from(g * len * dk, &self.k, from * dk, len * dk);
            v.copy_from(g * len * dv, &self.v, from * dv, len * dv);
        }
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
        if self.len + len > self.cap {
            self.grow((self.len + len).max(2 * self.cap).max(16));
        }
        let (dk, dv) = (self.dk, self.dv);
        for g in 0..self.heads {
            let to = self.run(0, g) + self.len;
            self.k.copy_from(to * dk, k, g * len * dk, len * dk);
            self.v.copy_from(to * dv, v, g * len * dv, len * dv);
        }
        self.len += len;
    }

    /// This layer with row i holding this layer's row `rows[i]` (every index < B).
    fn select_rows(&self, rows: &[usize]) -> LayerKv {
        let mut out = LayerKv {
            k: self
                .k
                .zeros_like(rows.len() * self.heads * self.cap * self.dk),
            v: self
                .v
                .zeros_like(rows.len() * self.heads * self.cap * self.dv),
            batch: rows.len(),
            ..*self
        };
        for (i, &r) in rows.iter().enumerate() {
            out.copy_runs(i, self, r);
        }
        out
    }

    /// Copies row `from`'s cached positions of `src` (same heads and widths, `len` ≤
    /// this capacity) into row `to` here, head by head.
    fn copy_runs(&mut self, to: usize, src: &LayerKv, from: usize) {
        let (dk, dv, n) = (self.dk, self.dv, src.len);
        for g in 0..self.heads {
            let (at, of) = (self.run(to, g), src.run(from, g));
            self.k.copy_from(at * dk, &src.k, of * dk, n * dk);
            self.v.copy_from(at * dv, &src.v, of * dv, n * dv);
        }
    }

    fn grow(&mut self, cap: usize) {
        let mut grown = LayerKv {
            k: self.k.zeros_like(self.batch * self.heads * cap * self.dk),
            v: self.v.zeros_like(self.batch * self.heads * cap * self.dv),
            cap,
            ..*self
        };
        for b in 0..self.batch {
            grown.copy_runs(b, self, b);
        }
        *self = grown;
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
                let (wk, wv) = (widen(&k), widen(&v));
                run(
                    q,
                    &HeadsView::heads_major(&wk, [k.batch, k.heads, k.len, k.dim]),
                    &HeadsView::heads_major(&wv, [v.batch, v.heads, v.len, v.dim]),
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
        let tensor = |rows: &Rows, dim: usize| {
            let widened;
            let view = match rows {
                Rows::F32(data) => self.view(data, dim),
                Rows::Bf16(data) => {
                    widened = widen(&self.view(data, dim));
                    HeadsView::heads_major(&widened, [self.batch, self.heads, self.len, dim])
                }
            };
            Tensor::new(&view.shape(), view.gather_positions_major())
        };
        Ok((tensor(&self.k, self.dk)?, tensor(&self.v, self.dv)?))
    }

    /// The first `len` positions as `[B, len, G, dim]`, each head's run `cap` long.
    fn view<'a, T>(&self, data: &'a [T], dim: usize) -> HeadsView<'a, T> {
        HeadsView::strided(
            data,
            [self.batch, self.len, self.heads, dim],
            [self.heads * self.cap * dim, dim, self.cap * dim],
        )
    }
}

/// A heads-major bf16 view's elements widened into contiguous f32 `[B, N, L, E]`, run by
/// run (a head's positions lie one after another in the store).
fn widen(view: &HeadsView<u16>) -> Vec<f32> {
    let [b_n, len, heads, dim] = view.shape();
    debug_assert_eq!(view.pos_stride, dim);
    let run = view.run_len().expect("the cache's own sizes");
    let mut out = vec![0.0f32; b_n * heads * len * dim];
    if run > 0 {
        for (start, dst) in view.runs().zip(out.chunks_exact_mut(run)) {
            widen_rows(&view.data[start..start + run], run, run, dst);
        }
    }
    out
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

    /// A cache attends as the reference kernel over its keys and values (rounded to
    /// bf16 in a bf16 cache): a decode step through the kernels that read the store in
    /// place, a longer query (and a request for weights) through the general path;
    /// with grouped heads, two batch rows, padding, a causal mask and more than one
    /// split of keys (the decode kernel's 512). The store, heads-major, grows once
    /// on the way; its rows come back positions-major, and beam search's selection and
    /// a span's round trip keep them.
    #[test]
    fn a_cache_attends_as_the_reference_over_its_rows() {
        for dtype in [KvDType::F32, KvDType::Bf16] {
            cache_attends_as_the_reference(dtype);
        }
    }

    fn cache_attends_as_the_reference(dtype: KvDType) {
        let (b, s, h, g, d) = (2, 700, 4, 2, 24);
        let mut rng = Rng::new(7);
        let (k, v) = (
            rng.tensor(&[b, s, g, d], 1.0),
            rng.tensor(&[b, s, g, d], 1.0),
        );
        let mut cache = LayerKv::new_as(dtype, b, g, d, d);
        // appended in two steps, so that the store grows and moves once
        cache
            .append(&positions(&k, 0, 300), &positions(&v, 0, 300))
            .unwrap();
        cache
            .append(&positions(&k, 300, 400), &positions(&v, 300, 400))
            .unwrap();
        assert_eq!((cache.len(), cache.dtype()), (s, dtype));
        let (kr, vr) = match dtype {
            KvDType::F32 => (k.clone(), v.clone()),
            KvDType::Bf16 => (rounded(&k), rounded(&v)),
        };
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
                assert!(err < 2e-6, "{dtype} T = {t}, weights {want_weights}: {err}");
                assert!(got.lse.max_abs_diff(&want.lse) < 2e-5, "{dtype} T = {t}");
                assert_eq!(got.weights.is_some(), want_weights);
            }
        }
        // beam search's row selection keeps the type and the rows
        let picked = cache.select_rows(&[1, 1, 0]);
        assert_eq!(picked.dtype(), dtype);
        let (pk, _) = picked.to_tensors().unwrap();
        let row = s * g * d;
        assert_eq!(&pk.data()[2 * row..], &kr.data()[..row]);
        assert_eq!(&pk.data()[..row], &kr.data()[row..]);
        // positions 100..350 of row 0 cut out and appended to an empty one-row cache
        let row0 = cache.select_rows(&[0]);
        let (sk, sv) = row0.span(100, 250);
        let mut restored = LayerKv::new_as(dtype, 1, g, d, d);
        restored.check_span(&sk, &sv, 250).unwrap();
        restored.push_span(&sk, &sv, 250);
        let (rk, rv) = restored.to_tensors().unwrap();
        let (k0, v0) = (positions(&kr, 100, 250), positions(&vr, 100, 250));
        assert_eq!(rk.data(), &k0.data()[..250 * g * d]);
        assert_eq!(rv.data(), &v0.data()[..250 * g * d]);
    }

    #[test]
    fn a_value_beyond_bf16_is_refused_and_the_cache_kept() {
        let mut cache = LayerKv::new_as(KvDType::Bf16, 1, 1, 2, 2);
        let ok = Tensor::new(&[1, 1, 1, 2], vec![1.0, 2.0]).unwrap();
        cache.append(&ok, &ok).unwrap();
        let huge = Tensor::new(&[1, 1, 1, 2], vec![1.0, f32::MAX]).unwrap();
        let msg = cache.append(&huge, &ok).unwrap_err().to_string();
        assert!(msg.contains("cached k") && msg.contains("bf16"), "{msg}");
        // the index counts the new rows positions-major, as the caller passed them
        let mut wide = LayerKv::new_as(KvDType::Bf16, 1, 2, 2, 2);
        let two = Tensor::new(&[1, 2, 2, 2], vec![0.0; 8]).unwrap();
        let mut bad = two.clone();
        bad.data_mut()[6] = -f32::MAX;
        let msg = wide.append(&two, &bad).unwrap_err().to_string();
        assert!(
            msg.contains("cached v") && msg.contains("element 6"),
            "{msg}"
        );
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
