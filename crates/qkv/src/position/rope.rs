//! Rotary position embedding (RoPE, RoFormer): each pair of dimensions of q and k is
//! rotated by the angle pos·θ_i with θ_i = base^(−2i/R) (R = rotary width). Rotations
//! compose, so ⟨RoPE(q, m), RoPE(k, n)⟩ depends only on m − n, and norms are kept.
//!
//! Two layouts pair the dimensions differently:
//! - [`RopeLayout::HalfSplit`]: pairs (x_i, x_{i+R/2}), Hugging Face's `rotate_half`
//!   (Llama, Mistral, GPT-NeoX): y = x·cos + rotate_half(x)·sin;
//! - [`RopeLayout::Interleaved`]: pairs (x_{2i}, x_{2i+1}), the RoFormer paper and GPT-J.
//!
//! Only the first R of the D dimensions rotate (R = D unless partial rotary is asked).
//!
//! Backward ([`Rope::backward`]): a rotation is orthogonal, so the gradient of the
//! input is the gradient of the output rotated back by −pos·θ. No parameters.

use std::borrow::Cow;

use super::rope_scaling::{default_inv_freq, RopeScaling};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    HalfSplit,
    Interleaved,
}

#[derive(Clone, Debug)]
pub struct Rope {
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub layout: RopeLayout,
    base: f32,
    scaling: RopeScaling,
    /// θ_i for i in 0..R/2 after scaling (for dynamic scaling: within the trained length)
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Full-width RoPE with base θ (10 000 in most models, `rope_theta` in configs).
    pub fn new(head_dim: usize, base: f32, layout: RopeLayout) -> Result<Self> {
        Rope::partial(head_dim, head_dim, base, layout)
    }

