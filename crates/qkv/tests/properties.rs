//! The claims of the seed articles, checked as properties on seeded random inputs.
//!
//! Sizes are odd on purpose (T ∈ {1, 2, 7, 17, 33}) so loop tails and partial tiles
//! are hit, and every property that involves attention runs on both kernels: the
//! reference one that materialises T×S scores and the tiled online-softmax one.

#![cfg(feature = "models")]

mod common;

use common::random::RngExt;
use common::tensors::{assert_no_nan, batch_row, gather_axis1, head, max_abs_diff};
use common::{assert_close as assert_slices_close, assert_tensor_close as assert_close};
use qkv::layers::Linear;
use qkv::position::sinusoidal::shift_matrix;
use qkv::position::{
    alibi_slopes, sinusoidal_table, LearnedPositions, RelativeBias, Rope, RopeLayout,
    SinusoidalLayout,
};
use qkv::rng::Rng;
use qkv::{
    attention, AttentionOutput, AttentionSpec, Bias, Broadcast, CausalAlign, Kernel,
    MultiHeadAttention, Tensor,
};

const ODD_T: [usize; 5] = [1, 2, 7, 17, 33];
const KERNELS: [Kernel; 2] = [Kernel::Reference, Kernel::Tiled];

fn spec_for(kernel: Kernel) -> AttentionSpec<'static> {
    AttentionSpec {
        kernel,
        ..Default::default()
    }
}

/// Random Q `[B,T,H,D]`, K `[B,S,G,D]`, V `[B,S,G,Dv]` with unit-variance entries.
#[derive(Clone, Copy)]
struct Sizes {
    b: usize,
    t: usize,
    s: usize,
    h: usize,
    g: usize,
    d: usize,
    dv: usize,
}

fn random_qkv(rng: &mut Rng, z: Sizes) -> (Tensor, Tensor, Tensor) {
    (
        rng.tensor(&[z.b, z.t, z.h, z.d], 1.0),
        rng.tensor(&[z.b, z.s, z.g, z.d], 1.0),
        rng.tensor(&[z.b, z.s, z.g, z.dv], 1.0),
    )
}

/// Multi-head attention C → H heads of width D (G key/value heads, value width Dv)
/// → C, with random weights and biases; `ckv` is the width of the attended sequence.
fn random_mha(
    rng: &mut Rng,
    c: usize,
    ckv: usize,
    h: usize,
    g: usize,
    d: usize,
    dv: usize,
) -> MultiHeadAttention {
    MultiHeadAttention::new(
        rng.linear(c, h * d),
        rng.linear(ckv, g * d),
        rng.linear(ckv, g * dv),
        rng.linear(h * dv, c),
        h,
        g,
    )
    .expect("consistent projection shapes")
}

// ---------------------------------------------------------------------------------
// Permutation equivariance: attention alone is blind to order.
// ---------------------------------------------------------------------------------

/// max |f(P·x) − P·f(x)| for the row permutation `perm` of a `[B, T, C]` input:
/// zero exactly when f is permutation-equivariant on x.
fn equivariance_gap(f: &dyn Fn(&Tensor) -> Tensor, x: &Tensor, perm: &[usize]) -> f32 {
    let y = f(x);
    let y_of_permuted = f(&gather_axis1(x, perm));
    max_abs_diff(gather_axis1(&y, perm).data(), y_of_permuted.data())
}

// Shared set-up of the equivariance tests: batch 2, width 12, 4 query heads sharing
// 2 key/value heads of width 4 (even, so RoPE applies).
const EQ_B: usize = 2;
const EQ_C: usize = 12;
const EQ_H: usize = 4;
const EQ_G: usize = 2;
const EQ_D: usize = 4;

fn equivariance_mha(rng: &mut Rng) -> MultiHeadAttention {
    random_mha(rng, EQ_C, EQ_C, EQ_H, EQ_G, EQ_D, EQ_D)
}

/// Positions 0..T for every batch row, flattened `[B·T]`.
fn positions(b: usize, t: usize) -> Vec<usize> {
    (0..b * t).map(|i| i % t).collect()
}

#[test]
fn self_attention_without_positions_is_permutation_equivariant() {
    let mut rng = Rng::new(1);
    let mha = equivariance_mha(&mut rng);
    for kernel in KERNELS {
        for t in ODD_T {
            let x = rng.tensor(&[EQ_B, t, EQ_C], 1.0);
            let perm = rng.permutation(t);
            let f = |x: &Tensor| mha.forward(x, None, &spec_for(kernel)).unwrap().out;
            let gap = equivariance_gap(&f, &x, &perm);
            assert!(
                gap <= 1e-5,
                "{kernel:?} T={t}: permuting inputs did not just permute outputs (gap {gap})"
            );
        }
    }
}

/// With a position encoding the model must notice the reordering: for every T ≥ 2,
/// some output moves by more than 1e-3 (outputs are O(1), so this is far above
/// rounding, which the test above bounds by 1e-5).
fn assert_order_matters(name: &str, seed: u64, f: &dyn Fn(&Tensor, Kernel) -> Tensor) {
    let mut rng = Rng::new(seed);
    for kernel in KERNELS {
        for t in [2, 7, 17, 33] {
            let x = rng.tensor(&[EQ_B, t, EQ_C], 1.0);
            let perm = rng.nontrivial_permutation(t);
            let gap = equivariance_gap(&|x| f(x, kernel), &x, &perm);
            assert!(
                gap > 1e-3,
                "{name}, {kernel:?} T={t}: output still permutation-equivariant (gap {gap})"
            );
        }
    }
}

#[test]
fn sinusoidal_positions_break_permutation_equivariance() {
    let mut rng = Rng::new(2);
    let mha = equivariance_mha(&mut rng);
    let table = sinusoidal_table(64, EQ_C, SinusoidalLayout::Interleaved);
    // The encoding is added to the token inputs, by position, after any reordering.
    let f = |x: &Tensor, kernel| {
        let c = EQ_C;
        let t = x.shape()[1];
        let with_pos = Tensor::from_fn(x.shape(), |idx| {
            x.data()[idx] + table.data()[((idx / c) % t) * c + idx % c]
        });
        mha.forward(&with_pos, None, &spec_for(kernel)).unwrap().out
    };
    assert_order_matters("sinusoidal", 3, &f);
}

