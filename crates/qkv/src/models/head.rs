//! The language-model head shared by the decoder families: logits = h · Wᵀ, with W the
//! checkpoint's own `lm_head.weight` or, when tied, the token embedding table, read
//! transposed in place rather than copied.

use crate::error::Result;
use crate::io::Checkpoint;
use crate::layers::Linear;
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::tensor::Tensor;

/// The checkpoint's own head `lm_head.weight` `[V, C]` (named without any model prefix,
/// as every family saves it), or `None` when `tied` to the embedding table.
pub(crate) fn load_lm_head(
    ckpt: &Checkpoint,
    tied: bool,
    vocab: usize,
    c: usize,
) -> Result<Option<Linear>> {
    if tied {
        return Ok(None);
    }
    Linear::new(ckpt.tensor_shaped("lm_head.weight", &[vocab, c])?, None).map(Some)
}

/// h: `[.., C]` → logits `[.., V]` through `head`, or, with `head` `None`, through the
/// tied embedding `table` `[V, C]`: `tied_scale · h · tableᵀ` (T5 rescales by
/// C^−½ there; the others by 1).
pub(crate) fn lm_logits(
    h: &Tensor,
    head: Option<&Linear>,
    table: &Tensor,
    tied_scale: f32,
) -> Result<Tensor> {
    if let Some(head) = head {
        return head.forward(h);
    }
    let (v, c) = (table.shape()[0], table.shape()[1]);
    assert_eq!(h.last_dim(), c, "lm_logits: hidden width vs table {v}×{c}");
    let rows = h.numel() / c;
    let mut shape = h.shape().to_vec();
    *shape.last_mut().expect("h has a last axis") = v;
    let mut out = Tensor::zeros(&shape);
    gemm(
        MatMut::row_major(out.data_mut(), rows, v),
        MatRef::row_major(h.data(), rows, c),
        MatRef::row_major(table.data(), v, c).t(),
        tied_scale,
        false,
        Par::Auto,
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tied_logits_are_scaled_products_with_each_row() {
        // h: [1, 2, 2]; table: [3, 2]
        let h = Tensor::new(&[1, 2, 2], vec![1.0, 2.0, -1.0, 0.5]).unwrap();
        let table = Tensor::new(&[3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]).unwrap();
        let out = lm_logits(&h, None, &table, 2.0).unwrap();
        assert_eq!(out.shape(), &[1, 2, 3]);
        assert_eq!(out.data(), &[2.0, 4.0, 6.0, -2.0, 1.0, -1.0]);
    }
}
