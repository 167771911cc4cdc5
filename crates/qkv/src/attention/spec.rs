//! What an attention call may see: scale, causal alignment, window, padding, masks and
//! additive biases. Both kernels ask [`Scorer`] for the same rules, so a mask means
//! exactly the same thing on the reference and the tiled path.

use super::view::HeadsView;
use crate::error::{Error, Result};
use crate::ops::fastmath;
use crate::tensor::{check_finite, Tensor};

/// Where the causal diagonal sits when the query and key lengths differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CausalAlign {
    /// Query i sees keys 0..=i (PyTorch's `is_causal`).
    TopLeft,
    /// Query i sees keys 0..=i + S − T: the T queries are the last T positions of
    /// the S keys, as in cached decoding.
    BottomRight,
}

/// A per-(batch, head) array of `[T, S]` rows, broadcast over batch and heads:
/// shape `[Bm, Hm, T, S]` with Bm ∈ {1, B} and Hm ∈ {1, H}.
#[derive(Clone, Copy, Debug)]
pub struct Broadcast<'a, E> {
    pub data: &'a [E],
    pub shape: [usize; 4],
}

impl<'a, E> Broadcast<'a, E> {
    pub fn new(data: &'a [E], shape: [usize; 4]) -> Self {
        Broadcast { data, shape }
    }

    /// The S-long row for batch b, head h, query i.
    fn row(&self, b: usize, h: usize, i: usize) -> &'a [E] {
        let [bm, hm, t, s] = self.shape;
        let (b, h) = (if bm == 1 { 0 } else { b }, if hm == 1 { 0 } else { h });
        let start = ((b * hm + h) * t + i) * s;
        &self.data[start..start + s]
    }

    fn validate(&self, name: &str, b: usize, h: usize, t: usize, s: usize) -> Result<()> {
        let [bm, hm, tm, sm] = self.shape;
        let ok = (bm == 1 || bm == b) && (hm == 1 || hm == h) && tm == t && sm == s;
        if !ok || self.data.len() != bm * hm * tm * sm {
            return Err(Error::Shape {
                tensor: name.into(),
                expected: format!("[1 or {b}, 1 or {h}, {t}, {s}] with as many elements"),
                got: self.shape.to_vec(),
            });
        }
        Ok(())
    }
}

impl Tensor {
    /// Views a `[Bm, Hm, T, S]` tensor as a broadcast attention bias or mask input.
    pub fn as_broadcast(&self) -> Result<Broadcast<'_, f32>> {
        self.expect_shape("bias", &[None, None, None, None])?;
        let s = self.shape();
        Ok(Broadcast::new(self.data(), [s[0], s[1], s[2], s[3]]))
    }
}

/// An additive term on the scaled scores.
#[derive(Clone, Copy, Debug)]
pub enum Bias<'a> {
    /// Arbitrary values (a float mask, T5's relative bias). −∞ masks a key.
    Dense(Broadcast<'a, f32>),
    /// ALiBi: head h adds `slopes[h] · (j − p)` for key j and query position p,
    /// computed on the fly (nothing T×S is stored).
    Alibi { slopes: &'a [f32] },
}

/// Which kernel computes the attention. Both give the same numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// Materialises the T×S score matrix, as the articles write the formula.
    Reference,
    /// Tiles with an online softmax (FlashAttention-2 loop order), O(T+S) extra memory.
    #[default]
    Tiled,
}

/// Everything besides Q, K and V that defines one attention call.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionSpec<'a> {
    /// Multiplies Q·Kᵀ; `None` means 1/√D.
    pub scale: Option<f32>,
    pub causal: Option<CausalAlign>,
    /// Sliding window: query position p sees key j only when p − j < w (and, when not
    /// causal, also j − p < w). Positions follow the causal alignment (top-left if none).
    pub window: Option<usize>,
    /// [B, S]: `true` for real keys, `false` for padding.
    pub key_padding: Option<&'a [bool]>,
    /// `true` where a query may attend to a key.
    pub mask: Option<Broadcast<'a, bool>>,
    pub bias: Option<Bias<'a>>,
    /// Soft-caps the scaled scores, s ↦ cap·tanh(s/cap), before the bias and masks
    /// (Gemma 2's `attn_logit_softcapping`).
    pub softcap: Option<f32>,
    /// Return the `[B, H, T, S]` softmax weights too.
    pub want_weights: bool,
    pub kernel: Kernel,
    /// Lets the tiled kernel compute Q·Kᵀ and P·V from operands rounded to bf16
    /// (products and sums in f32; the softmax, masks and output f32): a call of more
    /// than a few query rows that asks for no weights. A decoding step, a call that
    /// asks for weights and the reference kernel compute in f32.
    pub bf16: bool,
}

