//! The one forward of every model: embeddings, a stack of [`Block`]s, the head. The
//! same code runs inference (with a KV cache when decoding) and training (keeping, per
//! layer, what the backward needs), and returns attention weights when asked.
//!
//! ```text
//! x₀ = k·table[ids] (+ pos[positions]) (+ types[type ids]);  x₀ = norm(x₀) if the arch asks   [B,T,C]
//! x  = block_L(… block_1(x₀))          self-attention (+ cross-attention) + FFN, residuals
//! h  = final_norm(x) (pre-norm stacks)
//! logits = head(h)                                                                          [B,T,V]
//! ```

use crate::attention::{AttentionSpec, Bias, CausalAlign, Kernel, KvCache, LayerKv};
use crate::batch::limit_positions;
use crate::block::{Attend, BlockTape, CrossKv, Keys, LayerRule, Segment};
use crate::error::{Error, Result};
use crate::layers::linear::product_into;
use crate::layers::{maybe_norm, Embedding, NormCache};
use crate::models::net::arch::{Arch, Head, Position, StackDims};
use crate::models::net::weights::{Stack, Weights};
use crate::position::sinusoidal::sinusoidal_value;
use crate::position::{alibi_slopes, RelativeBias, Rope, RopeLayout};
use crate::tensor::Tensor;

/// Which stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Encoder,
    Decoder,
}

/// A model's parts as the forward and backward read them, borrowed field by field so
/// that a backward can hold them while it writes the gradients.
#[derive(Clone, Copy)]
pub(crate) struct Net<'m> {
    pub arch: &'m Arch,
    pub w: &'m Weights,
    pub kernel: Kernel,
    /// `[V]` a fixed bias added to the logits (Marian's `final_logits_bias`)
    pub logits_bias: Option<&'m Tensor>,
    /// The backward also returns every attention map's gradient (attribution).
    pub map_grads: bool,
}

/// The KV caches a stack run reads and extends.
pub(crate) enum Caches<'c, 'r> {
    /// Whole sequences, no cache (training, encoders, a plain forward).
    None,
    /// One cache for the batch: a layer's keys and values for every row.
    Batch(&'c mut [LayerKv]),
    /// The one row holds segments of new tokens one after another, segment i
    /// continuing the sequence cached in `caches[i]`.
    Packed(&'c mut [&'r mut KvCache], &'c [Segment]),
    /// No cache: the one row holds whole sequences of these lengths one after another
    /// (a varlen batch), each attending to its own tokens.
    Varlen(&'c [usize]),
}

/// One stack run's inputs.
#[derive(Clone, Debug)]
pub(crate) struct StackInput {
    /// `[B·T]`
    pub ids: Vec<usize>,
    /// `[B·T]` token types (BERT segments), all 0 when absent
    pub types: Option<Vec<usize>>,
    pub b: usize,
    pub t: usize,
    /// `[B·T]` position of each token (inside any position table)
    pub positions: Vec<usize>,
    /// `[B, past + T]` which keys are real
    pub key_padding: Vec<bool>,
    /// positions cached before these tokens
    pub past: usize,
}

/// An encoder's output as the decoder consumes it.
#[derive(Clone, Debug)]
pub struct Encoded {
    /// `[B, S, C]`
    pub hidden: Tensor,
    /// `[B, S]` real source tokens
    pub key_padding: Vec<bool>,
    /// Cross-attention keys and values for each decoder layer, computed once per source.
    pub cross: Vec<CrossKv>,
}

/// What a stack run returns.
pub(crate) struct StackOut {
    /// `[B,T,C]`
    pub h: Tensor,
    pub tape: Option<StackTape>,
    /// per layer `[B,H,T,S]`, when asked for
    pub weights: Vec<Tensor>,
    pub cross_weights: Vec<Tensor>,
}

/// What a stack's backward needs.
pub(crate) struct StackTape {
    pub input: StackInput,
    /// the embedding norm's input and statistics
    pub embed_norm: Option<(Tensor, NormCache)>,
    pub layers: Vec<BlockTape>,
    /// the final norm's input and statistics
    pub final_norm: Option<(Tensor, NormCache)>,
}

/// What the head's backward needs.
pub(crate) struct HeadTape {
    /// `[B,T,C]` the head's input
    pub h: Tensor,
    /// masked LM: the dense output (before the activation), the norm's input and
    /// statistics, and the norm's output (what meets the table)
    pub mlm: Option<(Tensor, Tensor, NormCache, Tensor)>,
    /// `[B,T,V]` the soft-capped logits, for the cap's derivative
    pub capped: Option<Tensor>,
}

/// Owned values that a stack's attention rules borrow.
pub(crate) struct Env {
    rope: Option<Rope>,
    /// local layers' RoPE, when their base differs (Gemma 3)
    local_rope: Option<Rope>,
    slopes: Vec<f32>,
    /// `[1, H, T, S]` a dense score bias (T5's relative bias, an encoder's ALiBi)
    dense: Option<Tensor>,
}

impl<'m> Net<'m> {
    pub fn stack_weights(&self, side: Side) -> &'m Stack {
        let s = match side {
            Side::Encoder => &self.w.encoder,
            Side::Decoder => &self.w.decoder,
        };
        s.as_ref().expect("the arch has this stack")
    }

    pub fn dims(&self, side: Side) -> StackDims {
        match side {
            Side::Encoder => self.arch.encoder,
            Side::Decoder => self.arch.decoder,
        }
        .expect("the arch has this stack")
    }

    /// The token table `side` reads.
    pub fn table(&self, side: Side) -> &'m Embedding {
        match (side, &self.w.src_embed_tokens) {
            (Side::Encoder, Some(own)) => own,
            _ => &self.w.embed_tokens,
        }
    }

