//! The residual block every stack is made of: self-attention, then (in a decoder that
//! reads an encoder) cross-attention, then the feed-forward network, each a sub-layer
//! wrapped by its norm and a residual connection as [`Residual`] says.
//!
//! A residual `x + f(·)` has no backward of its own: its gradient flows to both terms,
//! so the branch's input gradient is added to the stream's. In a parallel block both
//! branches read x, so d_out reaches each branch and x gathers all three gradients.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::attention::{Attend, AttnTape, CrossKv, Keys, MultiHeadAttention};
use crate::error::{Error, Result};
use crate::layers::{
    maybe_norm, maybe_norm_backward, FeedForward, FeedForwardCache, Norm, NormCache, NormTape,
};
use crate::tensor::Tensor;

/// Where each sub-layer's norm sits relative to its branch f and the residual.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Residual {
    /// out = x + f(norm(x)): GPT-2, Llama, T5, BLOOM; the stack ends with a final norm.
    PreNorm,
    /// out = norm(x + f(x)): the original Transformer, BERT, Marian.
    PostNorm,
    /// out = norm(x) + f(norm(x)): BLOOM's `apply_residual_connection_post_layernorm`.
    PreNormFromNormed,
    /// out = x + attn(norm₁(x)) + ffn(norm₂(x)): both branches read the layer's input
    /// (GPT-NeoX's `use_parallel_residual`, GPT-J); the stack ends with a final norm.
    /// No cross-attention.
    Parallel,
    /// out = x + post(f(norm(x))): a second norm on each branch's output before the
    /// residual (Gemma 2 and 3's `post_attention_layernorm` / `post_feedforward_layernorm`);
    /// the stack ends with a final norm.
    Sandwich,
}

crate::module! {
    /// One layer's parameters.
    #[derive(Clone, Debug)]
    pub struct Block {
        /// absent in ModernBERT's first layer, whose input is the embeddings' norm
        pub attn_norm: Option<Norm>,
        pub attn: MultiHeadAttention,
        /// present exactly in a decoder that reads an encoder
        pub cross_norm: Option<Norm>,
        pub cross: Option<MultiHeadAttention>,
        pub ffn_norm: Norm,
        pub ffn: FeedForward,
        /// the norms on the branches' outputs, present exactly in a sandwich block
        pub attn_post_norm: Option<Norm>,
        pub ffn_post_norm: Option<Norm>,
    }
}

impl Block {
    /// Every projection of the layer: attention, cross-attention, FFN.
    pub fn linears_mut(&mut self) -> impl Iterator<Item = &mut crate::layers::Linear> {
        let attentions = std::iter::once(&mut self.attn).chain(&mut self.cross);
        attentions
            .flat_map(|a| a.linears_mut())
            .chain(self.ffn.linears_mut())
    }
}

/// A layer's rules: the residual arrangement and each attention's [`Attend`].
#[derive(Clone, Copy, Debug)]
pub struct LayerRule<'a> {
    pub residual: Residual,
    pub attend: Attend<'a>,
    /// cross-attention's rule (source key padding), for a decoder reading an encoder
    pub cross: Attend<'a>,
}

/// What the backward of a sub-layer's wrapping needs.
#[derive(Clone, Debug)]
struct ResTape {
    /// the norm's input: x (pre-norm) or r = x + f(x) (post-norm)
    norm_in: Tensor,
    stats: NormCache,
    /// the branch's input: norm(x) (pre-norm) or x (post-norm)
    branch_in: Tensor,
}

/// What [`Block::backward`] needs from [`Block::forward`].
#[derive(Clone, Debug)]
pub struct BlockTape {
    attn: (ResTape, AttnTape),
    cross: Option<(ResTape, AttnTape)>,
    ffn: (ResTape, FeedForwardCache),
    /// a sandwich block's post norms: their inputs (the branches' outputs) and statistics
    attn_post: Option<NormTape>,
    ffn_post: Option<NormTape>,
}

