//! The backward formulas as written, one (batch, head) at a time with the whole T×S
//! matrices P, dP and dS in memory. P is recomputed from Q and K with the same
//! [`Scorer`] and softmax as the reference forward, so this twin depends on nothing the
//! forward saved and checks the tiled kernel's use of the saved log-sum-exp.

use super::super::reference::dot;
use super::super::spec::{softcap_backward, Scorer};
use super::super::view::HeadsView;
use super::grads::AttentionGrads;
use crate::ops::softmax_rows;
use crate::tensor::Tensor;

/// `acc += alpha · x`
fn axpy(acc: &mut [f32], alpha: f32, x: &[f32]) {
    for (a, xc) in acc.iter_mut().zip(x) {
        *a += alpha * xc;
    }
}

/// The readable twin of the tiled backward, on its operands less the forward's output
/// (P is recomputed from Q and K); dbias, when asked for, has the dense bias's shape.
pub(super) fn backward(
    [q, k, v, d_out]: [&HeadsView; 4],
    scorer: &Scorer,
    dbias_shape: Option<[usize; 4]>,
) -> AttentionGrads {
    let dims = scorer.dims;
    let (t, s, h_n, g_n, d, dv) = (dims.t, dims.s, dims.h, dims.g, dims.d, dims.dv);
    let scale = scorer.scale;

    let mut dq = Tensor::zeros(&[dims.b, t, h_n, d]);
    let mut dk = Tensor::zeros(&[dims.b, s, g_n, d]);
    let mut dv_t = Tensor::zeros(&[dims.b, s, g_n, dv]);
    let mut dbias = dbias_shape.map(|shape| Tensor::zeros(&shape));

    let mut p = vec![0.0f32; t * s];
    let mut ds = vec![0.0f32; t * s];
    // the scaled scores before a soft cap, for its derivative
    let mut raw = vec![0.0f32; if scorer.softcap().is_some() { t * s } else { 0 }];
    for b in 0..dims.b {
        for h in 0..h_n {
            let g = dims.kv_head(h);
            // (1), (2): P = softmax(scale·Q·Kᵀ + bias, masked), exactly as the forward.
            for i in 0..t {
                let row = &mut p[i * s..(i + 1) * s];
                for (j, x) in row.iter_mut().enumerate() {
                    *x = scale * dot(q.vector(b, i, h), k.vector(b, j, g));
                }
                if !raw.is_empty() {
                    raw[i * s..(i + 1) * s].copy_from_slice(row);
                }
                scorer.apply_row(b, h, i, 0, row);
            }
            softmax_rows(&mut p, s);

            for i in 0..t {
                let d_o = d_out.vector(b, i, h);
                let p_row = &p[i * s..(i + 1) * s];
                let ds_row = &mut ds[i * s..(i + 1) * s];
                // dP_ij = dO_i · V_j  (from O = P·V)
                for (j, x) in ds_row.iter_mut().enumerate() {
                    *x = dot(d_o, v.vector(b, j, g));
                }
                // dS = P∘(dP − Σ_j P_ij·dP_ij)  (softmax's Jacobian-vector product)
                let row_dot: f32 = p_row.iter().zip(ds_row.iter()).map(|(a, c)| a * c).sum();
                for (x, &pij) in ds_row.iter_mut().zip(p_row) {
                    *x = pij * (*x - row_dot);
                }
            }

            // dbias = dS, summed over the axes the bias is broadcast along (the bias is
            // added after the soft cap).
            if let Some(db) = dbias.as_mut() {
                let [bm, hm, _, _] = db.shape().try_into().expect("4-d bias");
                let (bb, hh) = (if bm == 1 { 0 } else { b }, if hm == 1 { 0 } else { h });
                let dst = &mut db.data_mut()[(bb * hm + hh) * t * s..][..t * s];
                for (a, x) in dst.iter_mut().zip(&ds) {
                    *a += x;
                }
            }
            // dS of the raw scores, through the cap: cap·tanh(s/cap)
            if let Some(cap) = scorer.softcap() {
                softcap_backward(cap, &raw, &mut ds);
            }

            for i in 0..t {
                let p_row = &p[i * s..(i + 1) * s];
                let ds_row = &ds[i * s..(i + 1) * s];
                let d_o = d_out.vector(b, i, h);
                let q_i = q.vector(b, i, h);
                let dq_i = &mut dq.data_mut()[((b * t + i) * h_n + h) * d..][..d];
                for (j, &ds_ij) in ds_row.iter().enumerate() {
                    // dQ_i += scale · dS_ij · K_j  (from S = scale·Q·Kᵀ)
                    axpy(dq_i, scale * ds_ij, k.vector(b, j, g));
                }
                for j in 0..s {
                    // dK_j += scale · dS_ij · Q_i, summed over the heads sharing g
                    let dk_j = &mut dk.data_mut()[((b * s + j) * g_n + g) * d..][..d];
                    axpy(dk_j, scale * ds_row[j], q_i);
                    // dV_j += P_ij · dO_i  (from O = P·V)
                    let dv_j = &mut dv_t.data_mut()[((b * s + j) * g_n + g) * dv..][..dv];
                    axpy(dv_j, p_row[j], d_o);
                }
            }
        }
    }
    AttentionGrads {
        dq,
        dk,
        dv: dv_t,
        dbias,
    }
}