#[test]
fn learned_positions_break_permutation_equivariance() {
    let mut rng = Rng::new(4);
    let mha = equivariance_mha(&mut rng);
    let learned = LearnedPositions::new(rng.tensor(&[64, EQ_C], 1.0)).unwrap();
    let f = |x: &Tensor, kernel| {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let mut flat = x.clone().reshape(&[b * t, EQ_C]).unwrap();
        learned.add_to(&mut flat, &positions(b, t)).unwrap();
        let with_pos = flat.reshape(&[b, t, EQ_C]).unwrap();
        mha.forward(&with_pos, None, &spec_for(kernel)).unwrap().out
    };
    assert_order_matters("learned", 5, &f);
}

#[test]
fn rope_breaks_permutation_equivariance_in_both_layouts() {
    let mut rng = Rng::new(6);
    let mha = equivariance_mha(&mut rng);
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        let rope = Rope::new(EQ_D, 10_000.0, layout).unwrap();
        let f = |x: &Tensor, kernel| {
            let (b, t) = (x.shape()[0], x.shape()[1]);
            mha.forward_rope(x, &spec_for(kernel), &rope, &positions(b, t))
                .unwrap()
                .out
        };
        assert_order_matters(&format!("RoPE {layout:?}"), 7, &f);
    }
}

#[test]
fn alibi_breaks_permutation_equivariance() {
    let mut rng = Rng::new(8);
    let mha = equivariance_mha(&mut rng);
    let slopes = alibi_slopes(EQ_H);
    let f = |x: &Tensor, kernel| {
        let spec = AttentionSpec {
            bias: Some(Bias::Alibi { slopes: &slopes }),
            kernel,
            ..Default::default()
        };
        mha.forward(x, None, &spec).unwrap().out
    };
    assert_order_matters("ALiBi", 9, &f);
}

#[test]
fn t5_relative_bias_breaks_permutation_equivariance() {
    let mut rng = Rng::new(10);
    let mha = equivariance_mha(&mut rng);
    let rel = RelativeBias::new(rng.tensor(&[32, EQ_H], 1.0), true, 128).unwrap();
    let f = |x: &Tensor, kernel| {
        let t = x.shape()[1];
        let bias = rel.compute(t, t, 0);
        let spec = AttentionSpec {
            bias: Some(Bias::Dense(bias.as_broadcast().unwrap())),
            kernel,
            ..Default::default()
        };
        mha.forward(x, None, &spec).unwrap().out
    };
    assert_order_matters("T5 relative bias", 11, &f);
}

// ---------------------------------------------------------------------------------
// RoPE: scores depend only on the offset m − n; rotations keep norms.
// ---------------------------------------------------------------------------------

/// RoPE(x, pos) for one head vector, through the tensor API models use.
fn rope_at(rope: &Rope, x: &[f32], pos: usize) -> Vec<f32> {
    let mut t = Tensor::new(&[1, 1, 1, x.len()], x.to_vec()).unwrap();
    rope.apply(&mut t, &[pos]).unwrap();
    t.into_data()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f32]) -> f32 {
    dot(a, a).sqrt()
}

/// (head_dim, rotary_dim) pairs: full rotary at several widths, and partial rotary
/// (GPT-NeoX / Phi style) where the last D − R dimensions pass through.
const ROPE_WIDTHS: [(usize, usize); 6] = [(2, 2), (8, 8), (16, 16), (64, 64), (16, 6), (10, 4)];

#[test]
fn rope_inner_product_depends_only_on_position_offset() {
    let mut rng = Rng::new(12);
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        for (d, r) in ROPE_WIDTHS {
            let rope = Rope::partial(d, r, 10_000.0, layout).unwrap();
            let q = rng.tensor(&[d], 1.0).into_data();
            let k = rng.tensor(&[d], 1.0).into_data();
            let scale = norm(&q) * norm(&k);
            // Angles pos·θ are formed in f32: at positions ≤ 250 their absolute error is
            // ≲ 250 · 2⁻²³ ≈ 3e-5 rad, so a score moves by at most ~3e-5 · |q||k|.
            let tol = 2e-4 * scale;
            let mut spread_over_offsets = 0.0f32;
            for (m, n) in [(0, 0), (3, 1), (1, 3), (17, 2), (5, 33), (40, 40)] {
                let base = dot(&rope_at(&rope, &q, m), &rope_at(&rope, &k, n));
                for c in [1, 2, 7, 33, 100, 200] {
                    let shifted = dot(&rope_at(&rope, &q, m + c), &rope_at(&rope, &k, n + c));
                    assert!(
                        (base - shifted).abs() <= tol,
                        "{layout:?} D={d} R={r}: <q@{m}, k@{n}> = {base} but <q@{}, k@{}> = {shifted}",
                        m + c,
                        n + c
                    );
                }
                // Not vacuous: a different offset gives a different score.
                let other = dot(&rope_at(&rope, &q, m), &rope_at(&rope, &k, n + 1));
                spread_over_offsets = spread_over_offsets.max((base - other).abs());
            }
            assert!(
                spread_over_offsets > 1e-2 * scale,
                "{layout:?} D={d} R={r}: scores do not depend on the offset at all"
            );
        }
    }
}

#[test]
fn rope_preserves_norms() {
    let mut rng = Rng::new(13);
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        for (d, r) in ROPE_WIDTHS {
            let rope = Rope::partial(d, r, 10_000.0, layout).unwrap();
            let x = rng.tensor(&[d], 1.0).into_data();
            for pos in [0, 1, 7, 33, 1000, 65_535] {
                let y = rope_at(&rope, &x, pos);
                let (nx, ny) = (norm(&x), norm(&y));
                assert!(
                    (nx - ny).abs() <= 1e-5 * nx,
                    "{layout:?} D={d} R={r} pos {pos}: |x| = {nx}, |RoPE(x)| = {ny}"
                );
            }
        }
    }
}

