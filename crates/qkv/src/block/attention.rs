//! The attention sub-layer, the one every model runs: three parallel projections W_Q,
//! W_K, W_V (one linear map each, applied side by side, not stacked as layers), a split
//! into heads, RoPE when the stack uses it, the attention kernel, a merge, and W_O.
//!
//! ```text
//! q = RoPE(n_q(W_Q·x))                 [B,T,H,D]
//! k = RoPE(n_k(W_K·m)),  v = W_V·m     [B,S,G,D], [B,S,G,Dv]   m = x (self) or the encoder output (cross)
//! y = W_O·concat_h(attention(q, k, v))  [B,T,C]
//! ```
//!
//! n_q and n_k are the optional per-head norms over each head's D values (Qwen3's and
//! Gemma 3's `q_norm` / `k_norm`); without them they are the identity.
//!
//! Self-attention projects its own keys and values and, when decoding, appends them to a
//! [`LayerKv`] so the new queries attend over every cached position. Cross-attention
//! reads keys and values computed once per source ([`MultiHeadAttention::cross_kv`]).
//!
//! Three entry points: [`MultiHeadAttention::attend`] (inference, optional cache, or
//! training with `keep`, which returns the [`AttnTape`] the backward needs) and
//! [`MultiHeadAttention::backward`]. Splitting into heads is a reshape: `[B,T,H·D]` is
//! `[B,T,H,D]` in row-major order, and so is the merge.

use crate::attention::{
    attention, attention_backward, attention_views, weight_grads, AttentionOutput, AttentionSpec,
    Bias, HeadsView, LayerKv,
};
use crate::error::{Error, Result};
use crate::layers::{maybe_norm, maybe_norm_backward};
use crate::layers::{Linear, Norm, NormTape};
use crate::position::Rope;
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    /// C → H·D
    pub q: Linear,
    /// Ckv → G·D
    pub k: Linear,
    /// Ckv → G·Dv
    pub v: Linear,
    /// H·Dv → C
    pub o: Linear,
    /// H
    pub heads: usize,
    /// G, dividing H
    pub kv_heads: usize,
    /// `[D]` a norm over each query head's D values, before RoPE
    pub q_norm: Option<Norm>,
    /// `[D]` the same over each key head
    pub k_norm: Option<Norm>,
}

crate::module!(MultiHeadAttention {
    q,
    k,
    v,
    o,
    q_norm,
    k_norm
});

impl MultiHeadAttention {
    /// The four projections, for what is done to every linear layer (packing them).
    pub fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        [&mut self.q, &mut self.k, &mut self.v, &mut self.o].into_iter()
    }
}

/// Everything about one attention call besides the projections: the kernel's spec
/// (scale, causal, window, padding, bias, weights) and RoPE with each query's position.
#[derive(Clone, Copy, Debug, Default)]
pub struct Attend<'a> {
    pub spec: AttentionSpec<'a>,
    /// Rotates q and k by these positions (`[B·T]`); self-attention only.
    pub rope: Option<(&'a Rope, &'a [usize])>,
    /// The backward also returns the gradient of the spec's dense bias (T5's learned
    /// relative bias).
    pub bias_grad: bool,
    /// The backward also returns the gradient of the softmax weights (attribution by
    /// gradients reads them).
    pub weight_grads: bool,
}

/// A cross-attention's keys `[B,S,G,D]` and values `[B,S,G,Dv]`, computed once per
/// source from the encoder output.
#[derive(Clone, Debug)]
pub struct CrossKv {
    pub k: Tensor,
    pub v: Tensor,
}