    /// √C or 1.
    pub fn embed_scale(&self) -> f32 {
        if self.arch.embed.scale {
            (self.arch.d_model as f32).sqrt()
        } else {
            1.0
        }
    }

    /// The positions of a `[B, T]` batch with mask `mask` whose rows already hold
    /// `starts` real tokens: slots 0..T (BERT) or counts of real tokens, fitted to the
    /// position table (a real token past it is an error).
    pub fn positions(&self, mask: &[bool], t: usize, starts: &[usize]) -> Result<Vec<usize>> {
        let mut p = if self.arch.embed.slot_positions {
            (0..mask.len()).map(|i| i % t).collect()
        } else {
            crate::batch::real_positions(mask, t, starts)
        };
        let offset = self.arch.embed.position_offset;
        if offset > 0 {
            // RoBERTa: padding_idx + 1 + count for a real token, padding_idx for padding
            for (p, &real) in p.iter_mut().zip(mask) {
                *p = if real { *p + offset } else { offset - 1 };
            }
        }
        if let Some(max) = self.arch.max_positions() {
            let all = vec![true; mask.len()];
            let real = if self.arch.embed.slot_positions {
                &all
            } else {
                mask
            };
            limit_positions(&mut p, real, max)?;
        }
        Ok(p)
    }

    pub fn env(&self, side: Side, input: &StackInput) -> Result<Env> {
        let dims = self.dims(side);
        let (t, s) = (input.t, input.past + input.t);
        let dense = match self.arch.position {
            Position::Relative {
                buckets: _,
                max_distance,
            } => {
                let table = self
                    .stack_weights(side)
                    .rel_bias
                    .as_ref()
                    .expect("a relative-position stack has its table");
                let rel =
                    RelativeBias::new(table.weight.clone(), side == Side::Encoder, max_distance)?;
                Some(rel.compute(t, s, input.past))
            }
            // ALiBi in an encoder is symmetric: −slope·|i − j| (the causal form
            // slope·(j − i) would make a bidirectional stack prefer later keys).
            Position::Alibi if side == Side::Encoder => {
                let slopes = alibi_slopes(dims.heads);
                Some(Tensor::from_fn(&[1, dims.heads, t, s], |k| {
                    let (h, i, j) = (k / (t * s), k / s % t, k % s);
                    -slopes[h] * i.abs_diff(j) as f32
                }))
            }
            _ => None,
        };
        let rope = match &self.arch.position {
            Position::Rope {
                theta,
                scaling,
                rotary_dim,
                ..
            } => {
                let rotary = rotary_dim.unwrap_or(dims.head_dim);
                let rope = Rope::partial(dims.head_dim, rotary, *theta, RopeLayout::HalfSplit)?;
                Some(rope.with_scaling(scaling.clone())?)
            }
            _ => None,
        };
        // local layers rotate with their own base and no scaling (Gemma 3's
        // `rope_local_base_freq`, as transformers builds its local rotary embedding)
        let local_rope = match (&self.arch.position, self.arch.attention.local_rope_theta) {
            (Position::Rope { rotary_dim, .. }, Some(theta)) => {
                let rotary = rotary_dim.unwrap_or(dims.head_dim);
                Some(Rope::partial(
                    dims.head_dim,
                    rotary,
                    theta,
                    RopeLayout::HalfSplit,
                )?)
            }
            _ => None,
        };
        Ok(Env {
            rope,
            local_rope,
            slopes: alibi_slopes(dims.heads),
            dense,
        })
    }

