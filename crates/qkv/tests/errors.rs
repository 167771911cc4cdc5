//! Bad input gives a clear `qkv::Error` that names the tensor or field at fault,
//! never a panic (a panic would fail the test by itself, so each test just calls the
//! library). Each test checks the error variant, the name it carries, and that the
//! rendered message contains that name.

#![cfg(feature = "models")]

mod common;

use qkv::attention::{attention_views, HeadsView, LayerKv};
use qkv::layers::{Embedding, Linear, Norm};
use qkv::position::{LearnedPositions, Rope, RopeLayout};
use qkv::rng::Rng;
use qkv::{attention, AttentionSpec, Bias, Broadcast, Error, Kernel, MultiHeadAttention, Tensor};

const KERNELS: [Kernel; 2] = [Kernel::Reference, Kernel::Tiled];

/// Asserts a `Shape` error for `tensor` whose message names it.
#[track_caller]
fn assert_shape_error(err: Error, tensor: &str) {
    let msg = err.to_string();
    match err {
        Error::Shape { tensor: t, .. } => assert_eq!(t, tensor, "wrong tensor named in: {msg}"),
        other => panic!("expected a shape error for `{tensor}`, got {other:?}"),
    }
    assert!(
        msg.contains(&format!("`{tensor}`")),
        "message does not name `{tensor}`: {msg}"
    );
}

/// Asserts an `Invalid` error for `field` whose message names it.
#[track_caller]
fn assert_invalid(err: Error, field: &str) {
    let msg = err.to_string();
    match err {
        Error::Invalid { field: f, .. } => assert_eq!(f, field, "wrong field named in: {msg}"),
        other => panic!("expected an invalid `{field}` error, got {other:?}"),
    }
    assert!(
        msg.contains(&format!("`{field}`")),
        "message does not name `{field}`: {msg}"
    );
}

/// Asserts a `NonFinite` error for `tensor` at `index`, naming both.
#[track_caller]
fn assert_non_finite(err: Error, tensor: &str, index: usize) {
    let msg = err.to_string();
    match err {
        Error::NonFinite {
            tensor: t,
            index: i,
            ..
        } => {
            assert_eq!(t, tensor, "wrong tensor named in: {msg}");
            assert_eq!(i, index, "wrong index in: {msg}");
        }
        other => panic!("expected a non-finite error for `{tensor}`, got {other:?}"),
    }
    assert!(
        msg.contains(&format!("`{tensor}`")),
        "message does not name `{tensor}`: {msg}"
    );
    assert!(
        msg.contains(&format!("index {index}")),
        "message lacks the index: {msg}"
    );
}

/// Asserts an `OutOfRange` error whose `what` contains `what`, for `index` in a table
/// of `size`, and a message with all three.
#[track_caller]
fn assert_out_of_range(err: Error, what: &str, index: usize, size: usize) {
    let msg = err.to_string();
    match err {
        Error::OutOfRange {
            what: w,
            index: i,
            size: n,
        } => {
            assert!(w.contains(what), "expected `{what}` in: {msg}");
            assert_eq!((i, n), (index, size), "wrong index or size in: {msg}");
        }
        other => panic!("expected an out-of-range `{what}`, got {other:?}"),
    }
    assert!(msg.contains(what), "message does not name `{what}`: {msg}");
    assert!(
        msg.contains(&index.to_string()) && msg.contains(&size.to_string()),
        "{msg}"
    );
}

// Valid sizes every attention error test starts from, then breaks one thing.
const B: usize = 2;
const T: usize = 3;
const S: usize = 5;
const H: usize = 4;
const G: usize = 2;
const D: usize = 8;
const DV: usize = 6;

fn valid_qkv() -> (Tensor, Tensor, Tensor) {
    let mut rng = Rng::new(7);
    (
        rng.tensor(&[B, T, H, D], 1.0),
        rng.tensor(&[B, S, G, D], 1.0),
        rng.tensor(&[B, S, G, DV], 1.0),
    )
}

/// Runs attention on both kernels and returns the error, which must be the same.
#[track_caller]
fn attention_error(q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttentionSpec) -> Error {
    let [reference, tiled] = KERNELS.map(|kernel| {
        let spec = AttentionSpec { kernel, ..*spec };
        attention(q, k, v, &spec).expect_err("bad input was accepted")
    });
    assert_eq!(reference.to_string(), tiled.to_string(), "kernels disagree");
    reference
}