/// Where keys and values come from.
pub enum Keys<'c> {
    /// Projected from the sub-layer's own input (self-attention); appended to the cache
    /// when one is given, and the queries attend over all of it.
    Own(Option<&'c mut LayerKv>),
    /// Self-attention for sequences run side by side (continuous batching): x
    /// `[1,N,C]` holds their new tokens one after another, segment i's continuing the
    /// sequence whose keys and values are in `caches[i]` (one row each, any lengths):
    /// a decoding sequence's one token, or a chunk of a joining prompt. The projections
    /// run once over the N rows; each segment then attends over its own cache.
    OwnPacked(Vec<&'c mut LayerKv>, &'c [Segment]),
    /// Self-attention over a varlen batch: x `[1,N,C]` holds whole sequences one after
    /// another, `lens` tokens each (Σ lens = N), and each attends to its own tokens
    /// alone. The projections run once over all N rows, with no padding.
    OwnVarlen(&'c [usize]),
    /// An encoder's keys and values (cross-attention).
    Cross(&'c CrossKv),
}

/// One sequence's tokens in a packed step ([`Keys::OwnPacked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Its new tokens.
    pub len: usize,
    /// The length of the call whose RoPE frequencies they take (a scaling that depends
    /// on it: dynamic, LongRoPE): the sequence's length after them, or a whole
    /// prompt's while it is prefilled in chunks, as one call of it would take.
    pub rope_len: usize,
}

/// What [`MultiHeadAttention::backward`] needs from the forward.
#[derive(Clone, Debug)]
pub struct AttnTape {
    /// `[B,T,H,D]` after RoPE
    q: Tensor,
    /// the per-head norms' inputs (`[B,T,H,D]`, `[B,S,G,D]`) and statistics
    q_norm_in: Option<NormTape>,
    k_norm_in: Option<NormTape>,
    /// self-attention's k `[B,S,G,D]` (after RoPE) and v `[B,S,G,Dv]`
    own_kv: Option<(Tensor, Tensor)>,
    /// `[B,T,H·Dv]` the merged heads, W_O's input
    merged: Tensor,
    /// `[B,H,T]`
    lse: Tensor,
}

impl AttnTape {
    /// Self-attention's values `[B,S,G,Dv]` (a cross-attention's are the encoder's).
    #[cfg_attr(not(feature = "models"), allow(dead_code))]
    pub(crate) fn values(&self) -> Option<&Tensor> {
        self.own_kv.as_ref().map(|(_, v)| v)
    }
}

/// One forward's results.
pub struct Attended {
    /// `[B,T,C]`
    pub y: Tensor,
    /// `[B,H,T,S]` when the spec asks for weights
    pub weights: Option<Tensor>,
    pub tape: Option<AttnTape>,
}

/// Gradients a backward returns (the parameters' go into the gradient tree).
pub struct AttnGrads {
    /// `[B,T,C]`
    pub dx: Tensor,
    /// Cross-attention: the gradients of its keys and values, for
    /// [`MultiHeadAttention::cross_kv_backward`].
    pub d_cross: Option<CrossKv>,
    /// The gradient of a dense bias, when asked for (T5's relative bias).
    pub dbias: Option<Tensor>,
    /// `[B,H,T,S]`: the gradient of the softmax weights, when asked for.
    pub d_weights: Option<Tensor>,
}

/// Refuses what a spec asks that attention run sequence by sequence cannot give: the
/// weights, key padding (each sequence is whole), or a dense score bias (laid out for
/// one batch); ALiBi's per-head slopes apply to any sequence.
fn per_sequence_spec(spec: &AttentionSpec, over: &str) -> Result<()> {
    let dense = spec
        .bias
        .as_ref()
        .is_some_and(|b| !matches!(b, Bias::Alibi { .. }));
    if spec.want_weights || spec.key_padding.is_some() || dense {
        return Err(Error::Unsupported(format!(
            "attention weights, key padding or a dense score bias over {over}"
        )));
    }
    Ok(())
}

/// Where each of sequences of `lens` tokens starts in a row holding them one after
/// another.
fn starts_of(lens: &[usize]) -> Vec<usize> {
    lens.iter()
        .scan(0, |o, &len| {
            let s = *o;
            *o += len;
            Some(s)
        })
        .collect()
}

/// The sequences' attention outputs (each `[1,len,H,Dv]`, lse `[1,H,len]`) as one row's:
/// out `[1,N,H,Dv]`, lse `[1,H,N]`.
fn joined(
    parts: &[AttentionOutput],
    starts: &[usize],
    lens: &[usize],
    [n, h, dv]: [usize; 3],
) -> Result<AttentionOutput> {
    let mut out = Vec::with_capacity(n * h * dv);
    let mut lse = vec![0.0; h * n];
    for ((part, &o), &len) in parts.iter().zip(starts).zip(lens) {
        out.extend_from_slice(part.out.data());
        // the part's lse is [1,H,len]: head by head into [1,H,N]
        for (hh, row) in part.lse.data().chunks_exact(len).enumerate() {
            lse[hh * n + o..][..len].copy_from_slice(row);
        }
    }
    Ok(AttentionOutput {
        out: Tensor::new(&[1, n, h, dv], out)?,
        lse: Tensor::new(&[1, h, n], lse)?,
        weights: None,
    })
}

/// q `[1,N,H,D]`, k `[1,N,G,D]` and v `[1,N,G,Dv]` cut into sequences of `lens`
/// tokens, each attending over its own keys: out `[1,N,H,Dv]`, lse `[1,H,N]`. The
/// sequences run in parallel, each read in place through the kernel a whole sequence
/// takes.
fn attend_varlen(
    lens: &[usize],
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: &AttentionSpec,
) -> Result<AttentionOutput> {
    use rayon::prelude::*;
    let [b, n, h, d] = q.shape()[..] else {
        unreachable!("q is [B,T,H,D]")
    };
    let (g, dv) = (k.shape()[2], v.shape()[3]);
    if b != 1 || lens.iter().sum::<usize>() != n || lens.contains(&0) {
        return Err(Error::invalid(
            "varlen sequences",
            format!(
                "lengths {lens:?} for [{b}, {n}] tokens: one row, cut into non-empty sequences"
            ),
        ));
    }
    per_sequence_spec(spec, "varlen sequences")?;
    if lens.len() == 1 {
        return attention(q, k, v, spec);
    }
    let starts = starts_of(lens);
    let parts: Vec<AttentionOutput> = starts
        .par_iter()
        .zip(lens)
        .map(|(&o, &len)| {
            // rows o..o + len of a [1,N,heads,dim] tensor, read in place
            fn rows(
                x: &Tensor,
                (o, len): (usize, usize),
                [heads, dim]: [usize; 2],
            ) -> HeadsView<'_> {
                let w = heads * dim;
                HeadsView::positions_major(&x.data()[o * w..][..len * w], [1, len, heads, dim])
            }
            let at = (o, len);
            attention_views(
                &rows(q, at, [h, d]),
                &rows(k, at, [g, d]),
                &rows(v, at, [g, dv]),
                spec,
            )
        })
        .collect::<Result<_>>()?;
    joined(&parts, &starts, lens, [n, h, dv])
}

