//! Additive attention (Bahdanau, Cho and Bengio, 2014), the attention the articles'
//! story begins with: before each decoder step, score every encoder state h_j against
//! the decoder's previous state s with a small network,
//!
//! `e_j = vᵀ·tanh(W·s + U·h_j + b)`,  `α = softmax_j(e)`,  `c = Σ_j α_j·h_j`,
//!
//! and feed the context c to the step. The decoder no longer has to squeeze the whole
//! source into one final state; scaled dot-product attention later replaced the small
//! network by q·k/√d_k.
//!
//! U·h_j + b depends on the encoder alone, so it is computed once per source
//! ([`Additive::project_keys`]); each step then costs O(S·A).

use crate::error::{Error, Result};
use crate::layers::linear::product_backward;
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::tensor::Tensor;

crate::module! {
    /// The scoring network's parameters (A: its width).
    #[derive(Clone, Debug, PartialEq)]
    pub struct Additive {
        /// W `[A, Hq]`: projects the decoder state (the query)
        pub query: Tensor,
        /// U `[A, Hk]`: projects each encoder state (the keys)
        pub key: Tensor,
        /// b `[A]`
        pub bias: Tensor,
        /// v `[A]`
        pub score: Tensor,
    }
}

/// One step's results, kept for its backward.
#[derive(Clone, Debug)]
pub struct AdditiveStep {
    /// `[B, Hk]`: c = Σ_j α_j·h_j
    pub context: Tensor,
    /// `[B, S]`: α, zero at padded keys
    pub weights: Tensor,
    /// `[B, Hq]`: the query s
    query: Tensor,
    /// `[B, S, A]`: tanh(W·s + U·h_j + b)
    hidden: Tensor,
}

impl Additive {
    /// Checks the shapes: W `[A, Hq]`, U `[A, Hk]`, b and v `[A]`.
    pub fn new(query: Tensor, key: Tensor, bias: Tensor, score: Tensor) -> Result<Self> {
        let a = query.shape().first().copied().unwrap_or(0);
        query.expect_shape("additive query weight", &[Some(a), None])?;
        key.expect_shape("additive key weight", &[Some(a), None])?;
        bias.expect_shape("additive bias", &[Some(a)])?;
        score.expect_shape("additive score vector", &[Some(a)])?;
        if a == 0 || query.shape()[1] == 0 || key.shape()[1] == 0 {
            return Err(Error::invalid(
                "additive attention",
                "widths must be at least 1",
            ));
        }
        Ok(Additive {
            query,
            key,
            bias,
            score,
        })
    }

    fn width(&self) -> usize {
        self.score.numel()
    }

    /// U·h_j + b for every key: keys `[B, S, Hk]` → `[B, S, A]`.
    pub fn project_keys(&self, keys: &Tensor) -> Result<Tensor> {
        let hk = self.key.shape()[1];
        keys.expect_shape("additive keys", &[None, None, Some(hk)])?;
        let (b_n, s_n, a) = (keys.shape()[0], keys.shape()[1], self.width());
        let mut proj = Tensor::zeros(&[b_n, s_n, a]);
        for row in proj.data_mut().chunks_exact_mut(a) {
            row.copy_from_slice(self.bias.data());
        }
        gemm(
            MatMut::row_major(proj.data_mut(), b_n * s_n, a),
            MatRef::row_major(keys.data(), b_n * s_n, hk),
            MatRef::row_major(self.key.data(), a, hk).t(),
            1.0,
            true,
            Par::Auto,
        )?;
        Ok(proj)
    }

    /// Backward of [`Self::project_keys`]: **accumulates** U's and b's gradients into
    /// `grads` and d keys (`[B, S, Hk]`) into `d_keys`.
    pub fn project_keys_backward(
        &self,
        keys: &Tensor,
        d_proj: &Tensor,
        grads: &mut Additive,
        d_keys: &mut Tensor,
    ) -> Result<()> {
        let (hk, a) = (self.key.shape()[1], self.width());
        keys.expect_shape("additive keys", &[None, None, Some(hk)])?;
        let (b_n, s_n) = (keys.shape()[0], keys.shape()[1]);
        self.check_source_grads([b_n, s_n, hk], d_proj, (d_keys, "additive d keys"), grads)?;
        // proj = keys·Uᵀ + b  →  dU += d projᵀ·keys, db += Σ d proj, d keys += d proj·U
        for row in d_proj.data().chunks_exact(a) {
            for (g, &d) in grads.bias.data_mut().iter_mut().zip(row) {
                *g += d;
            }
        }
        product_backward(keys, &self.key, 1.0, d_proj, &mut grads.key, (d_keys, true))
    }