/// Sizes of one attention call, read from Q `[B,T,H,D]`, K `[B,S,G,D]`, V `[B,S,G,Dv]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub s: usize,
    pub h: usize,
    pub g: usize,
    pub d: usize,
    pub dv: usize,
}

impl Dims {
    /// Key/value head read by query head `h` (GQA: H/G query heads share one).
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.h / self.g)
    }
}

/// Checks Q, K, V and the spec against each other; returns the sizes.
pub fn validate(q: &HeadsView, k: &HeadsView, v: &HeadsView, spec: &AttentionSpec) -> Result<Dims> {
    let dims = validate_inner(q, k, v, spec)?;
    k.check_finite("k")?;
    v.check_finite("v")?;
    Ok(dims)
}

/// As [`validate`] without the O(S) finiteness scan of K and V: for a KV cache whose
/// every row was checked when it was appended (the scan would read the whole cache
/// again at every decode step), whose elements may be f32 or bf16 (`E`).
pub(crate) fn validate_inner<E>(
    q: &HeadsView,
    k: &HeadsView<E>,
    v: &HeadsView<E>,
    spec: &AttentionSpec,
) -> Result<Dims> {
    q.check_bounds("q")?;
    k.check_bounds("k")?;
    v.check_bounds("v")?;
    let [b, t, h, d] = q.shape();
    let [kb, s, g, kd] = k.shape();
    if kb != b || kd != d {
        return Err(Error::shape(
            "k",
            format!("[{b}, _, _, {d}] (batch and head width of q)"),
            &k.shape(),
        ));
    }
    let [vb, vs, vg, dv] = v.shape();
    if vb != b || vs != s || vg != g {
        return Err(Error::shape(
            "v",
            format!("[{b}, {s}, {g}, _] (batch, length and heads of k)"),
            &v.shape(),
        ));
    }
    if [b, t, h, d, s, g, dv].contains(&0) {
        return Err(Error::invalid(
            "attention inputs",
            format!(
                "empty axis: q {:?}, k {:?}, v {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    if !h.is_multiple_of(g) {
        return Err(Error::invalid(
            "k/v heads",
            format!("{g} key/value heads must divide {h} query heads"),
        ));
    }
    q.check_finite("q")?;
    if let Some(scale) = spec.scale {
        if !scale.is_finite() {
            return Err(Error::invalid(
                "scale",
                format!("must be finite, got {scale}"),
            ));
        }
    }
    if spec.window == Some(0) {
        return Err(Error::invalid("window", "must be at least 1"));
    }
    if let Some(cap) = spec.softcap {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(Error::invalid(
                "softcap",
                format!("must be finite and > 0, got {cap}"),
            ));
        }
    }
    if let Some(pad) = spec.key_padding {
        if pad.len() != b * s {
            return Err(Error::Shape {
                tensor: "key_padding".into(),
                expected: format!("[{b}, {s}] = {} entries", b * s),
                got: vec![pad.len()],
            });
        }
    }
    if let Some(mask) = &spec.mask {
        mask.validate("mask", b, h, t, s)?;
    }
    match &spec.bias {
        Some(Bias::Dense(bias)) => {
            bias.validate("bias", b, h, t, s)?;
            // −∞ is a legitimate way to mask a key; NaN and +∞ are not.
            if let Some(index) = bias
                .data
                .iter()
                .position(|x| x.is_nan() || *x == f32::INFINITY)
            {
                return Err(Error::NonFinite {
                    tensor: "bias".into(),
                    index,
                    value: bias.data[index],
                });
            }
        }
        Some(Bias::Alibi { slopes }) => {
            if slopes.len() != h {
                return Err(Error::Shape {
                    tensor: "alibi slopes".into(),
                    expected: format!("[{h}] (one per query head)"),
                    got: vec![slopes.len()],
                });
            }
            check_finite("alibi slopes", slopes)?;
        }
        None => {}
    }
    Ok(Dims {
        b,
        t,
        s,
        h,
        g,
        d,
        dv,
    })
}

/// d(cap·tanh(s/cap))/ds at each raw scaled score s of `raw`, multiplied into the
/// gradient `ds` of the capped scores: ds ← ds·(1 − tanh²(s/cap)). Masked entries
/// have ds = 0 already.
pub(crate) fn softcap_backward(cap: f32, raw: &[f32], ds: &mut [f32]) {
    for (g, &s) in ds.iter_mut().zip(raw) {
        let t = fastmath::tanh(s / cap);
        *g *= 1.0 - t * t;
    }
}

/// Applies a validated spec to score tiles. Shared by both kernels.
pub(crate) struct Scorer<'s> {
    pub dims: Dims,
    pub scale: f32,
    spec: &'s AttentionSpec<'s>,
    /// Absolute position of query 0 (S − T for bottom-right alignment, else 0).
    offset: isize,
}

impl<'s> Scorer<'s> {
    pub fn new(dims: Dims, spec: &'s AttentionSpec<'s>) -> Self {
        let offset = match spec.causal {
            Some(CausalAlign::BottomRight) => dims.s as isize - dims.t as isize,
            _ => 0,
        };
        Scorer {
            dims,
            scale: spec.scale.unwrap_or(1.0 / (dims.d as f32).sqrt()),
            spec,
            offset,
        }
    }

    /// Keys `[lo, hi)` that query i may see at all under the causal and window rules
    /// (possibly empty). Both bounds grow with i, which lets the tiled kernel skip
    /// whole key blocks.
    pub fn key_range(&self, i: usize) -> (usize, usize) {
        let s = self.dims.s as isize;
        let p = i as isize + self.offset;
        let mut lo = 0;
        let mut hi = s;
        if self.spec.causal.is_some() {
            hi = hi.min(p + 1);
        }
        if let Some(w) = self.spec.window {
            // A window wider than every distance is no limit (and must not wrap below 0).
            let w = w.min(self.dims.s + self.dims.t) as isize;
            lo = lo.max(p - w + 1);
            if self.spec.causal.is_none() {
                hi = hi.min(p + w);
            }
        }
        let lo = lo.clamp(0, s) as usize;
        let hi = hi.clamp(0, s) as usize;
        (lo, hi.max(lo))
    }

    /// Whether any score needs more than the causal and window rules and the soft cap:
    /// key padding, a mask or a bias. A row without them needs [`Scorer::cap_row`] alone.
    pub fn needs_row_pass(&self) -> bool {
        self.spec.key_padding.is_some() || self.spec.mask.is_some() || self.spec.bias.is_some()
    }

    /// The soft cap alone over a row of scores every one of which is allowed (what
    /// [`Scorer::apply_row`] does to such a row, in a loop that vectorises).
    pub fn cap_row(&self, row: &mut [f32]) {
        if let Some(cap) = self.spec.softcap {
            row.iter_mut()
                .for_each(|x| *x = cap * fastmath::tanh(*x / cap));
        }
    }

    /// The soft cap, if the scores have one.
    pub fn softcap(&self) -> Option<f32> {
        self.spec.softcap
    }

    /// Turns raw scaled scores of query row i against keys `j0..j0 + row.len()` into
    /// final logits: soft-caps them, adds the bias and writes −∞ where a key is not
    /// allowed.
    pub fn apply_row(&self, b: usize, h: usize, i: usize, j0: usize, row: &mut [f32]) {
        let (lo, hi) = self.key_range(i);
        let s = self.dims.s;
        let pad = self.spec.key_padding.map(|p| &p[b * s..(b + 1) * s]);
        let mask = self.spec.mask.as_ref().map(|m| m.row(b, h, i));
        let p = i as isize + self.offset;
        let dense = match &self.spec.bias {
            Some(Bias::Dense(bias)) => Some(bias.row(b, h, i)),
            _ => None,
        };
        let slope = match &self.spec.bias {
            Some(Bias::Alibi { slopes }) => Some(slopes[h]),
            _ => None,
        };
        for (c, x) in row.iter_mut().enumerate() {
            let j = j0 + c;
            let allowed =
                j >= lo && j < hi && pad.is_none_or(|p| p[j]) && mask.is_none_or(|m| m[j]);
            if !allowed {
                *x = f32::NEG_INFINITY;
                continue;
            }
            if let Some(cap) = self.spec.softcap {
                *x = cap * fastmath::tanh(*x / cap);
            }
            if let Some(d) = dense {
                *x += d[j];
            }
            if let Some(m) = slope {
                *x += m * (j as isize - p) as f32;
            }
        }
    }
}