#[test]
fn valid_inputs_are_accepted() {
    // The baseline the other tests break: it must pass, or they test nothing.
    let (q, k, v) = valid_qkv();
    for kernel in KERNELS {
        let spec = AttentionSpec {
            kernel,
            ..Default::default()
        };
        let a = attention(&q, &k, &v, &spec).unwrap();
        assert_eq!(a.out.shape(), &[B, T, H, DV]);
    }
}

// --- q, k, v shapes ------------------------------------------------------------------

#[test]
fn q_of_wrong_rank_is_rejected() {
    let (_, k, v) = valid_qkv();
    let q = Tensor::zeros(&[B, T, H * D]);
    assert_shape_error(attention_error(&q, &k, &v, &AttentionSpec::default()), "q");
}

#[test]
fn batch_mismatch_between_q_and_k_is_rejected() {
    let (q, _, v) = valid_qkv();
    let k = Tensor::zeros(&[B + 1, S, G, D]);
    let err = attention_error(&q, &k, &v, &AttentionSpec::default());
    assert!(
        err.to_string().contains(&format!("{:?}", [B + 1, S, G, D])),
        "{err}"
    );
    assert_shape_error(err, "k");
}

#[test]
fn batch_mismatch_between_k_and_v_is_rejected() {
    let (q, k, _) = valid_qkv();
    let v = Tensor::zeros(&[B + 1, S, G, DV]);
    assert_shape_error(attention_error(&q, &k, &v, &AttentionSpec::default()), "v");
}

#[test]
fn head_width_mismatch_between_q_and_k_is_rejected() {
    let (q, _, v) = valid_qkv();
    let k = Tensor::zeros(&[B, S, G, D + 1]);
    assert_shape_error(attention_error(&q, &k, &v, &AttentionSpec::default()), "k");
}

#[test]
fn key_length_mismatch_between_k_and_v_is_rejected() {
    let (q, k, _) = valid_qkv();
    let v = Tensor::zeros(&[B, S + 1, G, DV]);
    assert_shape_error(attention_error(&q, &k, &v, &AttentionSpec::default()), "v");
}

#[test]
fn kv_head_count_mismatch_between_k_and_v_is_rejected() {
    let (q, k, _) = valid_qkv();
    let v = Tensor::zeros(&[B, S, G + 1, DV]);
    assert_shape_error(attention_error(&q, &k, &v, &AttentionSpec::default()), "v");
}

#[test]
fn kv_heads_not_dividing_query_heads_are_rejected() {
    let (q, _, _) = valid_qkv();
    // 3 key/value heads cannot serve 4 query heads.
    let k = Tensor::zeros(&[B, S, 3, D]);
    let v = Tensor::zeros(&[B, S, 3, DV]);
    let err = attention_error(&q, &k, &v, &AttentionSpec::default());
    let msg = err.to_string();
    assert!(
        msg.contains('3') && msg.contains('4'),
        "message lacks the head counts: {msg}"
    );
    assert_invalid(err, "k/v heads");
}

#[test]
fn empty_axes_are_rejected() {
    // Each of B, T, H, D, S, G, Dv set to zero in turn, shapes otherwise consistent.
    // (axis, q shape, k shape, v shape)
    let cases = [
        ("B", [0, T, H, D], [0, S, G, D], [0, S, G, DV]),
        ("T", [B, 0, H, D], [B, S, G, D], [B, S, G, DV]),
        ("H", [B, T, 0, D], [B, S, G, D], [B, S, G, DV]),
        ("D", [B, T, H, 0], [B, S, G, 0], [B, S, G, DV]),
        ("S", [B, T, H, D], [B, 0, G, D], [B, 0, G, DV]),
        ("G", [B, T, H, D], [B, S, 0, D], [B, S, 0, DV]),
        ("Dv", [B, T, H, D], [B, S, G, D], [B, S, G, 0]),
    ];
    for (axis, qs, ks, vs) in cases {
        let err = attention_error(
            &Tensor::zeros(&qs),
            &Tensor::zeros(&ks),
            &Tensor::zeros(&vs),
            &AttentionSpec::default(),
        );
        assert!(err.to_string().contains("empty axis"), "{axis}: {err}");
        assert_invalid(err, "attention inputs");
    }
}

