//! Encoder-decoders: how much each source token reaches each decoder token through the
//! cross-attention, by rollout and by gradient × attention.
//!
//! R^{ss} `[S, S]` follows the encoder's self-attention, R^{tt} `[T, T]` the decoder's,
//! and R^{ts} `[T, S]` the source's share in the decoder's tokens. Row t of R^{tt}
//! gives each decoder token's share in t, so a cross-attention map Ā `[T, S]` reaches
//! the source through R^{tt}·Ā·R^{ss}. (Chefer et al.'s code, written for DETR's
//! object queries that attend both ways, multiplies by (R^{tt})ᵀ instead; in a causal
//! decoder that would credit token t through the tokens after it.)

use super::gradient::{identity, positive_mean};
use super::residual::matmul;
use super::rollout::rollout;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `[n, m]` → f64, checked to have that shape.
fn values(x: &Tensor, name: &str, n: usize, m: usize) -> Result<Vec<f64>> {
    if x.shape() != [n, m] {
        return Err(Error::shape(name, format!("[{n}, {m}]"), x.shape()));
    }
    Ok(x.data().iter().map(|&v| v as f64).collect())
}

/// Rollout through the cross-attention of every decoder layer l: R^{tt}_l · Ā_l ·
/// R^{ss}, with R^{tt}_l the decoder's self-attention rollout through layer l, Ā_l the
/// heads' mean of cross map l `[H, T, S]` and R^{ss} the encoder's rollout through its
/// last layer. `encoder` and `decoder` are self-attention maps `[H, S, S]` and
/// `[H, T, T]` per layer, as [`rollout`] takes them. Rows sum to 1.
pub fn cross_rollout(
    encoder: &[Tensor],
    decoder: &[Tensor],
    cross: &[Tensor],
) -> Result<Vec<Tensor>> {
    let r_ss = rollout(encoder)?.pop().expect("one layer at least");
    let r_tt = rollout(decoder)?;
    if cross.len() != r_tt.len() {
        return Err(Error::invalid(
            "cross",
            format!(
                "{} cross-attention maps for {} decoder layers",
                cross.len(),
                r_tt.len()
            ),
        ));
    }
    let (t, s) = (r_tt[0].shape()[0], r_ss.shape()[0]);
    let r_ss = values(&r_ss, "encoder rollout", s, s)?;
    let mut out = Vec::with_capacity(cross.len());
    for (l, (x, r)) in cross.iter().zip(&r_tt).enumerate() {
        let name = format!("cross[{l}]");
        let [h, ..] = x.shape()[..] else {
            return Err(Error::shape(name, format!("[H, {t}, {s}]"), x.shape()));
        };
        if x.shape() != [h, t, s] || h == 0 {
            return Err(Error::shape(name, format!("[H, {t}, {s}]"), x.shape()));
        }
        x.check_finite(&name)?;
        let mut mean = vec![0f64; t * s];
        for head in x.data().chunks_exact(t * s) {
            mean.iter_mut()
                .zip(head)
                .for_each(|(m, &w)| *m += w as f64 / h as f64);
        }
        let r = values(r, "decoder rollout", t, t)?;
        let through = matmul(&matmul(&r, t, t, &mean, s), t, s, &r_ss, s);
        out.push(Tensor::from_fn(&[t, s], |i| through[i] as f32));
    }
    Ok(out)
}

/// R̄ = I + (R − I) with rows scaled to sum to 1 (Chefer et al.'s eq. 8–9): how the
/// layers mixed tokens, apart from the identity R starts from. A row to which nothing
/// was added stays the identity's.
fn normalized_residual(r: &[f64], n: usize) -> Vec<f64> {
    let mut out = r.to_vec();
    for (i, row) in out.chunks_exact_mut(n).enumerate() {
        row[i] -= 1.0;
        let sum: f64 = row.iter().sum();
        if sum > 0.0 {
            row.iter_mut().for_each(|x| *x /= sum);
        }
        row[i] += 1.0;
    }
    out
}

/// Gradient × attention through an encoder-decoder (Chefer, Gur & Wolf 2021, rules 6,
/// 7 and 10): R^{ss} over the encoder as [`super::gradient_rollout`]; then per decoder
/// layer, with Ā = mean_h (∇A ⊙ A)⁺ of its self-attention and Ā^x of its
/// cross-attention, R^{tt} += Ā·R^{tt}, R^{ts} += Ā·R^{ts}, R^{ts} += R̄^{tt}·Ā^x·R̄^{ss}.
/// Each argument is `(maps, grads)`, `[H, ·, ·]` per layer. Returns R^{tt} `[T, T]` and
/// R^{ts} `[T, S]` after each decoder layer.
pub fn cross_gradient_rollout(
    encoder: (&[Tensor], &[Tensor]),
    decoder: (&[Tensor], &[Tensor]),
    cross: (&[Tensor], &[Tensor]),
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let r_ss = super::gradient::gradient_rollout(encoder.0, encoder.1)?
        .pop()
        .expect("one layer at least");
    let s = r_ss.shape()[0];
    let r_ss = normalized_residual(&values(&r_ss, "encoder relevance", s, s)?, s);
    let layers = decoder.0.len();
    if [decoder.1.len(), cross.0.len(), cross.1.len()] != [layers; 3] || layers == 0 {
        return Err(Error::invalid(
            "decoder",
            "one self-attention map, cross-attention map and gradient of each per decoder layer",
        ));
    }
    let t = decoder.0[0].shape().get(1).copied().unwrap_or(0);
    let mut r_tt = identity(t);
    let mut r_ts = vec![0f64; t * s];
    let (mut self_out, mut cross_out) = (Vec::new(), Vec::new());
    for l in 0..layers {
        let a = positive_mean(
            &decoder.0[l],
            &decoder.1[l],
            &format!("decoder maps[{l}]"),
            &format!("decoder grads[{l}]"),
            t,
            t,
        )?;
        let add_tt = matmul(&a, t, t, &r_tt, t);
        let add_ts = matmul(&a, t, t, &r_ts, s);
        r_tt.iter_mut().zip(&add_tt).for_each(|(x, d)| *x += d);
        r_ts.iter_mut().zip(&add_ts).for_each(|(x, d)| *x += d);
        let x = positive_mean(
            &cross.0[l],
            &cross.1[l],
            &format!("cross maps[{l}]"),
            &format!("cross grads[{l}]"),
            t,
            s,
        )?;
        let bar_tt = normalized_residual(&r_tt, t);
        let add = matmul(&matmul(&bar_tt, t, t, &x, s), t, s, &r_ss, s);
        r_ts.iter_mut().zip(&add).for_each(|(x, d)| *x += d);
        self_out.push(Tensor::from_fn(&[t, t], |i| r_tt[i] as f32));
        cross_out.push(Tensor::from_fn(&[t, s], |i| r_ts[i] as f32));
    }
    Ok((self_out, cross_out))
}