/// q `[1,N,H,D]`, k `[1,N,G,D]` and v `[1,N,G,Dv]` cut into `segments`: segment i's
/// keys and values are appended to `caches[i]` and its queries attend over all of it
/// (causally, aligned to the cache's end): out `[1,N,H,Dv]`, lse `[1,H,N]`. The segments
/// run in parallel, each through the kernel its length takes (a decoding row's or a
/// prefill chunk's).
fn attend_packed(
    mut caches: Vec<&mut LayerKv>,
    segments: &[Segment],
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: &AttentionSpec,
) -> Result<AttentionOutput> {
    use rayon::prelude::*;
    let [b, n, h, d] = q.shape()[..] else {
        unreachable!("q is [B,T,H,D]")
    };
    let (g, dv) = (k.shape()[2], v.shape()[3]);
    let lens: Vec<usize> = segments.iter().map(|s| s.len).collect();
    if b != 1 || caches.len() != lens.len() || lens.iter().sum::<usize>() != n || lens.contains(&0)
    {
        return Err(Error::invalid(
            "kv cache",
            format!(
                "{} caches for segments of {lens:?} tokens in [{b}, {n}]: one row, cut into one non-empty segment per cache",
                caches.len()
            ),
        ));
    }
    per_sequence_spec(spec, "per-sequence caches")?;
    let starts = starts_of(&lens);
    let parts: Vec<AttentionOutput> = caches
        .par_iter_mut()
        .zip(starts.par_iter().zip(&lens))
        .map(|(cache, (&o, &len))| {
            // rows o..o + len of a [1,N,heads,dim] tensor
            let rows = |x: &Tensor, heads: usize, dim: usize| {
                Tensor::new(
                    &[1, len, heads, dim],
                    x.data()[o * heads * dim..][..len * heads * dim].to_vec(),
                )
            };
            cache.append(&rows(k, g, d)?, &rows(v, g, dv)?)?;
            let qi =
                HeadsView::positions_major(&q.data()[o * h * d..][..len * h * d], [1, len, h, d]);
            cache.attend(&qi, spec)
        })
        .collect::<Result<_>>()?;
    joined(&parts, &starts, &lens, [n, h, dv])
}