#[test]
fn kv_view_outside_its_buffer_is_rejected() {
    // A cache view claiming more positions, or a batch stride shorter than a row,
    // than its buffer holds, or strides of no dense layout.
    let (q, k, v) = valid_qkv();
    let qv = HeadsView::of(&q, "q").unwrap();
    let vv = HeadsView::of(&v, "v").unwrap();
    let kv = HeadsView::of(&k, "k").unwrap();
    for bad in [
        HeadsView {
            len: S + 1,
            batch_stride: (S + 1) * G * D,
            ..kv
        },
        HeadsView {
            batch_stride: S * G * D - 1,
            ..kv
        },
        // strides neither positions- nor heads-major: rows overlap or leave gaps
        HeadsView {
            pos_stride: D,
            ..kv
        },
    ] {
        let err = attention_views(&qv, &bad, &vv, &AttentionSpec::default()).unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
        assert_invalid(err, "k");
    }
}

// --- non-finite values ---------------------------------------------------------------

/// `x` with `value` written at flat index `index`.
fn poisoned(x: &Tensor, index: usize, value: f32) -> Tensor {
    let mut y = x.clone();
    y.data_mut()[index] = value;
    y
}

/// A KV cache checks what it is given, so attention over it need not rescan it: a
/// poisoned step is refused and leaves the cache as it was.
#[test]
fn nan_and_infinity_appended_to_a_kv_cache_are_rejected() {
    let (_, k, v) = valid_qkv();
    let [b, _, g, d] = k.shape().try_into().unwrap();
    for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut cache = LayerKv::new(b, g, d, v.shape()[3]);
        cache.append(&k, &v).unwrap();
        let err = cache.append(&poisoned(&k, 3, value), &v).unwrap_err();
        assert_non_finite(err, "cached k", 3);
        let err = cache.append(&k, &poisoned(&v, 4, value)).unwrap_err();
        assert_non_finite(err, "cached v", 4);
        assert_eq!(
            cache.len(),
            k.shape()[1],
            "a refused step must not be cached"
        );
    }
}

#[test]
fn nan_and_infinity_in_q_k_v_are_rejected() {
    let (q, k, v) = valid_qkv();
    for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let spec = AttentionSpec::default();
        let err = attention_error(&poisoned(&q, 5, value), &k, &v, &spec);
        assert_non_finite(err, "q", 5);
        let err = attention_error(&q, &poisoned(&k, 17, value), &v, &spec);
        assert_non_finite(err, "k", 17);
        let err = attention_error(&q, &k, &poisoned(&v, v.numel() - 1, value), &spec);
        assert_non_finite(err, "v", v.numel() - 1);
    }
}

#[test]
fn nan_and_positive_infinity_in_bias_are_rejected() {
    let (q, k, v) = valid_qkv();
    for value in [f32::NAN, f32::INFINITY] {
        let bias = poisoned(&Tensor::zeros(&[1, H, T, S]), 9, value);
        let spec = AttentionSpec {
            bias: Some(Bias::Dense(bias.as_broadcast().unwrap())),
            ..Default::default()
        };
        assert_non_finite(attention_error(&q, &k, &v, &spec), "bias", 9);
    }
}

#[test]
fn negative_infinity_in_bias_is_accepted_as_a_mask() {
    // −∞ in a float mask is how users (and Hugging Face) say "masked": it must be
    // accepted and give that key zero weight.
    let (q, k, v) = valid_qkv();
    let bias = Tensor::from_fn(&[1, 1, T, S], |idx| {
        if idx % S == 2 {
            f32::NEG_INFINITY
        } else {
            0.0
        }
    });
    for kernel in KERNELS {
        let spec = AttentionSpec {
            bias: Some(Bias::Dense(bias.as_broadcast().unwrap())),
            want_weights: true,
            kernel,
            ..Default::default()
        };
        let a = attention(&q, &k, &v, &spec).unwrap();
        let w = a.weights.unwrap();
        assert!(
            w.data().iter().skip(2).step_by(S).all(|&p| p == 0.0),
            "{kernel:?}: key 2 got weight"
        );
        assert!(a.out.data().iter().all(|x| x.is_finite()));
    }
}

