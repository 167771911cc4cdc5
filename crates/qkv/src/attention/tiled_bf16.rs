//! The tiled kernel's two products from bf16 operands ([`AttentionSpec::bf16`]): S =
//! scale·bf16(Q)·bf16(K)ᵀ and acc = corr·acc + bf16(P)·bf16(V), each through the bf16
//! matrix product ([`crate::weights::stored::product`] of a bf16 weight: `tdpbf16ps` on AMX, `vdpbf16ps` on
//! AMD's AVX512-BF16, the operands widened to f32 elsewhere), products and sums in f32.
//! The online softmax, the mask and the output stay f32, in the same loop as the f32
//! kernel's (`super::tiled`).
//!
//! Each (batch, key head)'s keys and values are packed once per call, in blocks of
//! [`BLOCK_K`] keys: the keys as a `[cols, D]` weight and the values transposed, a
//! `[Dv, cols]` weight, so that both products are x·Wᵀ. Rounding P, the unnormalised
//! probabilities of a block in [0, 1], moves each by at most 2⁻⁹ of itself, so the
//! output moves by at most 2⁻⁹·max|v| beyond what rounding Q, K and V does.
//!
//! [`AttentionSpec::bf16`]: super::AttentionSpec::bf16

use std::sync::OnceLock;

use super::micro::{Kernels, SoftmaxRows};
use super::scratch::{QueryRows, Scratch, BLOCK_K};
use super::spec::Scorer;
use super::view::HeadsView;
use crate::ops::Par;
use crate::weights::bf16::Bf16Weight;
use crate::weights::stored::{self, Start};

/// Query rows per task: each product call costs a set-up (rounding x, the tiles'
/// configuration) that 32 rows did not amortise.
pub(super) const BLOCK_Q: usize = 128;

/// One block of keys and values in bf16.
struct Block {
    /// `[cols, D]`: the scores are q·keysᵀ
    keys: Bf16Weight,
    /// `[Dv, cols]`: V's block transposed, so that P·V is p·valuesᵀ
    values: Bf16Weight,
}

/// Every (batch, key head)'s blocks, packed by the first task that reads them.
pub(super) struct Blocks<'a> {
    k: HeadsView<'a>,
    v: HeadsView<'a>,
    packed: Vec<OnceLock<Vec<Block>>>,
}