    /// One decoder step's attention: query s `[B, Hq]` against the projected keys
    /// `[B, S, A]` and the values (the encoder states) `[B, S, Hk]`. `mask` `[B·S]` is
    /// false at padded keys; every row must keep at least one key.
    pub fn step(
        &self,
        query: &Tensor,
        proj: &Tensor,
        values: &Tensor,
        mask: Option<&[bool]>,
    ) -> Result<AdditiveStep> {
        let (hq, a) = (self.query.shape()[1], self.width());
        query.expect_shape("additive query", &[None, Some(hq)])?;
        let b_n = query.shape()[0];
        proj.expect_shape("additive projected keys", &[Some(b_n), None, Some(a)])?;
        let s_n = proj.shape()[1];
        values.expect_shape("additive values", &[Some(b_n), Some(s_n), None])?;
        let hk = values.shape()[2];
        if let Some(m) = mask {
            if m.len() != b_n * s_n {
                return Err(Error::shape(
                    "additive mask",
                    format!("[{}]", b_n * s_n),
                    &[m.len()],
                ));
            }
            if let Some(b) = (0..b_n).find(|&b| !m[b * s_n..(b + 1) * s_n].contains(&true)) {
                return Err(Error::invalid(
                    "additive mask",
                    format!("row {b} masks every key: nothing to attend to"),
                ));
            }
        }
        // W·s [B, A]
        let mut qw = vec![0.0; b_n * a];
        gemm(
            MatMut::row_major(&mut qw, b_n, a),
            MatRef::row_major(query.data(), b_n, hq),
            MatRef::row_major(self.query.data(), a, hq).t(),
            1.0,
            false,
            Par::Auto,
        )?;
        let mut hidden = Tensor::zeros(&[b_n, s_n, a]);
        let mut weights = Tensor::zeros(&[b_n, s_n]);
        let mut context = Tensor::zeros(&[b_n, hk]);
        for b in 0..b_n {
            let real = |j: usize| mask.is_none_or(|m| m[b * s_n + j]);
            let e = &mut weights.data_mut()[b * s_n..(b + 1) * s_n];
            for (j, e_j) in e.iter_mut().enumerate() {
                let t = &mut hidden.data_mut()[(b * s_n + j) * a..][..a];
                let p = &proj.data()[(b * s_n + j) * a..][..a];
                let mut dot = 0.0;
                for k in 0..a {
                    t[k] = (qw[b * a + k] + p[k]).tanh();
                    dot += self.score.data()[k] * t[k];
                }
                *e_j = if real(j) { dot } else { f32::NEG_INFINITY };
            }
            // softmax over the real keys (at least one, checked above)
            let max = e.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for x in e.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            e.iter_mut().for_each(|x| *x /= sum);
            let c = &mut context.data_mut()[b * hk..(b + 1) * hk];
            for (j, &w) in weights.data()[b * s_n..(b + 1) * s_n].iter().enumerate() {
                for (c_k, &v) in c.iter_mut().zip(&values.data()[(b * s_n + j) * hk..][..hk]) {
                    *c_k += w * v;
                }
            }
        }
        Ok(AdditiveStep {
            context,
            weights,
            query: query.clone(),
            hidden,
        })
    }