#[test]
fn nan_in_alibi_slopes_is_rejected() {
    let (q, k, v) = valid_qkv();
    let slopes = [0.5, f32::NAN, 0.125, 0.0625];
    let spec = AttentionSpec {
        bias: Some(Bias::Alibi { slopes: &slopes }),
        ..Default::default()
    };
    assert_non_finite(attention_error(&q, &k, &v, &spec), "alibi slopes", 1);
}

// --- masks and biases of the wrong size ----------------------------------------------

#[test]
fn bool_mask_of_wrong_size_is_rejected() {
    let (q, k, v) = valid_qkv();
    let data = vec![true; 4 * 5 * (T + 1) * (S + 1)];
    // Wrong T, wrong S, a batch axis that is neither 1 nor B, a head axis that is
    // neither 1 nor H, and a shape that promises more elements than the data holds.
    for (shape, n) in [
        ([1, 1, T + 1, S], T * S + S),
        ([1, 1, T, S + 1], T * (S + 1)),
        ([B + 1, 1, T, S], (B + 1) * T * S),
        ([1, G, T, S], G * T * S),
        ([B, H, T, S], B * H * T * S - 1),
    ] {
        let spec = AttentionSpec {
            mask: Some(Broadcast::new(&data[..n], shape)),
            ..Default::default()
        };
        let err = attention_error(&q, &k, &v, &spec);
        assert!(err.to_string().contains(&format!("{shape:?}")), "{err}");
        assert_shape_error(err, "mask");
    }
}

#[test]
fn dense_bias_of_wrong_size_is_rejected() {
    let (q, k, v) = valid_qkv();
    for shape in [
        [1, 1, T, S + 1],
        [1, 1, T + 1, S],
        [B + 1, 1, T, S],
        [1, H + 1, T, S],
    ] {
        let bias = Tensor::zeros(&shape);
        let spec = AttentionSpec {
            bias: Some(Bias::Dense(bias.as_broadcast().unwrap())),
            ..Default::default()
        };
        assert_shape_error(attention_error(&q, &k, &v, &spec), "bias");
    }
}

#[test]
fn bias_tensor_of_wrong_rank_is_rejected() {
    assert_shape_error(Tensor::zeros(&[T, S]).as_broadcast().unwrap_err(), "bias");
}

#[test]
fn key_padding_of_wrong_length_is_rejected() {
    let (q, k, v) = valid_qkv();
    for n in [S, B * S - 1, B * S + 1] {
        let pad = vec![true; n];
        let spec = AttentionSpec {
            key_padding: Some(&pad),
            ..Default::default()
        };
        let err = attention_error(&q, &k, &v, &spec);
        assert!(err.to_string().contains(&n.to_string()), "{err}");
        assert_shape_error(err, "key_padding");
    }
}

#[test]
fn alibi_slopes_of_wrong_length_are_rejected() {
    let (q, k, v) = valid_qkv();
    // One slope per key/value head is a plausible mistake with GQA: still wrong.
    for n in [0, G, H + 1] {
        let slopes = vec![0.5; n];
        let spec = AttentionSpec {
            bias: Some(Bias::Alibi { slopes: &slopes }),
            ..Default::default()
        };
        assert_shape_error(attention_error(&q, &k, &v, &spec), "alibi slopes");
    }
}

// --- spec options --------------------------------------------------------------------

#[test]
fn window_of_zero_is_rejected() {
    let (q, k, v) = valid_qkv();
    let spec = AttentionSpec {
        window: Some(0),
        ..Default::default()
    };
    assert_invalid(attention_error(&q, &k, &v, &spec), "window");
}

#[test]
fn non_finite_scale_is_rejected() {
    let (q, k, v) = valid_qkv();
    for scale in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let spec = AttentionSpec {
            scale: Some(scale),
            ..Default::default()
        };
        assert_invalid(attention_error(&q, &k, &v, &spec), "scale");
    }
}

// --- layers --------------------------------------------------------------------------