impl BlockTape {
    /// The self-attention's values `[B,S,G,Dv]`.
    #[cfg_attr(not(feature = "models"), allow(dead_code))]
    pub(crate) fn self_values(&self) -> Option<&Tensor> {
        self.attn.1.values()
    }
}

/// One layer's forward results.
pub struct LayerOut {
    /// `[B,T,C]`
    pub x: Tensor,
    pub tape: Option<BlockTape>,
    /// `[B,H,T,S]` self-attention weights, when the rule's spec asks for them
    pub weights: Option<Tensor>,
    /// `[B,H,T,S]` cross-attention weights, likewise
    pub cross_weights: Option<Tensor>,
}

/// What a layer's backward returns besides the parameters' gradients.
pub struct LayerGrads {
    /// `[B,T,C]`
    pub dx: Tensor,
    /// The cross-attention's keys' and values' gradients.
    pub d_cross: Option<CrossKv>,
    /// The self-attention's dense bias gradient, when the rule asks for it.
    pub dbias: Option<Tensor>,
    /// `[B,H,T,S]`: the gradients of the self-attention's and the cross-attention's
    /// softmax weights, when the rule asks for them.
    pub d_weights: Option<Tensor>,
    pub d_cross_weights: Option<Tensor>,
}

/// Runs one sub-layer: the norm and residual around `f` (x → (y, branch results)); no
/// norm is the identity.
fn sublayer<T>(
    norm: Option<&Norm>,
    residual: Residual,
    x: Tensor,
    keep: bool,
    f: impl FnOnce(&Tensor) -> Result<(Tensor, T)>,
) -> Result<(Tensor, Option<ResTape>, T)> {
    let mut stats = keep.then(NormCache::default);
    if residual == Residual::PostNorm {
        // r = x + f(x); out = norm(r)
        let (mut r, inner) = f(&x)?;
        r.add_assign(&x)?;
        let out = normed(norm, &r, stats.as_mut())?;
        let tape = stats.map(|stats| ResTape {
            norm_in: r,
            stats,
            branch_in: x,
        });
        return Ok((out, tape, inner));
    }
    // a = norm(x); out = x + f(a), or a + f(a), or f(a) alone (a parallel block adds
    // its branches to x itself)
    let a = normed(norm, &x, stats.as_mut())?;
    let (mut out, inner) = f(&a)?;
    match residual {
        Residual::PreNorm | Residual::Sandwich => out.add_assign(&x)?,
        Residual::PreNormFromNormed => out.add_assign(&a)?,
        // (post-norm returned above)
        Residual::Parallel | Residual::PostNorm => {}
    }
    let tape = stats.map(|stats| ResTape {
        norm_in: x,
        stats,
        branch_in: a,
    });
    Ok((out, tape, inner))
}

/// norm(x), or x itself without a norm.
fn normed(norm: Option<&Norm>, x: &Tensor, stats: Option<&mut NormCache>) -> Result<Tensor> {
    match norm {
        Some(n) => n.forward_impl(x, stats),
        None => Ok(x.clone()),
    }
}

/// Backward of [`sublayer`]: d_out → dx, with `f_back` mapping (branch input, dy) to
/// the branch input's gradient. **Accumulates** into the norm's gradient.
fn sublayer_backward(
    norm: Option<&Norm>,
    residual: Residual,
    tape: &ResTape,
    d_out: Tensor,
    grads: Option<&mut Norm>,
    f_back: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let ResTape {
        norm_in,
        stats,
        branch_in,
    } = tape;
    // the norm's backward, or the identity's
    let norm = |dy: &Tensor| match (norm, grads) {
        (Some(n), Some(g)) => n.backward(dy, norm_in, stats, g),
        _ => Ok(dy.clone()),
    };
    Ok(match residual {
        Residual::PostNorm => {
            // out = norm(r), r = x + f(x)
            let d_r = norm(&d_out)?;
            let mut dx = f_back(branch_in, &d_r)?;
            dx.add_assign(&d_r)?;
            dx
        }
        Residual::PreNorm | Residual::Sandwich => {
            // out = x + f(a), a = norm(x) (a sandwich's f ends with its post norm)
            let d_a = f_back(branch_in, &d_out)?;
            let mut dx = norm(&d_a)?;
            dx.add_assign(&d_out)?;
            dx
        }
        Residual::PreNormFromNormed => {
            // out = a + f(a), a = norm(x)
            let mut d_a = f_back(branch_in, &d_out)?;
            d_a.add_assign(&d_out)?;
            norm(&d_a)?
        }
        Residual::Parallel => {
            // out = f(a), a = norm(x): the branch alone
            let d_a = f_back(branch_in, &d_out)?;
            norm(&d_a)?
        }
    })
}