impl MultiHeadAttention {
    /// Checks that the four projections agree on H query heads and G key/value heads.
    pub fn new(
        q: Linear,
        k: Linear,
        v: Linear,
        o: Linear,
        heads: usize,
        kv_heads: usize,
    ) -> Result<Self> {
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::invalid(
                "n_kv_heads",
                format!("{kv_heads} key/value heads must divide {heads} query heads"),
            ));
        }
        if !q.out_features().is_multiple_of(heads) {
            return Err(Error::shape(
                "wq.weight",
                format!("[a multiple of {heads} heads, _]"),
                q.weight.shape(),
            ));
        }
        let d = q.out_features() / heads;
        if k.out_features() != kv_heads * d {
            return Err(Error::shape(
                "wk.weight",
                format!("[{}, _]", kv_heads * d),
                k.weight.shape(),
            ));
        }
        if v.in_features() != k.in_features() || !v.out_features().is_multiple_of(kv_heads) {
            return Err(Error::shape(
                "wv.weight",
                format!("[a multiple of {kv_heads}, {}]", k.in_features()),
                v.weight.shape(),
            ));
        }
        if o.in_features() != heads * (v.out_features() / kv_heads) {
            return Err(Error::shape(
                "wo.weight",
                format!("[_, {}]", heads * (v.out_features() / kv_heads)),
                o.weight.shape(),
            ));
        }
        Ok(MultiHeadAttention {
            q,
            k,
            v,
            o,
            heads,
            kv_heads,
            q_norm: None,
            k_norm: None,
        })
    }

    /// Adds norms over each query and key head's D values, applied after the
    /// projections and before RoPE (Qwen3, Gemma 3): weights `[D]`.
    pub fn with_head_norms(mut self, q_norm: Norm, k_norm: Norm) -> Result<Self> {
        let d = self.head_dim();
        for (name, n) in [("q_norm.weight", &q_norm), ("k_norm.weight", &k_norm)] {
            n.weight.expect_shape(name, &[Some(d)])?;
        }
        self.q_norm = Some(q_norm);
        self.k_norm = Some(k_norm);
        Ok(self)
    }

    /// D
    pub fn head_dim(&self) -> usize {
        self.q.out_features() / self.heads
    }

    /// Dv
    pub fn value_dim(&self) -> usize {
        self.v.out_features() / self.kv_heads
    }

    /// The size of what each key's value adds to the output through each head, before
    /// its weight: ‖W_O^h · v_{g,s}‖ for values v `[B,S,G,Dv]` (W_O^h: the columns of
    /// W_O that read head h; g the key/value head h reads) → `[B,H,S]`. Kobayashi et
    /// al. (2020) weigh the attention weights by it (the output bias, added whatever
    /// the weights, is left out).
    pub fn value_norms(&self, v: &Tensor) -> Result<Tensor> {
        let (h, g, dv) = (self.heads, self.kv_heads, self.value_dim());
        v.expect_shape("v", &[None, None, Some(g), Some(dv)])?;
        let (b, s) = (v.shape()[0], v.shape()[1]);
        let c = self.o.out_features();
        let mut rows = vec![0f32; c * h * dv];
        for (r, row) in rows.chunks_exact_mut(h * dv).enumerate() {
            self.o.weight_row(r, row);
        }
        let mut out = Tensor::zeros(&[b, h, s]);
        for bi in 0..b {
            for head in 0..h {
                let kv = head / (h / g);
                for j in 0..s {
                    let v_j = &v.data()[((bi * s + j) * g + kv) * dv..][..dv];
                    let sq: f64 = rows
                        .chunks_exact(h * dv)
                        .map(|w| {
                            let y: f32 = w[head * dv..][..dv]
                                .iter()
                                .zip(v_j)
                                .map(|(a, x)| a * x)
                                .sum();
                            f64::from(y) * f64::from(y)
                        })
                        .sum();
                    out.data_mut()[(bi * h + head) * s + j] = sq.sqrt() as f32;
                }
            }
        }
        Ok(out)
    }

    /// x: `[B,T,C]` attends over `context`: `[B,S,Ckv]` (cross-attention), or over itself
    /// when `context` is `None`. Output `out`: `[B,T,C]`; weights, if asked: `[B,H,T,S]`.
    pub fn forward(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        spec: &AttentionSpec,
    ) -> Result<AttentionOutput> {
        let rule = Attend {
            spec: *spec,
            ..Default::default()
        };
        match context {
            Some(m) => {
                x.expect_shape("x", &[None, None, Some(self.q.in_features())])?;
                m.expect_shape(
                    "context",
                    &[Some(x.shape()[0]), None, Some(self.k.in_features())],
                )?;
                self.forward_output(x, Keys::Cross(&self.cross_kv(m)?), &rule)
            }
            None => self.forward_output(x, Keys::Own(None), &rule),
        }
    }

    /// Self-attention with RoPE: queries and keys are rotated by their positions
    /// (`positions`: `[B·T]`) after projection, before the scores.
    pub fn forward_rope(
        &self,
        x: &Tensor,
        spec: &AttentionSpec,
        rope: &Rope,
        positions: &[usize],
    ) -> Result<AttentionOutput> {
        let rule = Attend {
            spec: *spec,
            rope: Some((rope, positions)),
            ..Default::default()
        };
        self.forward_output(x, Keys::Own(None), &rule)
    }

    fn forward_output(&self, x: &Tensor, keys: Keys, rule: &Attend) -> Result<AttentionOutput> {
        let a = self.attend(x, keys, rule, true)?;
        let tape = a.tape.expect("kept");
        Ok(AttentionOutput {
            out: a.y,
            lse: tape.lse,
            weights: a.weights,
        })
    }

    /// The forward: x `[B,T,C]` → y `[B,T,C]` (see the module docs). With `keep`, also
    /// what the backward needs; a cache and `keep` exclude each other (training runs
    /// whole sequences).
    pub fn attend(&self, x: &Tensor, keys: Keys, rule: &Attend, keep: bool) -> Result<Attended> {
        x.expect_shape("x", &[None, None, Some(self.q.in_features())])?;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (h, g, d) = (self.heads, self.kv_heads, self.head_dim());
        // self-attention's three projections read one x: one product job for the three
        let (q, kv) = match keys {
            Keys::Own(_) | Keys::OwnPacked(..) | Keys::OwnVarlen(_) => {
                let [q, k, v] = Linear::forward_each([&self.q, &self.k, &self.v], x)?;
                (q, Some((k, v)))
            }
            Keys::Cross(_) => (self.q.forward(x)?, None),
        };
        let (mut q, q_norm_in) = maybe_norm(self.q_norm.as_ref(), q.reshape(&[b, t, h, d])?, keep)?;
        let (mut own, k_norm_in) = match kv {
            Some((k, v)) => {
                let k = k.reshape(&[b, t, g, d])?;
                let (k, k_norm_in) = maybe_norm(self.k_norm.as_ref(), k, keep)?;
                let v = v.reshape(&[b, t, g, self.value_dim()])?;
                (Some((k, v)), k_norm_in)
            }
            None => (None, None),
        };
        if let Some((rope, positions)) = rule.rope {
            // sequences run side by side are each a call of their own
            let apply = |x: &mut Tensor| match &keys {
                Keys::OwnPacked(_, segments) => {
                    let calls: Vec<(usize, usize)> =
                        segments.iter().map(|s| (s.len, s.rope_len)).collect();
                    rope.apply_calls(x, positions, &calls)
                }
                _ => rope.apply(x, positions),
            };
            apply(&mut q)?;
            if let Some((k, _)) = &mut own {
                apply(k)?;
            }
        }
        let qv = HeadsView::of(&q, "q")?;
        let a = match (keys, &own) {
            (Keys::Own(Some(cache)), Some((k, v))) => {
                if keep {
                    return Err(Error::invalid(
                        "kv cache",
                        "a training forward runs whole sequences, without a cache",
                    ));
                }
                cache.append(k, v)?;
                cache.attend(&qv, &rule.spec)?
            }
            (Keys::OwnPacked(caches, segments), Some((k, v))) => {
                if keep {
                    return Err(Error::invalid(
                        "kv cache",
                        "a training forward runs whole sequences, without a cache",
                    ));
                }
                attend_packed(caches, segments, &q, k, v, &rule.spec)?
            }
            (Keys::OwnVarlen(lens), Some((k, v))) => {
                if keep {
                    return Err(Error::invalid(
                        "varlen sequences",
                        "a training forward runs a padded batch, not varlen sequences",
                    ));
                }
                attend_varlen(lens, &q, k, v, &rule.spec)?
            }
            (Keys::Own(_), Some((k, v))) => attention(&q, k, v, &rule.spec)?,
            (Keys::Cross(kv), _) => attention(&q, &kv.k, &kv.v, &rule.spec)?,
            (Keys::Own(_) | Keys::OwnPacked(..) | Keys::OwnVarlen(_), None) => {
                unreachable!("own keys are projected above")
            }
        };
        let merged = a.out.reshape(&[b, t, h * self.value_dim()])?;
        let y = self.o.forward(&merged)?;
        let tape = keep.then_some(AttnTape {
            q,
            q_norm_in,
            k_norm_in,
            own_kv: own,
            merged,
            lse: a.lse,
        });
        Ok(Attended {
            y,
            weights: a.weights,
            tape,
        })
    }

    /// Backward of [`MultiHeadAttention::attend`] with `keep`: x as given to it, `cross`
    /// the same keys and values for cross-attention, the same `rule`, and dy `[B,T,C]`.
    /// **Accumulates** into `grads` (a tree shaped as this layer).
    pub fn backward(
        &self,
        x: &Tensor,
        cross: Option<&CrossKv>,
        rule: &Attend,
        tape: AttnTape,
        dy: &Tensor,
        grads: &mut MultiHeadAttention,
    ) -> Result<AttnGrads> {
        let AttnTape {
            q,
            q_norm_in,
            k_norm_in,
            own_kv,
            merged,
            lse,
        } = tape;
        let (b, t, h, d) = (q.shape()[0], q.shape()[1], self.heads, self.head_dim());
        let dv_width = self.value_dim();
        // y = W_O·merged
        let d_merged = self.o.backward(&merged, dy, &mut grads.o)?;
        let fwd = AttentionOutput {
            out: merged.reshape(&[b, t, h, dv_width])?,
            lse,
            weights: None,
        };
        let (k, v) = match (&own_kv, cross) {
            (Some((k, v)), _) => (k, v),
            (None, Some(c)) => (&c.k, &c.v),
            (None, None) => {
                return Err(Error::invalid(
                    "cross",
                    "a cross-attention backward needs the keys and values of its forward",
                ))
            }
        };
        let d_merged = d_merged.reshape(&[b, t, h, dv_width])?;
        let d_weights = match rule.weight_grads {
            true => Some(weight_grads(&d_merged, v)?),
            false => None,
        };
        // merged = attention(q, k, v)
        let ag = attention_backward(&q, k, v, &fwd, &d_merged, &rule.spec, rule.bias_grad)?;
        let (mut dq, mut dk) = (ag.dq, ag.dk);
        // q, k = RoPE(·): rotate the gradients back
        if let Some((rope, positions)) = rule.rope {
            rope.backward(&mut dq, positions)?;
            if own_kv.is_some() {
                rope.backward(&mut dk, positions)?;
            }
        }
        // q = n_q(·), k = n_k(·) (self-attention's; cross_kv_backward undoes the cross k's)
        let dq = maybe_norm_backward(self.q_norm.as_ref(), q_norm_in, dq, grads.q_norm.as_mut())?;
        if own_kv.is_some() {
            dk = maybe_norm_backward(self.k_norm.as_ref(), k_norm_in, dk, grads.k_norm.as_mut())?;
        }
        // q = W_Q·x
        let mut dx = self
            .q
            .backward(x, &dq.reshape(&[b, t, h * d])?, &mut grads.q)?;
        let d_cross = match own_kv {
            // k = W_K·x, v = W_V·x: x feeds all three projections, so their dx add up
            Some(_) => {
                let s = dk.shape()[1];
                let g = self.kv_heads;
                let dk = dk.reshape(&[b, s, g * d])?;
                self.k.backward_add(x, &dk, &mut grads.k, &mut dx)?;
                let dv = ag.dv.reshape(&[b, s, g * dv_width])?;
                self.v.backward_add(x, &dv, &mut grads.v, &mut dx)?;
                None
            }
            None => Some(CrossKv { k: dk, v: ag.dv }),
        };
        Ok(AttnGrads {
            dx,
            d_cross,
            dbias: ag.dbias,
            d_weights,
        })
    }

    /// Keys and values of the encoder output `memory`: `[B,S,Ckv]`, computed once per
    /// source.
    pub fn cross_kv(&self, memory: &Tensor) -> Result<CrossKv> {
        memory.expect_shape("encoder output", &[None, None, Some(self.k.in_features())])?;
        let (b, s, g) = (memory.shape()[0], memory.shape()[1], self.kv_heads);
        let k = self
            .k
            .forward(memory)?
            .reshape(&[b, s, g, self.head_dim()])?;
        Ok(CrossKv {
            k: maybe_norm(self.k_norm.as_ref(), k, false)?.0,
            v: self
                .v
                .forward(memory)?
                .reshape(&[b, s, g, self.value_dim()])?,
        })
    }

    /// Backward of [`MultiHeadAttention::cross_kv`]: the keys' and values' gradients →
    /// the memory's `[B,S,Ckv]`; **accumulates** into `grads.k` and `grads.v`.
    pub fn cross_kv_backward(
        &self,
        memory: &Tensor,
        d: CrossKv,
        grads: &mut MultiHeadAttention,
    ) -> Result<Tensor> {
        let (b, s) = (memory.shape()[0], memory.shape()[1]);
        let flat = |t: Tensor| {
            let w = t.shape()[2] * t.shape()[3];
            t.reshape(&[b, s, w])
        };
        // k = n_k(W_K·m): the norm's input and statistics are recomputed, not kept
        let dk = match &self.k_norm {
            Some(_) => {
                let k = self.k.forward(memory)?.reshape(d.k.shape())?;
                let kept = maybe_norm(self.k_norm.as_ref(), k, true)?.1;
                maybe_norm_backward(self.k_norm.as_ref(), kept, d.k, grads.k_norm.as_mut())?
            }
            None => d.k,
        };
        // k = W_K·m, v = W_V·m
        let mut dm = self.k.backward(memory, &flat(dk)?, &mut grads.k)?;
        self.v
            .backward_add(memory, &flat(d.v)?, &mut grads.v, &mut dm)?;
        Ok(dm)
    }
}