    /// Layer `l`'s rules for `side`, borrowing from `env` and `input`; `cross_padding`
    /// is the source's `[B, S]` mask for a decoder that reads an encoder.
    pub fn rule<'a>(
        &self,
        side: Side,
        env: &'a Env,
        input: &'a StackInput,
        cross_padding: Option<&'a [bool]>,
        l: usize,
        weights: bool,
    ) -> Result<LayerRule<'a>> {
        let a = &self.arch.attention;
        let mut scale = a.scale;
        if a.scale_by_layer {
            let d = self.dims(side).head_dim as f32;
            scale = Some(scale.unwrap_or(1.0 / d.sqrt()) / (l + 1) as f32);
        }
        let base = AttentionSpec {
            scale,
            softcap: a.softcap,
            want_weights: weights,
            kernel: self.kernel,
            ..Default::default()
        };
        let bias = match (&env.dense, &self.arch.position, side) {
            (Some(t), _, _) => Some(Bias::Dense(t.as_broadcast()?)),
            (None, Position::Alibi, Side::Decoder) => Some(Bias::Alibi {
                slopes: &env.slopes,
            }),
            _ => None,
        };
        // one stack per model that has local layers: a decoder's, or an encoder's
        let local = a.is_local(l);
        let spec = AttentionSpec {
            causal: (side == Side::Decoder).then_some(CausalAlign::BottomRight),
            window: if local { a.window } else { None },
            key_padding: real_keys(&input.key_padding),
            bias,
            ..base
        };
        let rope = match (&env.local_rope, local) {
            (Some(r), true) => Some(r),
            _ => env.rope.as_ref(),
        };
        Ok(LayerRule {
            residual: self.arch.residual,
            attend: Attend {
                spec,
                rope: rope.map(|r| (r, input.positions.as_slice())),
                bias_grad: matches!(self.arch.position, Position::Relative { .. }),
                weight_grads: self.map_grads,
            },
            cross: Attend {
                spec: AttentionSpec {
                    key_padding: cross_padding.and_then(real_keys),
                    ..base
                },
                weight_grads: self.map_grads,
                ..Default::default()
            },
        })
    }

    /// Embeddings, the layers, the final norm. `caches`: the KV caches when decoding;
    /// `enc`: the encoder's output for a decoder that reads one.
    pub fn run_stack(
        &self,
        side: Side,
        input: StackInput,
        mut caches: Caches,
        enc: Option<&Encoded>,
        keep: bool,
        weights: bool,
    ) -> Result<StackOut> {
        let stack = self.stack_weights(side);
        let (b, t, c) = (input.b, input.t, self.arch.d_model);
        let x = self.embed(side, &input)?;
        let (x, embed_norm) = maybe_norm(stack.embed_norm.as_ref(), x, keep)?;
        let mut x = x.reshape(&[b, t, c])?;
        let env = self.env(side, &input)?;
        let cross_padding = enc.map(|e| e.key_padding.as_slice());
        let mut out = StackOut {
            h: Tensor::zeros(&[0]),
            tape: None,
            weights: Vec::new(),
            cross_weights: Vec::new(),
        };
        let mut tapes = Vec::new();
        for (l, block) in stack.layers.iter().enumerate() {
            let rule = self.rule(side, &env, &input, cross_padding, l, weights)?;
            let own = match &mut caches {
                Caches::None => Keys::Own(None),
                Caches::Batch(c) => Keys::Own(Some(&mut c[l])),
                Caches::Packed(rows, segments) => Keys::OwnPacked(
                    rows.iter_mut().map(|c| &mut c.layers[l]).collect(),
                    segments,
                ),
                Caches::Varlen(lens) => Keys::OwnVarlen(lens),
            };
            let cross = enc.map(|e| &e.cross[l]);
            let r = block.forward(&rule, x, own, cross, keep)?;
            x = r.x;
            tapes.extend(r.tape);
            out.weights.extend(r.weights);
            out.cross_weights.extend(r.cross_weights);
        }
        let (x, final_norm) = maybe_norm(stack.final_norm.as_ref(), x, keep)?;
        out.h = x;
        out.tape = keep.then_some(StackTape {
            input,
            embed_norm,
            layers: tapes,
            final_norm,
        });
        Ok(out)
    }

    /// x₀ = k·table[ids] + positions + token types: `[B·T, C]`, before any embedding norm.
    fn embed(&self, side: Side, input: &StackInput) -> Result<Tensor> {
        let stack = self.stack_weights(side);
        let c = self.arch.d_model;
        let mut x = self.table(side).forward(&input.ids)?;
        let k = self.embed_scale();
        if k != 1.0 {
            x.data_mut().iter_mut().for_each(|v| *v *= k);
        }
        if let Some(table) = &stack.embed_positions {
            x.add_assign(&table.forward(&input.positions)?)?;
        }
        if let Position::Sinusoidal { layout, .. } = self.arch.position {
            for (row, &p) in x.data_mut().chunks_exact_mut(c).zip(&input.positions) {
                for (j, v) in row.iter_mut().enumerate() {
                    *v += sinusoidal_value(p, j, c, layout);
                }
            }
        }
        if let Some(types) = &stack.embed_types {
            match &input.types {
                Some(ids) => x.add_assign(&types.forward(ids)?)?,
                // all segment 0: one row, added everywhere
                None => {
                    let row = types.forward(&[0])?;
                    for r in x.data_mut().chunks_exact_mut(c) {
                        r.iter_mut().zip(row.data()).for_each(|(a, b)| *a += b);
                    }
                }
            }
        }
        Ok(x)
    }

    /// The encoder's output and each decoder layer's cross keys and values.
    pub fn encoded(&self, hidden: Tensor, key_padding: Vec<bool>) -> Result<Encoded> {
        let cross = self
            .w
            .decoder
            .iter()
            .flat_map(|dec| &dec.layers)
            .filter_map(|l| l.cross.as_ref())
            .map(|c| c.cross_kv(&hidden))
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoded {
            hidden,
            key_padding,
            cross,
        })
    }

    /// h `[B,T,C]` → logits `[B,T,V]` (see [`Head`]); the last hidden states themselves
    /// for a model without a head.
    pub fn head(&self, h: Tensor, keep: bool) -> Result<(Tensor, Option<HeadTape>)> {
        let hw = &self.w.head;
        let table = &self.w.embed_tokens.weight;
        let (logits, mlm) = match self.arch.head {
            Head::None => {
                // the hidden states are the output; a kept tape lets a gradient with
                // respect to them flow back (attribution of a sentence encoder)
                let tape = keep.then(|| HeadTape {
                    h: h.clone(),
                    mlm: None,
                    capped: None,
                });
                return Ok((h, tape));
            }
            Head::Lm { tied, rescale, .. } => {
                let s = if rescale {
                    (self.arch.d_model as f32).powf(-0.5)
                } else {
                    1.0
                };
                // an untied head is a linear layer, in its dtype; a tied one reads the
                // token table in f32
                let logits = match (&hw.lm_head, tied) {
                    (Some(lin), false) => lin.project(&h, s)?,
                    _ if self.w.embed_tokens.stored().is_some() => {
                        return Err(Error::Unsupported(
                            "a tied head over a token table held as stored (a loader gives such a table a head of its own)".into(),
                        ))
                    }
                    _ => project(&h, table, s)?,
                };
                (logits, None)
            }
            Head::MaskedLm { activation, .. } => {
                let (dense, norm) = match (&hw.dense, &hw.norm) {
                    (Some(d), Some(n)) => (d, n),
                    _ => unreachable!("a masked-LM arch builds its transform"),
                };
                let z = dense.forward(&h)?;
                let mut a = z.clone();
                activation.apply_slice(a.data_mut());
                let mut stats = NormCache::default();
                let n = norm.forward_with_cache(&a, &mut stats)?;
                let mut logits = project(&n, table, 1.0)?;
                add_rows(&mut logits, hw.bias.as_ref().expect("masked-LM bias"));
                (logits, Some((z, a, stats, n)))
            }
        };
        let mut logits = logits;
        if let Some(b) = self.logits_bias {
            add_rows(&mut logits, b);
        }
        if let Some(cap) = self.arch.logit_softcap {
            logits
                .data_mut()
                .iter_mut()
                .for_each(|z| *z = cap * crate::ops::fastmath::tanh(*z / cap));
        }
        let capped = (keep && self.arch.logit_softcap.is_some()).then(|| logits.clone());
        let tape = keep.then_some(HeadTape { h, mlm, capped });
        Ok((logits, tape))
    }
}

/// A key padding mask, or none when every key is real (so the kernels skip the test).
fn real_keys(mask: &[bool]) -> Option<&[bool]> {
    mask.contains(&false).then_some(mask)
}

/// s·h·Wᵀ: h `[.., C]`, W `[V, C]` (read transposed in place) → `[.., V]`.
pub(crate) fn project(h: &Tensor, w: &Tensor, s: f32) -> Result<Tensor> {
    let mut shape = h.shape().to_vec();
    *shape.last_mut().expect("h has a last axis") = w.shape()[0];
    let mut out = Tensor::zeros(&shape);
    product_into(&mut out, h, w, s, false)?;
    Ok(out)
}

/// Adds `b` `[V]` (any shape of V elements) to every row of x `[.., V]`.
pub(crate) fn add_rows(x: &mut Tensor, b: &Tensor) {
    let v = b.numel();
    for row in x.data_mut().chunks_exact_mut(v) {
        row.iter_mut().zip(b.data()).for_each(|(a, c)| *a += c);
    }
}