#[test]
fn linear_rejects_wrong_input_width() {
    let lin = Linear::new(Tensor::zeros(&[4, 3]), Some(Tensor::zeros(&[4]))).unwrap();
    for shape in [vec![2, 4], vec![5, 2], vec![2, 7, 2]] {
        let err = lin.forward(&Tensor::zeros(&shape)).unwrap_err();
        assert!(err.to_string().contains("3"), "{err}");
        assert_shape_error(err, "linear input");
    }
}

#[test]
fn linear_rejects_bias_of_wrong_length() {
    let err = Linear::new(Tensor::zeros(&[4, 3]), Some(Tensor::zeros(&[3]))).unwrap_err();
    assert_shape_error(err, "linear.bias");
}

#[test]
fn layer_norm_rejects_wrong_input_width() {
    let ln = Norm::layer_norm(Tensor::zeros(&[6]), Some(Tensor::zeros(&[6])), 1e-5).unwrap();
    let err = ln.forward(&Tensor::zeros(&[3, 5])).unwrap_err();
    assert_shape_error(err, "layer_norm input");
}

#[test]
fn rms_norm_rejects_wrong_input_width() {
    let rms = Norm::rms_norm(Tensor::zeros(&[6]), 1e-6).unwrap();
    let err = rms.forward(&Tensor::zeros(&[2, 3, 7])).unwrap_err();
    assert_shape_error(err, "rms_norm input");
}

#[test]
fn embedding_rejects_table_of_wrong_rank() {
    assert_shape_error(
        Embedding::new(Tensor::zeros(&[10])).unwrap_err(),
        "embedding.weight",
    );
}

#[test]
fn embedding_rejects_id_out_of_range() {
    let emb = Embedding::new(Tensor::zeros(&[10, 4])).unwrap();
    // The first bad id is reported, even after good ones.
    let err = emb.forward(&[0, 9, 10, 11]).unwrap_err();
    assert_out_of_range(err, "embedding id", 10, 10);
}

#[test]
fn learned_positions_beyond_the_table_are_rejected() {
    let pos = LearnedPositions::new(Tensor::zeros(&[8, 4])).unwrap();
    assert!(pos.forward(&[0, 7]).is_ok());
    let err = pos.forward(&[6, 7, 8]).unwrap_err();
    assert_out_of_range(err, "position", 8, 8);
    // The message says what it means for the user: the sequence is too long.
    let mut x = Tensor::zeros(&[9, 4]);
    let err = pos.add_to(&mut x, &(0..9).collect::<Vec<_>>()).unwrap_err();
    assert!(err.to_string().contains("sequence longer"), "{err}");
}

#[test]
fn learned_positions_reject_input_of_wrong_shape() {
    let pos = LearnedPositions::new(Tensor::zeros(&[8, 4])).unwrap();
    let mut x = Tensor::zeros(&[3, 5]);
    assert_shape_error(pos.add_to(&mut x, &[0, 1, 2]).unwrap_err(), "x");
}

// --- RoPE ----------------------------------------------------------------------------

#[test]
fn rope_rejects_odd_zero_or_too_wide_rotary_dim() {
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        assert_invalid(Rope::new(7, 10_000.0, layout).unwrap_err(), "rotary_dim");
        for r in [0, 3, 10] {
            let err = Rope::partial(8, r, 10_000.0, layout).unwrap_err();
            assert!(err.to_string().contains(&r.to_string()), "{err}");
            assert_invalid(err, "rotary_dim");
        }
    }
}

#[test]
fn rope_rejects_invalid_base() {
    for base in [1.0, 0.5, f32::NAN, f32::INFINITY] {
        assert_invalid(
            Rope::new(8, base, RopeLayout::HalfSplit).unwrap_err(),
            "rope_theta",
        );
    }
}

#[test]
fn rope_rejects_positions_of_wrong_length() {
    let rope = Rope::new(D, 10_000.0, RopeLayout::HalfSplit).unwrap();
    let mut x = Tensor::zeros(&[B, T, H, D]);
    for n in [T, B * T - 1, B * T + 1] {
        let positions: Vec<usize> = (0..n).collect();
        let err = rope.apply(&mut x, &positions).unwrap_err();
        assert!(err.to_string().contains(&n.to_string()), "{err}");
        assert_shape_error(err, "rope positions");
    }
}