    /// RoPE on the first `rotary_dim` of `head_dim` dimensions; the rest pass through.
    pub fn partial(
        head_dim: usize,
        rotary_dim: usize,
        base: f32,
        layout: RopeLayout,
    ) -> Result<Self> {
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(Error::invalid(
                "rotary_dim",
                format!("must be even and in 2..={head_dim}, got {rotary_dim}"),
            ));
        }
        if !(base.is_finite() && base > 1.0) {
            return Err(Error::invalid(
                "rope_theta",
                format!("must be finite and > 1, got {base}"),
            ));
        }
        // f32 arithmetic in the same order as Hugging Face, so angles agree bit for bit
        // as far as possible: inv_freq = 1 / base^(2i/R).
        Ok(Rope {
            head_dim,
            rotary_dim,
            layout,
            base,
            scaling: RopeScaling::None,
            inv_freq: default_inv_freq(base, rotary_dim),
        })
    }

    /// The frequencies rewritten by a checkpoint's `rope_scaling` (linear, llama3,
    /// yarn, dynamic; see [`RopeScaling`]).
    pub fn with_scaling(mut self, scaling: RopeScaling) -> Result<Self> {
        scaling.check("rope_scaling")?;
        scaling.check_width("rope_scaling", self.rotary_dim)?;
        self.inv_freq = scaling.inv_freq(self.base, self.rotary_dim, 0);
        self.scaling = scaling;
        Ok(self)
    }

    /// θ_i for a call within the trained length (R/2 values).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// The length past which a call uses other frequencies (dynamic, LongRoPE).
    pub fn call_threshold(&self) -> Option<usize> {
        self.scaling.call_threshold()
    }

    /// This RoPE as a call of `len` positions (its largest position + 1) uses it:
    /// itself, or with a length-dependent scaling past the trained length, the
    /// frequencies for that call's length (transformers recomputes them at every call
    /// whose length grew; a call never sees its own earlier lengths, so one decode step
    /// after another agree with it).
    fn for_call(&self, len: usize) -> Cow<'_, Rope> {
        match self.scaling.call_threshold() {
            Some(max_len) if len > max_len => {
                let mut longer = self.clone();
                longer.inv_freq = self.scaling.inv_freq(self.base, self.rotary_dim, len - 1);
                Cow::Owned(longer)
            }
            _ => Cow::Borrowed(self),
        }
    }

    /// (cos, sin) of each pair's angle at `pos`, times the attention factor: R/2
    /// values each.
    pub fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let c = self.scaling.attention_factor();
        self.inv_freq
            .iter()
            .map(|f| {
                let a = pos as f32 * f;
                (a.cos() * c, a.sin() * c)
            })
            .unzip()
    }

    /// Rotates one head vector x (D wide) to position `pos` in place.
    pub fn rotate(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.rotary_dim / 2;
        for i in 0..half {
            let (a, b) = match self.layout {
                RopeLayout::HalfSplit => (i, i + half),
                RopeLayout::Interleaved => (2 * i, 2 * i + 1),
            };
            let (xa, xb) = (x[a], x[b]);
            x[a] = xa * cos[i] - xb * sin[i];
            x[b] = xb * cos[i] + xa * sin[i];
        }
    }

    /// x: [B, T, H, D] rotated in place; positions: [B·T], the absolute position of
    /// each token (rows may differ, e.g. left-padded batches or a decode offset).
    pub fn apply(&self, x: &mut Tensor, positions: &[usize]) -> Result<()> {
        self.turn(x, positions, "rope input", 1.0)
    }

    /// Like [`Rope::apply`] for x `[1, N, H, D]` holding several sequences' tokens one
    /// after another (a packed step): `calls[i] = (len, call_len)` says that the next
    /// `len` tokens are a call of their own whose frequencies are those of a call of
    /// `call_len` positions. A scaling that depends on the call's length (dynamic,
    /// LongRoPE) thereby looks at each sequence alone, and a prompt prefilled in chunks
    /// takes the frequencies of the whole prompt, as one call of it would.
    pub fn apply_calls(
        &self,
        x: &mut Tensor,
        positions: &[usize],
        calls: &[(usize, usize)],
    ) -> Result<()> {
        x.expect_shape("rope input", &[Some(1), None, None, Some(self.head_dim)])?;
        let (n, h) = (x.shape()[1], x.shape()[2]);
        if calls.iter().map(|c| c.0).sum::<usize>() != n || positions.len() != n {
            return Err(Error::Shape {
                tensor: "rope calls".into(),
                expected: format!("{n} tokens in all, one position each"),
                got: vec![calls.iter().map(|c| c.0).sum(), positions.len()],
            });
        }
        let mut start = 0;
        for &(len, call_len) in calls {
            let rows = &mut x.data_mut()[start * h * self.head_dim..][..len * h * self.head_dim];
            self.rotate_rows(rows, h, &positions[start..start + len], 1.0, call_len);
            start += len;
        }
        Ok(())
    }

    /// Like [`Rope::apply`] with every row at positions offset..offset+T.
    pub fn apply_offset(&self, x: &mut Tensor, offset: usize) -> Result<()> {
        let positions = self.offsets(x, "rope input", offset)?;
        self.apply(x, &positions)
    }

    /// Backward of [`Rope::apply`], in place: dy `[B, T, H, D]` (the gradient of the
    /// rotated vectors) becomes dx, the gradient of the vectors before rotation, for
    /// the same `positions` `[B·T]`.
    ///
    /// The forward is y = R(pos·θ)·x per pair, a rotation, so dx = R(pos·θ)ᵀ·dy =
    /// R(−pos·θ)·dy: the same rotation with the sine negated, and the pass-through
    /// dimensions beyond R pass their gradient through unchanged. RoPE has no
    /// parameters (θ is fixed), so there is nothing to accumulate.
    pub fn backward(&self, dy: &mut Tensor, positions: &[usize]) -> Result<()> {
        self.turn(dy, positions, "rope gradient", -1.0)
    }

    /// Rotates every head of `x` `[B, T, H, D]` (named `what` in errors) by R(±pos·θ)
    /// at its token's position: `sign` 1 is the forward, −1 its transpose (cos(−a) =
    /// cos a, sin(−a) = −sin a, both times YaRN's factor c: the forward is c·R(a), whose
    /// transpose is c·R(−a)).
    fn turn(&self, x: &mut Tensor, positions: &[usize], what: &str, sign: f32) -> Result<()> {
        x.expect_shape(what, &[None, None, None, Some(self.head_dim)])?;
        let (b, t, h) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        if positions.len() != b * t {
            return Err(Error::Shape {
                tensor: "rope positions".into(),
                expected: format!("[{b}, {t}] = {} entries", b * t),
                got: vec![positions.len()],
            });
        }
        let len = positions.iter().copied().max().map_or(0, |p| p + 1);
        self.rotate_rows(x.data_mut(), h, positions, sign, len);
        Ok(())
    }

    /// Rotates `rows` (tokens of `heads` heads of D each, one position each) as a
    /// call of `call_len` positions; `sign` as in [`Rope::turn`].
    fn rotate_rows(
        &self,
        rows: &mut [f32],
        heads: usize,
        positions: &[usize],
        sign: f32,
        call_len: usize,
    ) {
        let d = self.head_dim;
        let rope = self.for_call(call_len);
        for (token, &pos) in rows.chunks_exact_mut(heads * d).zip(positions) {
            let (cos, mut sin) = rope.cos_sin(pos);
            sin.iter_mut().for_each(|s| *s *= sign);
            for head in token.chunks_exact_mut(d) {
                rope.rotate(head, &cos, &sin);
            }
        }
    }

    /// Like [`Rope::backward`] with every row at positions offset..offset+T.
    pub fn backward_offset(&self, dy: &mut Tensor, offset: usize) -> Result<()> {
        let positions = self.offsets(dy, "rope gradient", offset)?;
        self.backward(dy, &positions)
    }

    /// Positions offset..offset+T for every row of `x` `[B, T, H, D]`.
    fn offsets(&self, x: &Tensor, what: &str, offset: usize) -> Result<Vec<usize>> {
        x.expect_shape(what, &[None, None, None, Some(self.head_dim)])?;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        Ok((0..b * t).map(|i| offset + i % t).collect())
    }
}