/// The attention-level consequence of the offset property: shifting every position
/// by the same c (e.g. a decode offset) leaves RoPE attention unchanged.
#[test]
fn rope_attention_is_invariant_to_a_common_position_shift() {
    let mut rng = Rng::new(14);
    let mha = equivariance_mha(&mut rng);
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        let rope = Rope::new(EQ_D, 10_000.0, layout).unwrap();
        for kernel in KERNELS {
            for t in ODD_T {
                let x = rng.tensor(&[EQ_B, t, EQ_C], 1.0);
                let spec = AttentionSpec {
                    causal: Some(CausalAlign::TopLeft),
                    kernel,
                    ..Default::default()
                };
                let base = mha
                    .forward_rope(&x, &spec, &rope, &positions(EQ_B, t))
                    .unwrap();
                for c in [1, 10, 100] {
                    let shifted: Vec<usize> = positions(EQ_B, t).iter().map(|p| p + c).collect();
                    let moved = mha.forward_rope(&x, &spec, &rope, &shifted).unwrap();
                    // Angle rounding at positions ≤ 133 (see above) bounds the change.
                    assert_close(
                        &format!("{layout:?} {kernel:?} T={t} shift {c}"),
                        &moved.out,
                        &base.out,
                        1e-4,
                        1e-4,
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Sinusoidal encodings: PE(pos + k) is a fixed linear map of PE(pos).
// ---------------------------------------------------------------------------------

#[test]
fn sinusoidal_shift_is_a_fixed_linear_map() {
    let n_pos = 300;
    for d in [2, 8, 16, 64, 128] {
        for k in [0, 1, 2, 5, 17, 100] {
            let table = sinusoidal_table(n_pos + k, d, SinusoidalLayout::Interleaved);
            let m = shift_matrix(k, d);
            assert_eq!(m.shape(), &[d, d]);
            // The same M_k for every position: that is the claim.
            for pos in 0..n_pos {
                let pe = &table.data()[pos * d..(pos + 1) * d];
                let mapped: Vec<f32> = m.data().chunks_exact(d).map(|row| dot(row, pe)).collect();
                let want = &table.data()[(pos + k) * d..(pos + k + 1) * d];
                // Entries are f32 roundings of exact sines and cosines; each output is
                // a sum of two products, so the error is a few f32 ulps of 1.
                assert_slices_close(&format!("d={d} k={k} pos={pos}"), &mapped, want, 1e-6, 0.0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Causal masks: an output never depends on later tokens.
// ---------------------------------------------------------------------------------

/// A copy of `x` ([B, N, ...]) with rows after `cut` on axis 1 replaced by fresh noise.
fn replace_rows_after(rng: &mut Rng, x: &Tensor, cut: usize) -> Tensor {
    let n = x.shape()[1];
    let inner: usize = x.shape()[2..].iter().product();
    Tensor::from_fn(x.shape(), |idx| {
        let row = (idx / inner) % n;
        if row > cut {
            rng.normal() as f32 * 3.0
        } else {
            x.data()[idx]
        }
    })
}

fn cut_points(t: usize) -> Vec<usize> {
    let mut cuts = vec![0, t / 2, t - 1];
    cuts.dedup();
    cuts
}

/// Decoder self-attention (top-left alignment, T = S) through the whole module.
#[test]
fn causal_self_attention_ignores_future_tokens() {
    let mut rng = Rng::new(20);
    let mha = random_mha(&mut rng, 10, 10, 3, 3, 4, 5);
    for kernel in KERNELS {
        let spec = AttentionSpec {
            causal: Some(CausalAlign::TopLeft),
            kernel,
            ..Default::default()
        };
        for t in ODD_T {
            let x = rng.tensor(&[2, t, 10], 1.0);
            let y = mha.forward(&x, None, &spec).unwrap().out;
            for cut in cut_points(t) {
                let x2 = replace_rows_after(&mut rng, &x, cut);
                let y2 = mha.forward(&x2, None, &spec).unwrap().out;
                let keep: Vec<usize> = (0..=cut).collect();
                assert_close(
                    &format!("{kernel:?} T={t}, tokens after {cut} changed"),
                    &gather_axis1(&y2, &keep),
                    &gather_axis1(&y, &keep),
                    1e-6,
                    0.0,
                );
                if cut + 1 < t {
                    // Not vacuous: the changed tokens' own outputs did change.
                    let later: Vec<usize> = (cut + 1..t).collect();
                    let moved = max_abs_diff(
                        gather_axis1(&y2, &later).data(),
                        gather_axis1(&y, &later).data(),
                    );
                    assert!(moved > 1e-3, "{kernel:?} T={t}: later outputs unchanged");
                }
            }
        }
    }
}

/// Bottom-right alignment with T < S: the T queries are the last T of S positions
/// (cached decoding), so query i sits at position i + S − T and must ignore keys
/// after it.
#[test]
fn causal_bottom_right_ignores_keys_after_each_query() {
    let mut rng = Rng::new(21);
    for kernel in KERNELS {
        let spec = AttentionSpec {
            causal: Some(CausalAlign::BottomRight),
            kernel,
            ..Default::default()
        };
        for t in ODD_T {
            for extra in [1, 5, 40] {
                let s = t + extra;
                let z = Sizes {
                    b: 2,
                    t,
                    s,
                    h: 4,
                    g: 2,
                    d: 8,
                    dv: 8,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let a = attention(&q, &k, &v, &spec).unwrap();
                for cut in cut_points(t) {
                    let pos = cut + s - t;
                    let q2 = replace_rows_after(&mut rng, &q, cut);
                    let k2 = replace_rows_after(&mut rng, &k, pos);
                    let v2 = replace_rows_after(&mut rng, &v, pos);
                    let a2 = attention(&q2, &k2, &v2, &spec).unwrap();
                    let keep: Vec<usize> = (0..=cut).collect();
                    assert_close(
                        &format!("{kernel:?} T={t} S={s}, keys after {pos} changed"),
                        &gather_axis1(&a2.out, &keep),
                        &gather_axis1(&a.out, &keep),
                        1e-6,
                        0.0,
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Padding: padded keys are invisible.
// ---------------------------------------------------------------------------------

/// A random `[B, S]` key-padding pattern (true = real key) with at least one real key
/// per row, padding anywhere (not only at the end).
fn random_padding(rng: &mut Rng, b: usize, s: usize) -> Vec<bool> {
    let mut pad: Vec<bool> = (0..b * s).map(|_| rng.bernoulli(0.6)).collect();
    for row in pad.chunks_exact_mut(s) {
        if !row.contains(&true) {
            row[rng.below(s)] = true;
        }
    }
    pad
}

#[test]
fn changing_padded_keys_changes_no_output() {
    let mut rng = Rng::new(30);
    for kernel in KERNELS {
        for t in ODD_T {
            for s in [1, 2, 9, 33] {
                let z = Sizes {
                    b: 3,
                    t,
                    s,
                    h: 4,
                    g: 2,
                    d: 6,
                    dv: 5,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let pad = random_padding(&mut rng, z.b, s);
                let spec = AttentionSpec {
                    key_padding: Some(&pad),
                    want_weights: true,
                    kernel,
                    ..Default::default()
                };
                // K and V rows of padded keys get large, unrelated values.
                let scramble = |rng: &mut Rng, x: &Tensor| {
                    let inner = x.shape()[2] * x.shape()[3];
                    Tensor::from_fn(x.shape(), |idx| {
                        if pad[idx / inner] {
                            x.data()[idx]
                        } else {
                            rng.normal() as f32 * 100.0
                        }
                    })
                };
                let (k2, v2) = (scramble(&mut rng, &k), scramble(&mut rng, &v));
                let a = attention(&q, &k, &v, &spec).unwrap();
                let a2 = attention(&q, &k2, &v2, &spec).unwrap();
                let what = format!("{kernel:?} T={t} S={s}");
                assert_close(&what, &a2.out, &a.out, 1e-6, 0.0);
                assert_close(
                    &what,
                    a2.weights.as_ref().unwrap(),
                    a.weights.as_ref().unwrap(),
                    1e-6,
                    0.0,
                );
            }
        }
    }
}

/// A right-padded batch row gives the same output as that row run alone with only
/// its real keys, with and without a (top-left) causal mask.
#[test]
fn padded_batch_row_equals_row_run_alone() {
    let mut rng = Rng::new(31);
    for kernel in KERNELS {
        for causal in [None, Some(CausalAlign::TopLeft)] {
            for t in ODD_T {
                let s = 33;
                let lens = [s, 1 + rng.below(s), 1 + rng.below(s)];
                let z = Sizes {
                    b: 3,
                    t,
                    s,
                    h: 3,
                    g: 1,
                    d: 5,
                    dv: 7,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let pad: Vec<bool> = lens
                    .iter()
                    .flat_map(|&l| (0..s).map(move |j| j < l))
                    .collect();
                let spec = AttentionSpec {
                    key_padding: Some(&pad),
                    causal,
                    kernel,
                    ..Default::default()
                };
                let batched = attention(&q, &k, &v, &spec).unwrap();
                let alone_spec = AttentionSpec {
                    causal,
                    kernel,
                    ..Default::default()
                };
                for (b, &len) in lens.iter().enumerate() {
                    let real: Vec<usize> = (0..len).collect();
                    let alone = attention(
                        &batch_row(&q, b),
                        &gather_axis1(&batch_row(&k, b), &real),
                        &gather_axis1(&batch_row(&v, b), &real),
                        &alone_spec,
                    )
                    .unwrap();
                    assert_close(
                        &format!("{kernel:?} {causal:?} T={t}, row {b} with {len} real keys"),
                        &batch_row(&batched.out, b),
                        &alone.out,
                        1e-5,
                        0.0,
                    );
                }
            }
        }
    }
}

/// End to end through multi-head self-attention: sequences of different lengths
/// padded into one batch (pad tokens hold garbage) give each real token the output it
/// gets when its sequence runs alone.
#[test]
fn padding_does_not_change_real_tokens_outputs() {
    let mut rng = Rng::new(32);
    let mha = random_mha(&mut rng, 12, 12, 4, 4, 3, 3);
    let lens = [7, 1, 33, 17, 2];
    let t_max = 33;
    for kernel in KERNELS {
        let seqs: Vec<Tensor> = lens.iter().map(|&l| rng.tensor(&[1, l, 12], 1.0)).collect();
        let mut data = Vec::new();
        let mut pad = Vec::new();
        for (seq, &l) in seqs.iter().zip(&lens) {
            data.extend_from_slice(seq.data());
            data.extend((0..(t_max - l) * 12).map(|_| rng.normal() as f32 * 5.0));
            pad.extend((0..t_max).map(|j| j < l));
        }
        let x = Tensor::new(&[lens.len(), t_max, 12], data).unwrap();
        let spec = AttentionSpec {
            key_padding: Some(&pad),
            kernel,
            ..Default::default()
        };
        let batched = mha.forward(&x, None, &spec).unwrap().out;
        for (b, (seq, &l)) in seqs.iter().zip(&lens).enumerate() {
            let alone = mha.forward(seq, None, &spec_for(kernel)).unwrap().out;
            let real: Vec<usize> = (0..l).collect();
            assert_close(
                &format!("{kernel:?} sequence {b} of length {l}"),
                &gather_axis1(&batch_row(&batched, b), &real),
                &alone,
                1e-5,
                0.0,
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// Why scale by 1/√d_k: Var(q·k) = d_k for unit-variance q, k.
// ---------------------------------------------------------------------------------

fn sample_variance(xs: &[f32]) -> f64 {
    let n = xs.len() as f64;
    let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / n;
    xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)
}

#[test]
fn dot_product_variance_is_dk_and_one_after_scaling() {
    // n independent (q, k) pairs as a batch of n single-query, single-key calls: with
    // one key, the log-sum-exp of a row is exactly its score, scale·q·k.
    let n = 20_000;
    let mut rng = Rng::new(40);
    for d in [1, 4, 16, 64, 256] {
        let q = rng.tensor(&[n, 1, 1, d], 1.0);
        let k = rng.tensor(&[n, 1, 1, d], 1.0);
        let v = Tensor::zeros(&[n, 1, 1, 1]);
        // q·k = Σ q_i k_i: each term has variance 1 and fourth moment 9, so the sum has
        // variance d and kurtosis κ = 3 + 6/d. The sample variance of n draws has
        // relative standard error √((κ − 1)/n) = √((2 + 6/d)/n) (≈ 2% for d = 1 and
        // 1% for large d at n = 20 000). Five standard errors leave a false failure
        // probability below 1e-6 — and the seed is fixed anyway.
        let tol = 5.0 * ((2.0 + 6.0 / d as f64) / n as f64).sqrt();
        for kernel in KERNELS {
            let raw_spec = AttentionSpec {
                scale: Some(1.0),
                kernel,
                ..Default::default()
            };
            let raw = attention(&q, &k, &v, &raw_spec).unwrap().lse;
            let scaled = attention(&q, &k, &v, &spec_for(kernel)).unwrap().lse;
            let var_raw = sample_variance(raw.data());
            let var_scaled = sample_variance(scaled.data());
            assert!(
                (var_raw / d as f64 - 1.0).abs() < tol,
                "{kernel:?} d_k={d}: Var(q·k) = {var_raw}, expected ≈ {d} (rel tol {tol})"
            );
            assert!(
                (var_scaled - 1.0).abs() < tol,
                "{kernel:?} d_k={d}: Var(q·k/√d_k) = {var_scaled}, expected ≈ 1 (rel tol {tol})"
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// Grouped-query attention.
// ---------------------------------------------------------------------------------

#[test]
fn gqa_with_g_equal_h_is_mha_head_by_head() {
    let mut rng = Rng::new(50);
    for kernel in KERNELS {
        for causal in [None, Some(CausalAlign::BottomRight)] {
            for t in ODD_T {
                let z = Sizes {
                    b: 2,
                    t,
                    s: t + 3,
                    h: 4,
                    g: 4,
                    d: 6,
                    dv: 5,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let spec = AttentionSpec {
                    causal,
                    want_weights: true,
                    kernel,
                    ..Default::default()
                };
                let all = attention(&q, &k, &v, &spec).unwrap();
                for h in 0..z.h {
                    let one = attention(&head(&q, h), &head(&k, h), &head(&v, h), &spec).unwrap();
                    assert_close(
                        &format!("{kernel:?} {causal:?} T={t} head {h}"),
                        &head(&all.out, h),
                        &one.out,
                        1e-6,
                        0.0,
                    );
                }
            }
        }
    }
}

/// K or V `[B,S,G,D]` with each kv head repeated so query head h gets kv head
/// h / (H/G): `[B,S,H,D]`, materialised here only to check the strided kernels.
fn repeat_kv(x: &Tensor, h: usize) -> Tensor {
    let [b, s, g, d] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let rep = h / g;
    Tensor::from_fn(&[b, s, h, d], |idx| {
        let (row, hh, c) = (idx / (h * d), (idx / d) % h, idx % d);
        x.data()[(row * g + hh / rep) * d + c]
    })
}

#[test]
fn gqa_equals_attention_with_repeated_kv_heads() {
    let mut rng = Rng::new(51);
    for kernel in KERNELS {
        for g in [1, 2, 3] {
            for t in ODD_T {
                let z = Sizes {
                    b: 2,
                    t,
                    s: 2 * t + 1,
                    h: 6,
                    g,
                    d: 4,
                    dv: 7,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let pad = random_padding(&mut rng, z.b, z.s);
                let spec = AttentionSpec {
                    causal: Some(CausalAlign::BottomRight),
                    key_padding: Some(&pad),
                    want_weights: true,
                    kernel,
                    ..Default::default()
                };
                let grouped = attention(&q, &k, &v, &spec).unwrap();
                let repeated =
                    attention(&q, &repeat_kv(&k, z.h), &repeat_kv(&v, z.h), &spec).unwrap();
                let what = format!("{kernel:?} G={g} T={t}");
                assert_close(&what, &grouped.out, &repeated.out, 1e-6, 0.0);
                assert_close(
                    &what,
                    grouped.weights.as_ref().unwrap(),
                    repeated.weights.as_ref().unwrap(),
                    1e-6,
                    0.0,
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Softmax weights.
// ---------------------------------------------------------------------------------

#[test]
fn weight_rows_sum_to_one_and_masked_keys_get_zero() {
    let mut rng = Rng::new(60);
    for kernel in KERNELS {
        for t in ODD_T {
            let z = Sizes {
                b: 2,
                t,
                s: t,
                h: 3,
                g: 3,
                d: 8,
                dv: 8,
            };
            let (q, k, v) = random_qkv(&mut rng, z);
            // Key 0 is always real, so every causal row sees at least one key.
            let mut pad = random_padding(&mut rng, z.b, z.s);
            for row in pad.chunks_exact_mut(z.s) {
                row[0] = true;
            }
            let spec = AttentionSpec {
                causal: Some(CausalAlign::TopLeft),
                key_padding: Some(&pad),
                want_weights: true,
                kernel,
                ..Default::default()
            };
            let a = attention(&q, &k, &v, &spec).unwrap();
            let w = a.weights.as_ref().unwrap();
            assert_eq!(w.shape(), &[z.b, z.h, t, t]);
            for (r, row) in w.data().chunks_exact(t).enumerate() {
                let (b, i) = (r / (z.h * t), r % t);
                let sum: f32 = row.iter().sum();
                assert!(
                    (sum - 1.0).abs() < 1e-5,
                    "{kernel:?} T={t}: row {r} sums to {sum}"
                );
                for (j, &p) in row.iter().enumerate() {
                    let visible = j <= i && pad[b * t + j];
                    assert!(p >= 0.0, "{kernel:?}: negative weight {p}");
                    if !visible {
                        assert_eq!(
                            p, 0.0,
                            "{kernel:?} T={t}: masked key {j} of query {i} has weight"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn fully_masked_rows_give_zero_weights_and_zero_output() {
    let mut rng = Rng::new(61);
    let (t, s) = (7, 5);
    let z = Sizes {
        b: 2,
        t,
        s,
        h: 2,
        g: 1,
        d: 4,
        dv: 3,
    };
    let (q, k, v) = random_qkv(&mut rng, z);

    // Each way of masking a whole row: (description, spec, is row (b, h, i) masked).
    // Bool mask [B,1,T,S] hiding every key from queries 1 and 4 of batch row 0.
    let mask: Vec<bool> = (0..z.b * t * s)
        .map(|idx| {
            let (b, i) = (idx / (t * s), (idx / s) % t);
            !(b == 0 && (i == 1 || i == 4))
        })
        .collect();
    // Batch row 1 has no real keys at all.
    let pad: Vec<bool> = (0..z.b * s).map(|idx| idx < s).collect();
    // A float mask of −∞ over every key of query 3, head 1.
    let bias = Tensor::from_fn(&[1, z.h, t, s], |idx| {
        let (h, i) = (idx / (t * s), (idx / s) % t);
        if h == 1 && i == 3 {
            f32::NEG_INFINITY
        } else {
            0.0
        }
    });
    type Rule = Box<dyn Fn(usize, usize, usize) -> bool>;
    let cases: Vec<(&str, AttentionSpec, Rule)> = vec![
        (
            "bool mask",
            AttentionSpec {
                mask: Some(Broadcast::new(&mask, [z.b, 1, t, s])),
                ..Default::default()
            },
            Box::new(|b, _, i| b == 0 && (i == 1 || i == 4)),
        ),
        (
            "key padding",
            AttentionSpec {
                key_padding: Some(&pad),
                ..Default::default()
            },
            Box::new(|b, _, _| b == 1),
        ),
        (
            "-inf bias",
            AttentionSpec {
                bias: Some(Bias::Dense(bias.as_broadcast().unwrap())),
                ..Default::default()
            },
            Box::new(|_, h, i| h == 1 && i == 3),
        ),
        (
            // T > S bottom-right: the first T − S queries precede every key.
            "causal bottom-right, T > S",
            AttentionSpec {
                causal: Some(CausalAlign::BottomRight),
                ..Default::default()
            },
            Box::new(move |_, _, i| i < t - s),
        ),
        (
            // Top-left window: query 6 at position 6 sees keys 5..=6, beyond S = 5.
            "causal window past the keys",
            AttentionSpec {
                causal: Some(CausalAlign::TopLeft),
                window: Some(1),
                ..Default::default()
            },
            Box::new(move |_, _, i| i >= s),
        ),
    ];
    for kernel in KERNELS {
        for (name, spec, masked) in &cases {
            let spec = AttentionSpec {
                want_weights: true,
                kernel,
                ..*spec
            };
            let a = attention(&q, &k, &v, &spec).unwrap();
            let what = format!("{kernel:?} {name}");
            assert_no_nan(&what, &a);
            let w = a.weights.as_ref().unwrap();
            let mut n_masked = 0;
            for b in 0..z.b {
                for h in 0..z.h {
                    for i in 0..t {
                        let wrow = &w.data()[((b * z.h + h) * t + i) * s..][..s];
                        let orow = &a.out.data()[((b * t + i) * z.h + h) * z.dv..][..z.dv];
                        let lse = a.lse.data()[(b * z.h + h) * t + i];
                        if masked(b, h, i) {
                            n_masked += 1;
                            assert!(wrow.iter().all(|&p| p == 0.0), "{what}: weights {wrow:?}");
                            assert!(orow.iter().all(|&o| o == 0.0), "{what}: output {orow:?}");
                            assert_eq!(lse, f32::NEG_INFINITY, "{what}: lse of masked row");
                        } else {
                            let sum: f32 = wrow.iter().sum();
                            assert!((sum - 1.0).abs() < 1e-5, "{what}: row sums to {sum}");
                            assert!(lse.is_finite(), "{what}: lse {lse} of a visible row");
                        }
                    }
                }
            }
            assert!(n_masked > 0, "{what}: the case masks no row");
        }
    }
}

// ---------------------------------------------------------------------------------
// The reference and tiled kernels are twins.
// ---------------------------------------------------------------------------------

/// Runs both kernels with weights and asserts equal outputs, weights and log-sum-exp;
/// also that asking the tiled kernel for weights does not change its output.
#[track_caller]
fn assert_kernels_agree(what: &str, q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttentionSpec) {
    let run = |kernel, want_weights| -> AttentionOutput {
        let spec = AttentionSpec {
            kernel,
            want_weights,
            ..*spec
        };
        attention(q, k, v, &spec).unwrap()
    };
    let reference = run(Kernel::Reference, true);
    let tiled = run(Kernel::Tiled, true);
    assert_no_nan(what, &reference);
    assert_no_nan(what, &tiled);
    assert_close(
        &format!("{what}: out"),
        &tiled.out,
        &reference.out,
        1e-5,
        0.0,
    );
    assert_close(
        &format!("{what}: weights"),
        tiled.weights.as_ref().unwrap(),
        reference.weights.as_ref().unwrap(),
        1e-5,
        0.0,
    );
    // lse grows like ln S plus the largest score, so allow a relative part too.
    assert_close(
        &format!("{what}: lse"),
        &tiled.lse,
        &reference.lse,
        1e-5,
        1e-5,
    );
    let tiled_plain = run(Kernel::Tiled, false);
    assert!(
        tiled_plain.weights.is_none(),
        "{what}: weights not asked for"
    );
    assert_close(
        &format!("{what}: out without weights"),
        &tiled_plain.out,
        &tiled.out,
        0.0,
        0.0,
    );
}

/// Key lengths paired with each odd T: equal, shorter and longer.
fn key_lengths(t: usize) -> Vec<usize> {
    let mut s = vec![t, (t / 2).max(1), t + 7];
    s.dedup();
    s
}

#[test]
fn kernels_agree_without_mask() {
    let mut rng = Rng::new(70);
    for t in ODD_T {
        for s in key_lengths(t) {
            let z = Sizes {
                b: 2,
                t,
                s,
                h: 3,
                g: 3,
                d: 8,
                dv: 8,
            };
            let (q, k, v) = random_qkv(&mut rng, z);
            assert_kernels_agree(
                &format!("T={t} S={s}"),
                &q,
                &k,
                &v,
                &AttentionSpec::default(),
            );
        }
    }
}

#[test]
fn kernels_agree_with_causal_masks_in_both_alignments() {
    let mut rng = Rng::new(71);
    for align in [CausalAlign::TopLeft, CausalAlign::BottomRight] {
        for t in ODD_T {
            // S < T included: bottom-right then masks whole leading rows.
            for s in key_lengths(t) {
                let z = Sizes {
                    b: 2,
                    t,
                    s,
                    h: 2,
                    g: 2,
                    d: 5,
                    dv: 5,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let spec = AttentionSpec {
                    causal: Some(align),
                    ..Default::default()
                };
                assert_kernels_agree(&format!("{align:?} T={t} S={s}"), &q, &k, &v, &spec);
            }
        }
    }
}

#[test]
fn kernels_agree_with_sliding_windows() {
    let mut rng = Rng::new(72);
    for causal in [
        None,
        Some(CausalAlign::TopLeft),
        Some(CausalAlign::BottomRight),
    ] {
        for w in [1, 3, 16] {
            for t in ODD_T {
                for s in key_lengths(t) {
                    let z = Sizes {
                        b: 1,
                        t,
                        s,
                        h: 2,
                        g: 1,
                        d: 4,
                        dv: 6,
                    };
                    let (q, k, v) = random_qkv(&mut rng, z);
                    let spec = AttentionSpec {
                        causal,
                        window: Some(w),
                        ..Default::default()
                    };
                    assert_kernels_agree(
                        &format!("{causal:?} window {w} T={t} S={s}"),
                        &q,
                        &k,
                        &v,
                        &spec,
                    );
                }
            }
        }
    }
}

/// A window at least as wide as every query–key distance restricts nothing, however
/// large: `usize::MAX` ("unlimited") must not wrap around to a negative width.
#[test]
fn window_wider_than_every_distance_is_no_window() {
    let mut rng = Rng::new(81);
    for kernel in KERNELS {
        for causal in [
            None,
            Some(CausalAlign::TopLeft),
            Some(CausalAlign::BottomRight),
        ] {
            for t in ODD_T {
                for s in key_lengths(t) {
                    let z = Sizes {
                        b: 1,
                        t,
                        s,
                        h: 2,
                        g: 2,
                        d: 4,
                        dv: 4,
                    };
                    let (q, k, v) = random_qkv(&mut rng, z);
                    let plain = AttentionSpec {
                        causal,
                        kernel,
                        ..Default::default()
                    };
                    let want = attention(&q, &k, &v, &plain).unwrap();
                    for w in [s + t, 1 << 20, isize::MAX as usize, usize::MAX] {
                        let spec = AttentionSpec {
                            window: Some(w),
                            ..plain
                        };
                        let got = attention(&q, &k, &v, &spec).unwrap();
                        let what = format!("{kernel:?} {causal:?} window {w} T={t} S={s}");
                        assert_close(&what, &got.out, &want.out, 0.0, 0.0);
                    }
                }
            }
        }
    }
}

#[test]
fn kernels_agree_with_key_padding() {
    let mut rng = Rng::new(73);
    for t in ODD_T {
        for s in key_lengths(t) {
            let z = Sizes {
                b: 3,
                t,
                s,
                h: 2,
                g: 2,
                d: 8,
                dv: 8,
            };
            let (q, k, v) = random_qkv(&mut rng, z);
            let mut pad = random_padding(&mut rng, z.b, s);
            // One batch row entirely padding: its rows must be zero in both.
            pad[..s].fill(false);
            let spec = AttentionSpec {
                key_padding: Some(&pad),
                ..Default::default()
            };
            assert_kernels_agree(&format!("T={t} S={s}"), &q, &k, &v, &spec);
        }
    }
}

#[test]
fn kernels_agree_with_bool_masks_in_every_broadcast() {
    let mut rng = Rng::new(74);
    let (b, h) = (2, 3);
    for [bm, hm] in [[1, 1], [b, 1], [1, h], [b, h]] {
        for t in ODD_T {
            for s in key_lengths(t) {
                let z = Sizes {
                    b,
                    t,
                    s,
                    h,
                    g: 1,
                    d: 8,
                    dv: 4,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let mask: Vec<bool> = (0..bm * hm * t * s).map(|_| rng.bernoulli(0.7)).collect();
                let spec = AttentionSpec {
                    mask: Some(Broadcast::new(&mask, [bm, hm, t, s])),
                    ..Default::default()
                };
                assert_kernels_agree(&format!("mask [{bm},{hm},{t},{s}]"), &q, &k, &v, &spec);
            }
        }
    }
}

#[test]
fn kernels_agree_with_dense_bias() {
    let mut rng = Rng::new(75);
    let (b, h) = (2, 4);
    for [bm, hm] in [[1, 1], [b, 1], [1, h], [b, h]] {
        for t in ODD_T {
            for s in key_lengths(t) {
                let z = Sizes {
                    b,
                    t,
                    s,
                    h,
                    g: 2,
                    d: 8,
                    dv: 8,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                // Real-valued bias with some −∞ entries (a float mask).
                let bias = Tensor::from_fn(&[bm, hm, t, s], |_| {
                    if rng.bernoulli(0.15) {
                        f32::NEG_INFINITY
                    } else {
                        rng.normal() as f32 * 2.0
                    }
                });
                let spec = AttentionSpec {
                    bias: Some(Bias::Dense(bias.as_broadcast().unwrap())),
                    ..Default::default()
                };
                assert_kernels_agree(&format!("bias [{bm},{hm},{t},{s}]"), &q, &k, &v, &spec);
            }
        }
    }
}

#[test]
fn kernels_agree_with_alibi() {
    let mut rng = Rng::new(76);
    // 6 heads: not a power of two, so BLOOM's interleaved extra slopes are used.
    let slopes = alibi_slopes(6);
    for causal in [
        None,
        Some(CausalAlign::TopLeft),
        Some(CausalAlign::BottomRight),
    ] {
        for t in ODD_T {
            for s in key_lengths(t) {
                let z = Sizes {
                    b: 2,
                    t,
                    s,
                    h: 6,
                    g: 2,
                    d: 4,
                    dv: 4,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let spec = AttentionSpec {
                    causal,
                    bias: Some(Bias::Alibi { slopes: &slopes }),
                    ..Default::default()
                };
                assert_kernels_agree(&format!("ALiBi {causal:?} T={t} S={s}"), &q, &k, &v, &spec);
            }
        }
    }
}

#[test]
fn kernels_agree_with_all_masks_combined() {
    let mut rng = Rng::new(77);
    let slopes = alibi_slopes(4);
    for t in ODD_T {
        for s in key_lengths(t) {
            let z = Sizes {
                b: 2,
                t,
                s,
                h: 4,
                g: 2,
                d: 6,
                dv: 3,
            };
            let (q, k, v) = random_qkv(&mut rng, z);
            let pad = random_padding(&mut rng, z.b, s);
            let mask: Vec<bool> = (0..z.b * t * s).map(|_| rng.bernoulli(0.8)).collect();
            let bias = rng.tensor(&[1, z.h, t, s], 1.0);
            for alibi in [false, true] {
                let spec = AttentionSpec {
                    scale: Some(0.3),
                    causal: Some(CausalAlign::BottomRight),
                    window: Some(5),
                    key_padding: Some(&pad),
                    mask: Some(Broadcast::new(&mask, [z.b, 1, t, s])),
                    bias: Some(if alibi {
                        Bias::Alibi { slopes: &slopes }
                    } else {
                        Bias::Dense(bias.as_broadcast().unwrap())
                    }),
                    ..Default::default()
                };
                assert_kernels_agree(
                    &format!("combined (alibi {alibi}) T={t} S={s}"),
                    &q,
                    &k,
                    &v,
                    &spec,
                );
            }
        }
    }
}

#[test]
fn kernels_agree_for_gqa_and_mqa() {
    let mut rng = Rng::new(78);
    for g in [1, 2, 4, 8] {
        for t in ODD_T {
            for s in key_lengths(t) {
                let z = Sizes {
                    b: 2,
                    t,
                    s,
                    h: 8,
                    g,
                    d: 4,
                    dv: 4,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                let spec = AttentionSpec {
                    causal: Some(CausalAlign::BottomRight),
                    ..Default::default()
                };
                assert_kernels_agree(&format!("H=8 G={g} T={t} S={s}"), &q, &k, &v, &spec);
            }
        }
    }
}

#[test]
fn kernels_agree_when_value_width_differs() {
    let mut rng = Rng::new(79);
    for (d, dv) in [(4, 1), (4, 9), (16, 3), (3, 64)] {
        for t in ODD_T {
            for s in key_lengths(t) {
                let z = Sizes {
                    b: 2,
                    t,
                    s,
                    h: 2,
                    g: 1,
                    d,
                    dv,
                };
                let (q, k, v) = random_qkv(&mut rng, z);
                assert_kernels_agree(
                    &format!("D={d} Dv={dv} T={t} S={s}"),
                    &q,
                    &k,
                    &v,
                    &AttentionSpec::default(),
                );
            }
        }
    }
}

/// These sizes span several tiles with ragged edges, so the online softmax rescales
/// across key blocks and skips blocks above the causal diagonal or outside a window;
/// with up to 4 query rows the keys are split instead (flash-decoding, 512 keys a
/// split), and the splits' softmax states are merged.
#[test]
fn kernels_agree_beyond_one_tile() {
    let mut rng = Rng::new(80);
    for (t, s) in [
        (130, 130),
        (33, 200),
        (130, 7),
        (65, 129),
        (1, 300),
        (1, 1300),
        (3, 1100),
        (4, 513),
    ] {
        // ALiBi's bias grows with the distance: at BLOOM's slopes a 1100-key row scores
        // up to 275, where one f32 ulp is 3e-5 and two correct kernels' weights differ
        // by that much. Slopes scaled to the length keep the bias range of S = 300.
        let slopes: Vec<f32> = alibi_slopes(4)
            .iter()
            .map(|m| m * 300.0 / s.max(300) as f32)
            .collect();
        let z = Sizes {
            b: 2,
            t,
            s,
            h: 4,
            g: 2,
            d: 16,
            dv: 12,
        };
        // Larger inputs sharpen the softmax, so the running max changes between blocks.
        let q = rng.tensor(&[z.b, t, z.h, z.d], 2.0);
        let k = rng.tensor(&[z.b, s, z.g, z.d], 2.0);
        let v = rng.tensor(&[z.b, s, z.g, z.dv], 1.0);
        let pad = random_padding(&mut rng, z.b, s);
        let specs = [
            ("none", AttentionSpec::default()),
            (
                "causal top-left",
                AttentionSpec {
                    causal: Some(CausalAlign::TopLeft),
                    ..Default::default()
                },
            ),
            (
                "causal bottom-right",
                AttentionSpec {
                    causal: Some(CausalAlign::BottomRight),
                    ..Default::default()
                },
            ),
            (
                "causal window 50",
                AttentionSpec {
                    causal: Some(CausalAlign::BottomRight),
                    window: Some(50),
                    ..Default::default()
                },
            ),
            (
                "bidirectional window 40",
                AttentionSpec {
                    window: Some(40),
                    ..Default::default()
                },
            ),
            (
                "padding + alibi",
                AttentionSpec {
                    key_padding: Some(&pad),
                    bias: Some(Bias::Alibi { slopes: &slopes }),
                    ..Default::default()
                },
            ),
        ];
        for (name, spec) in &specs {
            assert_kernels_agree(&format!("{name} T={t} S={s}"), &q, &k, &v, spec);
        }
    }
}

// ---------------------------------------------------------------------------------
// Cross-attention.
// ---------------------------------------------------------------------------------

/// y = x·Wᵀ + b in f64, row by row, independent of the library's GEMM.
fn naive_linear(x: &[f32], lin: &Linear) -> Vec<f64> {
    let (n_in, n_out) = (lin.in_features(), lin.out_features());
    let w = lin.weight.data();
    let bias = lin.bias.as_ref().map(|b| b.data());
    x.chunks_exact(n_in)
        .flat_map(|row| {
            (0..n_out).map(move |o| {
                let acc: f64 = row
                    .iter()
                    .zip(&w[o * n_in..(o + 1) * n_in])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                acc + bias.map_or(0.0, |b| b[o] as f64)
            })
        })
        .collect()
}

/// Cross-attention from `[B, T, C]` queries to a `[B, S, Ckv]` context of another
/// length equals the formula composed by hand in f64: project, split heads, softmax
/// of scaled scores over the real context tokens, merge heads, output projection.
#[test]
fn cross_attention_equals_hand_composed_projections_and_attention() {
    let mut rng = Rng::new(90);
    let (b, t, s, c, ckv, h, g, d, dv) = (2, 7, 17, 12, 10, 4, 2, 3, 5);
    let mha = random_mha(&mut rng, c, ckv, h, g, d, dv);
    let x = rng.tensor(&[b, t, c], 1.0);
    let ctx = rng.tensor(&[b, s, ckv], 1.0);
    let pad = random_padding(&mut rng, b, s);

    let q = naive_linear(x.data(), &mha.q); // [B,T,H,D]
    let k = naive_linear(ctx.data(), &mha.k); // [B,S,G,D]
    let v = naive_linear(ctx.data(), &mha.v); // [B,S,G,Dv]
    let scale = 1.0 / (d as f64).sqrt();
    let mut weights = vec![0.0f64; b * h * t * s];
    let mut merged = vec![0.0f32; b * t * h * dv];
    for bi in 0..b {
        for hi in 0..h {
            let gi = hi / (h / g);
            for i in 0..t {
                let qrow = &q[((bi * t + i) * h + hi) * d..][..d];
                let scores: Vec<f64> = (0..s)
                    .map(|j| {
                        let krow = &k[((bi * s + j) * g + gi) * d..][..d];
                        let sc: f64 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum();
                        if pad[bi * s + j] {
                            sc * scale
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for (j, e) in exps.iter().enumerate() {
                    let p = e / sum;
                    weights[((bi * h + hi) * t + i) * s + j] = p;
                    for c2 in 0..dv {
                        let m = &mut merged[((bi * t + i) * h + hi) * dv + c2];
                        *m += (p * v[((bi * s + j) * g + gi) * dv + c2]) as f32;
                    }
                }
            }
        }
    }
    let want_out = Tensor::new(
        &[b, t, c],
        naive_linear(&merged, &mha.o)
            .into_iter()
            .map(|x| x as f32)
            .collect(),
    )
    .unwrap();
    let want_weights = Tensor::new(
        &[b, h, t, s],
        weights.into_iter().map(|x| x as f32).collect(),
    )
    .unwrap();

    for kernel in KERNELS {
        let spec = AttentionSpec {
            key_padding: Some(&pad),
            want_weights: true,
            kernel,
            ..Default::default()
        };
        let a = mha.forward(&x, Some(&ctx), &spec).unwrap();
        assert_close(&format!("{kernel:?} out"), &a.out, &want_out, 1e-5, 1e-5);
        assert_close(
            &format!("{kernel:?} weights"),
            a.weights.as_ref().unwrap(),
            &want_weights,
            1e-6,
            1e-5,
        );
    }
}