#[test]
fn rope_rejects_input_of_wrong_head_width() {
    let rope = Rope::new(D, 10_000.0, RopeLayout::Interleaved).unwrap();
    let mut x = Tensor::zeros(&[B, T, H, D + 2]);
    let err = rope.apply(&mut x, &[0; B * T]).unwrap_err();
    assert_shape_error(err, "rope input");
}

// --- multi-head attention --------------------------------------------------------------

fn linear(n_in: usize, n_out: usize) -> Linear {
    Linear::new(Tensor::zeros(&[n_out, n_in]), None).unwrap()
}

/// C = 12, H = 4, G = 2, D = 3, Dv = 5, context width 10: the consistent baseline.
fn mha_parts() -> (Linear, Linear, Linear, Linear) {
    (
        linear(12, 12),
        linear(10, 6),
        linear(10, 10),
        linear(20, 12),
    )
}

#[test]
fn multi_head_attention_accepts_consistent_projections() {
    let (wq, wk, wv, wo) = mha_parts();
    let mha = MultiHeadAttention::new(wq, wk, wv, wo, 4, 2).unwrap();
    assert_eq!(mha.head_dim(), 3);
}

#[test]
fn multi_head_attention_rejects_inconsistent_projections() {
    let (wq, wk, wv, wo) = mha_parts();
    // W_Q width not a multiple of the heads.
    let err = MultiHeadAttention::new(linear(12, 13), wk.clone(), wv.clone(), wo.clone(), 4, 2);
    assert_shape_error(err.unwrap_err(), "wq.weight");
    // W_K gives G·D' with D' ≠ D.
    let err = MultiHeadAttention::new(wq.clone(), linear(10, 8), wv.clone(), wo.clone(), 4, 2);
    assert_shape_error(err.unwrap_err(), "wk.weight");
    // W_V reads a different context width than W_K.
    let err = MultiHeadAttention::new(wq.clone(), wk.clone(), linear(11, 10), wo.clone(), 4, 2);
    assert_shape_error(err.unwrap_err(), "wv.weight");
    // W_V width not a multiple of the key/value heads.
    let err = MultiHeadAttention::new(wq.clone(), wk.clone(), linear(10, 9), wo.clone(), 4, 2);
    assert_shape_error(err.unwrap_err(), "wv.weight");
    // W_O does not read H·Dv.
    let err = MultiHeadAttention::new(wq, wk, wv, linear(21, 12), 4, 2);
    assert_shape_error(err.unwrap_err(), "wo.weight");
}

#[test]
fn multi_head_attention_rejects_bad_head_counts() {
    for (h, g) in [(4, 3), (0, 1), (4, 0)] {
        let (wq, wk, wv, wo) = mha_parts();
        let err = MultiHeadAttention::new(wq, wk, wv, wo, h, g).unwrap_err();
        assert_invalid(err, "n_kv_heads");
    }
}

#[test]
fn multi_head_attention_rejects_inputs_of_wrong_width() {
    let (wq, wk, wv, wo) = mha_parts();
    let mha = MultiHeadAttention::new(wq, wk, wv, wo, 4, 2).unwrap();
    let spec = AttentionSpec::default();
    let x = Tensor::zeros(&[2, 3, 12]);
    let err = mha.forward(
        &Tensor::zeros(&[2, 3, 11]),
        Some(&Tensor::zeros(&[2, 5, 10])),
        &spec,
    );
    assert_shape_error(err.unwrap_err(), "x");
    // Context of the wrong width, or of another batch size.
    let err = mha.forward(&x, Some(&Tensor::zeros(&[2, 5, 12])), &spec);
    assert_shape_error(err.unwrap_err(), "context");
    let err = mha.forward(&x, Some(&Tensor::zeros(&[3, 5, 10])), &spec);
    assert_shape_error(err.unwrap_err(), "context");
}

#[test]
fn multi_head_attention_rope_rejects_positions_of_wrong_length() {
    let mha = MultiHeadAttention::new(linear(8, 8), linear(8, 4), linear(8, 4), linear(8, 8), 2, 1)
        .unwrap();
    let rope = Rope::new(4, 10_000.0, RopeLayout::HalfSplit).unwrap();
    let x = Tensor::zeros(&[2, 3, 8]);
    let err = mha.forward_rope(&x, &AttentionSpec::default(), &rope, &[0, 1, 2]);
    assert_shape_error(err.unwrap_err(), "rope positions");
}