/// Backward of a branch's post norm (a sandwich block's), or dy itself without one.
fn post_backward<'a>(
    norm: Option<&Norm>,
    tape: Option<NormTape>,
    dy: &'a Tensor,
    grads: Option<&mut Norm>,
) -> Result<Cow<'a, Tensor>> {
    Ok(match norm {
        None => Cow::Borrowed(dy),
        Some(_) => Cow::Owned(maybe_norm_backward(norm, tape, dy.clone(), grads)?),
    })
}

impl Block {
    /// x `[B,T,C]` → `[B,T,C]`. `own`: where self-attention keeps its keys and values,
    /// [`Keys::Own`] (with this layer's cache when decoding), [`Keys::OwnPacked`] or
    /// [`Keys::OwnVarlen`];
    /// `cross`: the encoder's keys and values for this layer's cross-attention. With
    /// `keep`, also what [`Block::backward`] needs.
    pub fn forward(
        &self,
        rule: &LayerRule,
        x: Tensor,
        own: Keys,
        cross: Option<&CrossKv>,
        keep: bool,
    ) -> Result<LayerOut> {
        let parallel = rule.residual == Residual::Parallel;
        if parallel && self.cross.is_some() {
            return Err(Error::Unsupported(
                "a parallel residual in a layer with cross-attention".into(),
            ));
        }
        // a parallel block's FFN reads the layer's input, which its output adds to
        let input = parallel.then(|| x.clone());
        let (x, attn_res, attn) = sublayer(self.attn_norm.as_ref(), rule.residual, x, keep, |a| {
            let r = self.attn.attend(a, own, &rule.attend, keep)?;
            let (y, post) = maybe_norm(self.attn_post_norm.as_ref(), r.y, keep)?;
            Ok((y, (r.tape, r.weights, post)))
        })?;
        let (x, cross_parts) = match (&self.cross_norm, &self.cross, cross) {
            (Some(norm), Some(layer), Some(kv)) => {
                let (x, res, inner) = sublayer(Some(norm), rule.residual, x, keep, |a| {
                    let r = layer.attend(a, Keys::Cross(kv), &rule.cross, keep)?;
                    Ok((r.y, (r.tape, r.weights)))
                })?;
                (x, Some((res, inner)))
            }
            _ => (x, None),
        };
        let (ffn_in, attn_branch) = match input {
            Some(input) => (input, Some(x)),
            None => (x, None),
        };
        let residual_in = attn_branch.is_some().then(|| ffn_in.clone());
        let (mut x, ffn_res, ffn_cache) =
            sublayer(Some(&self.ffn_norm), rule.residual, ffn_in, keep, |a| {
                let mut cache = keep.then(FeedForwardCache::default);
                let y = match &mut cache {
                    Some(c) => self.ffn.forward_with_cache(a, c)?,
                    None => self.ffn.forward(a)?,
                };
                let (y, post) = maybe_norm(self.ffn_post_norm.as_ref(), y, keep)?;
                Ok((y, (cache, post)))
            })?;
        if let (Some(branch), Some(input)) = (attn_branch, residual_in) {
            // x + attn(norm₁(x)) + ffn(norm₂(x))
            x.add_assign(&branch)?;
            x.add_assign(&input)?;
        }
        let (attn_tape, weights, attn_post) = attn;
        let (ffn_cache, ffn_post) = ffn_cache;
        let (cross_tape, cross_weights) = match cross_parts {
            Some((res, (tape, w))) => (res.zip(tape), w),
            None => (None, None),
        };
        let tape = match (attn_res.zip(attn_tape), ffn_res.zip(ffn_cache)) {
            (Some(attn), Some(ffn)) => Some(BlockTape {
                attn,
                cross: cross_tape,
                ffn,
                attn_post,
                ffn_post,
            }),
            _ => None,
        };
        Ok(LayerOut {
            x,
            tape,
            weights,
            cross_weights,
        })
    }