impl<'a> Blocks<'a> {
    pub(super) fn new(k: &HeadsView<'a>, v: &HeadsView<'a>) -> Self {
        let [b_n, _, g_n, _] = k.shape();
        Blocks {
            k: *k,
            v: *v,
            packed: (0..b_n * g_n).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The blocks of batch b, key head g.
    fn of(&self, b: usize, g: usize) -> &[Block] {
        let [_, s, g_n, d] = self.k.shape();
        let dv = self.v.shape()[3];
        self.packed[b * g_n + g].get_or_init(|| {
            (0..s)
                .step_by(BLOCK_K)
                .map(|j0| {
                    let cols = BLOCK_K.min(s - j0);
                    let rows = |view: &HeadsView, width: usize| -> Vec<f32> {
                        let mut out = Vec::with_capacity(cols * width);
                        (j0..j0 + cols).for_each(|j| out.extend_from_slice(view.vector(b, j, g)));
                        out
                    };
                    Block {
                        keys: Bf16Weight::new(&rows(&self.k, d), cols, d).expect("sizes"),
                        values: Bf16Weight::transposed(&rows(&self.v, dv), cols, dv)
                            .expect("sizes"),
                    }
                })
                .collect()
        })
    }
}

/// [`super::tiled`]'s query block with the products in bf16: runs the online softmax
/// for query rows i0..i0+rows of head h in batch b, leaving acc, m and l in `scratch`.
/// Key blocks start at multiples of [`BLOCK_K`] (where they were packed); the keys of
/// a block a row may not see are masked, as the f32 kernel masks a partial block.
pub(super) fn query_block(
    q: &HeadsView,
    blocks: &Blocks,
    scorer: &Scorer,
    at: QueryRows,
    scratch: &mut Scratch,
) {
    let QueryRows { b, h, i0, rows } = at;
    let dims = scorer.dims;
    let (d, dv) = (dims.d, dims.dv);
    let kernels = Kernels::detect();
    // the block's query rows, contiguous [rows, D], as the product reads x
    let q_rows = &mut scratch.q_rows[..rows * d];
    for (r, dst) in q_rows.chunks_exact_mut(d).enumerate() {
        dst.copy_from_slice(q.vector(b, i0 + r, h));
    }
    scratch.m[..rows].fill(f32::NEG_INFINITY);
    scratch.l[..rows].fill(0.0);
    scratch.acc[..rows * dv].fill(0.0);

    let (lo, hi_first) = scorer.key_range(i0);
    let (lo_last, hi) = scorer.key_range(i0 + rows - 1);
    let mut j0 = lo - lo % BLOCK_K;
    for block in &blocks.of(b, dims.kv_head(h))[lo / BLOCK_K..] {
        if j0 >= hi {
            break;
        }
        let cols = block.keys.n();
        let tile = &mut scratch.tile[..rows * cols];
        stored::product(&block.keys, tile, q_rows, rows, Start::Zero, Par::Single)
            .expect("operands sized from the block");
        tile.iter_mut().for_each(|s| *s *= scorer.scale);
        let whole = j0 >= lo_last && j0 + cols <= hi_first && !scorer.needs_row_pass();
        for (r, row) in tile.chunks_exact_mut(cols).enumerate() {
            match whole {
                true => scorer.cap_row(row),
                false => scorer.apply_row(b, h, i0 + r, j0, row),
            }
        }
        let (m, l, corr) = (&mut scratch.m, &mut scratch.l, &mut scratch.corr);
        kernels.softmax_rows(SoftmaxRows {
            tile,
            stride: cols,
            rows,
            cols,
            m,
            l,
            corr,
        });
        // acc = corr·acc + bf16(P)·V[j0..j0+cols]
        let acc = &mut scratch.acc[..rows * dv];
        for (row, &c) in acc.chunks_exact_mut(dv).zip(&scratch.corr[..rows]) {
            row.iter_mut().for_each(|a| *a *= c);
        }
        let p = &scratch.tile[..rows * cols];
        stored::product(&block.values, acc, p, rows, Start::Accumulate, Par::Single)
            .expect("operands sized from the block");
        j0 += cols;
    }
}

#[cfg(test)]
mod tests {
    use crate::attention::{attention, AttentionSpec, CausalAlign, Kernel};
    use crate::rng::Rng;
    use crate::tensor::Tensor;
    use crate::weights::bf16::convert::round_to_bf16;

    /// The bf16 kernel equals the reference kernel run on Q, K and V rounded to bf16,
    /// within what rounding P adds (2⁻⁹·max|v|, module docs) and f32's sums: causal
    /// (top-left and bottom-right), a window, padding, GQA, key counts on both sides of
    /// a block and odd head widths. It also differs from f32 (it did round).
    #[test]
    fn equals_the_reference_on_rounded_operands() {
        let mut rng = Rng::new(3);
        // (B, T, S, H, G, D, Dv)
        let shapes = [
            (1, 40, 40, 2, 2, 16, 16),
            (2, 37, 300, 4, 2, 33, 20),
            (1, 130, 130, 2, 1, 64, 64),
            (1, 7, 257, 3, 3, 8, 31),
        ];
        for (b, t, s, h, g, d, dv) in shapes {
            let random = |rng: &mut Rng, shape: &[usize]| {
                Tensor::new(shape, rng.normals(shape.iter().product(), 1.0)).unwrap()
            };
            let (q, k) = (
                random(&mut rng, &[b, t, h, d]),
                random(&mut rng, &[b, s, g, d]),
            );
            let v = random(&mut rng, &[b, s, g, dv]);
            let round = |x: &Tensor| {
                Tensor::new(
                    x.shape(),
                    x.data().iter().map(|&e| round_to_bf16(e)).collect(),
                )
                .unwrap()
            };
            let padding: Vec<bool> = (0..b * s).map(|i| i % s < s - 3 || i < s).collect();
            let specs = [
                AttentionSpec::default(),
                AttentionSpec {
                    causal: Some(CausalAlign::BottomRight),
                    ..Default::default()
                },
                AttentionSpec {
                    causal: Some(CausalAlign::TopLeft),
                    window: Some(50),
                    key_padding: Some(&padding),
                    ..Default::default()
                },
            ];
            let v_max = round(&v).data().iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for spec in specs {
                let what = format!("{:?} {spec:?}", (b, t, s, h, g, d, dv));
                let got = attention(&q, &k, &v, &AttentionSpec { bf16: true, ..spec }).unwrap();
                let reference = AttentionSpec {
                    kernel: Kernel::Reference,
                    ..spec
                };
                let want = attention(&round(&q), &round(&k), &round(&v), &reference).unwrap();
                let tol = v_max / 512.0 + 1e-5;
                let diff = got.out.max_abs_diff(&want.out);
                assert!(diff <= tol, "{what}: {diff} > {tol}");
                assert!(got.lse.max_abs_diff(&want.lse) <= 1e-4, "{what}: lse");
                let f32_out = attention(&q, &k, &v, &spec).unwrap().out;
                assert!(got.out.max_abs_diff(&f32_out) > 1e-4, "{what}: equals f32");
            }
        }
    }
}