    /// Backward of [`Self::step`] for d context `[B, Hk]`: **accumulates** W's and v's
    /// gradients into `grads`, d projected keys into `d_proj` `[B, S, A]` and d values
    /// into `d_values` `[B, S, Hk]`; returns d query `[B, Hq]`.
    pub fn step_backward(
        &self,
        step: &AdditiveStep,
        values: &Tensor,
        d_context: &Tensor,
        grads: &mut Additive,
        d_proj: &mut Tensor,
        d_values: &mut Tensor,
    ) -> Result<Tensor> {
        let (b_n, s_n, a) = (step.hidden.shape()[0], step.hidden.shape()[1], self.width());
        let hq = self.query.shape()[1];
        values.expect_shape("additive values", &[Some(b_n), Some(s_n), None])?;
        let hk = values.shape()[2];
        d_context.expect_shape("additive d context", &[Some(b_n), Some(hk)])?;
        self.check_source_grads(
            [b_n, s_n, hk],
            d_proj,
            (d_values, "additive d values"),
            grads,
        )?;
        let mut d_qw = vec![0.0; b_n * a];
        for b in 0..b_n {
            let alpha = &step.weights.data()[b * s_n..(b + 1) * s_n];
            let dc = &d_context.data()[b * hk..(b + 1) * hk];
            // c = Σ α_j h_j  →  dα_j = dc·h_j, d h_j += α_j·dc
            let mut d_alpha = vec![0.0; s_n];
            for j in 0..s_n {
                let h = &values.data()[(b * s_n + j) * hk..][..hk];
                d_alpha[j] = h.iter().zip(dc).map(|(x, y)| x * y).sum();
                let dh = &mut d_values.data_mut()[(b * s_n + j) * hk..][..hk];
                for (g, &d) in dh.iter_mut().zip(dc) {
                    *g += alpha[j] * d;
                }
            }
            // α = softmax(e)  →  de_j = α_j·(dα_j − Σ_k α_k dα_k); masked keys have α 0
            let mean: f32 = alpha.iter().zip(&d_alpha).map(|(x, y)| x * y).sum();
            for j in 0..s_n {
                let de = alpha[j] * (d_alpha[j] - mean);
                let t = &step.hidden.data()[(b * s_n + j) * a..][..a];
                let dp = &mut d_proj.data_mut()[(b * s_n + j) * a..][..a];
                for k in 0..a {
                    // e = v·t  →  dv += de·t, dt = de·v;  t = tanh(u)  →  du = dt·(1 − t²)
                    grads.score.data_mut()[k] += de * t[k];
                    let du = de * self.score.data()[k] * (1.0 - t[k] * t[k]);
                    dp[k] += du;
                    d_qw[b * a + k] += du;
                }
            }
        }
        // W·s  →  dW += d(W·s)ᵀ·s, ds = d(W·s)·W
        gemm(
            MatMut::row_major(grads.query.data_mut(), a, hq),
            MatRef::row_major(&d_qw, b_n, a).t(),
            MatRef::row_major(step.query.data(), b_n, hq),
            1.0,
            true,
            Par::Auto,
        )?;
        let mut d_query = Tensor::zeros(&[b_n, hq]);
        gemm(
            MatMut::row_major(d_query.data_mut(), b_n, hq),
            MatRef::row_major(&d_qw, b_n, a),
            MatRef::row_major(self.query.data(), a, hq),
            1.0,
            false,
            Par::Auto,
        )?;
        Ok(d_query)
    }

    /// Checks a backward's source-side buffers: d projected keys `[B, S, A]`, the other
    /// (`name`: d keys or d values) `[B, S, Hk]`, and the gradient tree.
    fn check_source_grads(
        &self,
        [b_n, s_n, hk]: [usize; 3],
        d_proj: &Tensor,
        (other, name): (&Tensor, &str),
        grads: &Additive,
    ) -> Result<()> {
        let a = self.width();
        d_proj.expect_shape(
            "additive d projected keys",
            &[Some(b_n), Some(s_n), Some(a)],
        )?;
        other.expect_shape(name, &[Some(b_n), Some(s_n), Some(hk)])?;
        self.check_grads(grads)
    }

    /// Errors unless `grads` has this module's shapes.
    fn check_grads(&self, grads: &Additive) -> Result<()> {
        let pairs = [
            ("query", &self.query, &grads.query),
            ("key", &self.key, &grads.key),
            ("bias", &self.bias, &grads.bias),
            ("score", &self.score, &grads.score),
        ];
        for (name, w, g) in pairs {
            if w.shape() != g.shape() {
                return Err(Error::shape(
                    format!("additive grads.{name}"),
                    format!("{:?}", w.shape()),
                    g.shape(),
                ));
            }
        }
        Ok(())
    }
}