    /// Backward of [`Block::forward`] (with `keep`, the same rule and cross keys):
    /// d_out `[B,T,C]` → dx; **accumulates** into `grads` (a tree shaped as this block).
    pub fn backward(
        &self,
        rule: &LayerRule,
        tape: BlockTape,
        cross: Option<&CrossKv>,
        d_out: Tensor,
        grads: &mut Block,
    ) -> Result<LayerGrads> {
        let BlockTape {
            attn,
            cross: cross_tape,
            ffn,
            attn_post,
            ffn_post,
        } = tape;
        let (ffn_res, ffn_cache) = ffn;
        let parallel = rule.residual == Residual::Parallel;
        // a parallel block: d_out reaches the FFN branch, the attention branch and x
        let d_branch = parallel.then(|| d_out.clone());
        let d_ffn = sublayer_backward(
            Some(&self.ffn_norm),
            rule.residual,
            &ffn_res,
            d_out,
            Some(&mut grads.ffn_norm),
            |a, dy| {
                let post = self.ffn_post_norm.as_ref();
                let dy = post_backward(post, ffn_post, dy, grads.ffn_post_norm.as_mut())?;
                self.ffn.backward(&dy, a, &ffn_cache, &mut grads.ffn)
            },
        )?;
        let (mut dx, d_input) = match d_branch {
            Some(d_out) => (d_out, Some(d_ffn)),
            None => (d_ffn, None),
        };
        let (mut d_cross, mut d_cross_weights) = (None, None);
        if let (Some((res, t)), Some(layer), Some(norm), Some(g), Some(gn), Some(kv)) = (
            cross_tape,
            &self.cross,
            &self.cross_norm,
            grads.cross.as_mut(),
            grads.cross_norm.as_mut(),
            cross,
        ) {
            dx = sublayer_backward(Some(norm), rule.residual, &res, dx, Some(gn), |a, dy| {
                let r = layer.backward(a, Some(kv), &rule.cross, t, dy, g)?;
                d_cross = r.d_cross;
                d_cross_weights = r.d_weights;
                Ok(r.dx)
            })?;
        }
        let (attn_res, attn_tape) = attn;
        let (mut dbias, mut d_weights) = (None, None);
        let d_stream = d_input.as_ref().map(|_| dx.clone());
        let mut dx = sublayer_backward(
            self.attn_norm.as_ref(),
            rule.residual,
            &attn_res,
            dx,
            grads.attn_norm.as_mut(),
            |a, dy| {
                let post = self.attn_post_norm.as_ref();
                let dy = post_backward(post, attn_post, dy, grads.attn_post_norm.as_mut())?;
                let r =
                    self.attn
                        .backward(a, None, &rule.attend, attn_tape, &dy, &mut grads.attn)?;
                dbias = r.dbias;
                d_weights = r.d_weights;
                Ok(r.dx)
            },
        )?;
        if let (Some(d_ffn), Some(d_out)) = (d_input, d_stream) {
            dx.add_assign(&d_ffn)?;
            dx.add_assign(&d_out)?;
        }
        Ok(LayerGrads {
            dx,
            d_cross,
            dbias,
            d_weights,
            d_cross_weights,
        })
    }
}