// --- tensors -------------------------------------------------------------------------

#[test]
fn tensor_new_rejects_wrong_element_count() {
    let err = Tensor::new(&[2, 3], vec![0.0; 5]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains('6') && msg.contains('5'),
        "message lacks the counts: {msg}"
    );
    assert_invalid(err, "tensor data");
}

#[test]
fn tensor_reshape_rejects_wrong_element_count() {
    let err = Tensor::zeros(&[2, 3]).reshape(&[4, 2]).unwrap_err();
    assert_invalid(err, "tensor data");
}

/// The low-level operations of the public API (item 7 of the hardening issue) give
/// errors on shapes that do not fit, as the layers above them do, since bindings
/// reach them with user data.
#[test]
fn low_level_ops_name_shapes_that_do_not_fit() {
    use qkv::layers::linear::{product_backward, product_into};
    use qkv::ops::{
        gemm, gemm_packed, softmax_backward, Activation, MatMut, MatRef, PackedWeight, Par,
    };

    let mut a = Tensor::zeros(&[2, 3]);
    assert_shape_error(
        a.add_assign(&Tensor::zeros(&[3, 2])).unwrap_err(),
        "add_assign operand",
    );

    let (x, w) = (vec![1.0f32; 6], vec![1.0f32; 12]);
    let mut out = vec![0.0f32; 8];
    // a [2,3] · b [4,3]: inner sizes differ
    let err = gemm(
        MatMut::row_major(&mut out, 2, 4),
        MatRef::row_major(&x, 2, 3),
        MatRef::row_major(&w, 4, 3),
        1.0,
        false,
        Par::Auto,
    )
    .unwrap_err();
    assert_shape_error(err, "gemm operands");
    // a view whose strides reach past its slice, and one whose span overflows usize
    for row_stride in [7, usize::MAX / 2] {
        let err = gemm(
            MatMut::row_major(&mut out, 2, 4),
            MatRef {
                data: &x,
                rows: 2,
                cols: 3,
                row_stride,
                col_stride: 1,
            },
            MatRef::row_major(&w, 3, 4),
            1.0,
            false,
            Par::Auto,
        )
        .unwrap_err();
        assert_invalid(err, "gemm view a");
    }
    let packed = PackedWeight::new(&w, 4, 3).unwrap();
    let err = gemm_packed(
        MatMut::row_major(&mut out, 2, 4),
        MatRef::row_major(&w, 4, 3),
        &packed,
        1.0,
        false,
        Par::Auto,
    )
    .unwrap_err();
    assert_shape_error(err, "gemm_packed operands");
    assert_shape_error(PackedWeight::new(&w, 5, 3).unwrap_err(), "packed weight");
    assert_shape_error(PackedWeight::new(&[], 0, 3).unwrap_err(), "packed weight");

    let err = softmax_backward(&[0.5; 4], &[0.0; 4], 3, &mut [0.0; 4]).unwrap_err();
    assert_shape_error(err, "softmax backward y");
    let err = Activation::Relu
        .backward_slice(&[1.0; 4], &[1.0; 3], &mut [0.0; 4])
        .unwrap_err();
    assert_shape_error(err, "activation backward dy, dx");

    let (xt, wt) = (Tensor::zeros(&[2, 3]), Tensor::zeros(&[4, 5]));
    let mut y = Tensor::zeros(&[2, 4]);
    assert_shape_error(
        product_into(&mut y, &xt, &wt, 1.0, false).unwrap_err(),
        "product input",
    );
    let mut dw = Tensor::zeros(&[4, 5]);
    let err =
        product_backward(&xt, &Tensor::zeros(&[4]), 1.0, &y, &mut dw, (&mut a, false)).unwrap_err();
    assert_shape_error(err, "product weight");
    // the output too small for x·Wᵀ: caught as a view outside its slice
    let wt = Tensor::zeros(&[4, 3]);
    let mut small = Tensor::zeros(&[2, 3]);
    let err = product_into(&mut small, &xt, &wt, 1.0, false).unwrap_err();
    assert_invalid(err, "gemm view dst");
}
