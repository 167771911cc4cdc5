//! The Elman RNN (`qkv::rnn::Elman`) against `torch.nn.RNN` (tools/fixtures/gen_rnn.py):
//! outputs, final states and every gradient of BPTT, with padded rows through
//! pack_padded_sequence; then the backward again by central finite differences, and
//! the errors bad input gets. Then the RNN encoder-decoder, with and without additive
//! attention, against a PyTorch module written in gen_rnn.py, and by finite differences.

#![cfg(feature = "models")]

mod common;

use common::{assert_close, fixture, Fixture};
use qkv::layers::{Embedding, Linear};
use qkv::module::Module;
use qkv::rng::Rng;
use qkv::rnn::{Additive, Elman, ElmanLayer, RnnSeq2Seq, Seq2SeqInput};
use qkv::train::gradcheck::{compare, numeric_grad, probe_loss};
use qkv::Tensor;

/// Float32 sums over at most 20 steps of width ≤ 16, against the same in PyTorch: a
/// few ulps of O(1) values per step.
const ATOL: f32 = 1e-5;

fn stack_from(f: &Fixture, layers: usize) -> Elman {
    Elman::new(
        (0..layers)
            .map(|k| ElmanLayer {
                weight_ih: f.t(&format!("weight_ih_l{k}")),
                weight_hh: f.t(&format!("weight_hh_l{k}")),
                bias_ih: f.t(&format!("bias_ih_l{k}")),
                bias_hh: f.t(&format!("bias_hh_l{k}")),
            })
            .collect(),
    )
    .unwrap()
}

fn check_case(name: &str) {
    let f = fixture("rnn", name);
    let layers = f.param_usize("layers").unwrap();
    let rnn = stack_from(&f, layers);
    let lengths: Option<Vec<usize>> = f
        .has("lengths")
        .then(|| f.ints("lengths").1.iter().map(|&l| l as usize).collect());
    let h0 = f.has("h0").then(|| f.t("h0"));
    let (y, cache) = rnn
        .forward(&f.t("x"), lengths.as_deref(), h0.as_ref())
        .unwrap();
    assert_close(
        &format!("{name} out"),
        y.out.data(),
        f.t("out").data(),
        ATOL,
        0.0,
    );
    assert_close(
        &format!("{name} h_n"),
        y.h_n.data(),
        f.t("h_n").data(),
        ATOL,
        0.0,
    );

    let mut grads = rnn.zeros_like();
    let (dx, dh0) = rnn
        .backward(&cache, &f.t("d_out"), Some(&f.t("d_hn")), &mut grads)
        .unwrap();
    assert_close(
        &format!("{name} dx"),
        dx.data(),
        f.t("dx").data(),
        ATOL,
        0.0,
    );
    if f.has("dh0") {
        assert_close(
            &format!("{name} dh0"),
            dh0.data(),
            f.t("dh0").data(),
            ATOL,
            0.0,
        );
    }
    for (path, g) in grads.params() {
        assert_close(
            &format!("{name} d{path}"),
            g.data(),
            f.t(&format!("d{path}")).data(),
            ATOL,
            0.0,
        );
    }
}

#[test]
fn two_layers_with_padded_rows_initial_states_and_final_state_gradients() {
    check_case("elman_padded");
}

#[test]
fn one_layer_over_twenty_steps() {
    check_case("elman_plain");
}

#[test]
fn backward_equals_finite_differences() {
    // Values are O(1) and the loss Σ out∘r + Σ h_n∘s sums ~60 terms: with h = 1e-2
    // the f32 rounding of the outputs costs ~6e-8·60/2e-2 ≈ 2e-4 at worst, and the
    // truncation h²·|∂³L|/6 ~ 2e-5.
    const H: f32 = 1e-2;
    let mut rng = Rng::new(5);
    let rnn = random_elman(&mut rng, 3, 4, 2);
    let (x, h0) = (rng.tensor(&[2, 5, 3], 1.0), rng.tensor(&[2, 2, 4], 1.0));
    let lengths = [5, 3];
    let (r, s) = (rng.tensor(&[2, 5, 4], 1.0), rng.tensor(&[2, 2, 4], 1.0));
    let loss = |rnn: &Elman, x: &Tensor, h0: &Tensor| -> f64 {
        let (y, _) = rnn.forward(x, Some(&lengths), Some(h0)).unwrap();
        probe_loss(y.out.data(), r.data()) + probe_loss(y.h_n.data(), s.data())
    };
    let (_, cache) = rnn.forward(&x, Some(&lengths), Some(&h0)).unwrap();
    let mut grads = rnn.zeros_like();
    let (dx, dh0) = rnn.backward(&cache, &r, Some(&s), &mut grads).unwrap();

    let check = |what: &str, analytic: &Tensor, numeric: Vec<f64>| {
        compare(what, analytic.data(), &numeric, 5e-4, 1e-3).unwrap_or_else(|e| panic!("{e}"));
    };
    let mut xs = x.data().to_vec();
    let num = numeric_grad(&mut xs, H, |d| {
        loss(&rnn, &Tensor::new(x.shape(), d.to_vec()).unwrap(), &h0)
    });
    check("dx", &dx, num);
    let mut hs = h0.data().to_vec();
    let num = numeric_grad(&mut hs, H, |d| {
        loss(&rnn, &x, &Tensor::new(h0.shape(), d.to_vec()).unwrap())
    });
    check("dh0", &dh0, num);
    let params = rnn.params();
    let analytic = grads.params();
    for (i, (name, p)) in params.iter().enumerate() {
        let mut data = p.data().to_vec();
        let num = numeric_grad(&mut data, H, |d| {
            let mut moved = rnn.clone();
            moved.params_mut()[i].1.data_mut().copy_from_slice(d);
            loss(&moved, &x, &h0)
        });
        check(&format!("d{name}"), analytic[i].1, num);
    }
}

#[test]
fn a_row_past_its_length_outputs_zeros_and_keeps_its_last_state() {
    let mut rng = Rng::new(6);
    let rnn = random_elman(&mut rng, 3, 4, 1);
    let x = rng.tensor(&[1, 6, 3], 1.0);
    let (whole, _) = rnn.forward(&x, None, None).unwrap();
    let (cut, _) = rnn.forward(&x, Some(&[2]), None).unwrap();
    // the first two steps agree, the rest are zero, and h_n is the state after step 2
    assert_eq!(cut.out.data()[..8], whole.out.data()[..8]);
    assert!(cut.out.data()[8..].iter().all(|&v| v == 0.0));
    assert_eq!(cut.h_n.data(), &whole.out.data()[4..8]);
}

#[test]
fn bad_input_is_named() {
    let mut rng = Rng::new(7);
    let rnn = random_elman(&mut rng, 3, 4, 2);
    let err = |x: &Tensor, lengths: Option<&[usize]>| {
        rnn.forward(x, lengths, None).unwrap_err().to_string()
    };
    let x = rng.tensor(&[2, 4, 3], 1.0);
    assert!(err(&rng.tensor(&[2, 4, 5], 1.0), None).contains("rnn input"));
    assert!(err(&x, Some(&[4])).contains("1 lengths for a batch of 2"));
    assert!(err(&x, Some(&[4, 0])).contains("row 1 has length 0"));
    assert!(err(&x, Some(&[5, 1])).contains("row 0 has length 5"));
    let mut nan = x.clone();
    nan.data_mut()[3] = f32::NAN;
    assert!(err(&nan, None).contains("non-finite"));
    let bad_h0 = rng.tensor(&[1, 2, 4], 1.0);
    let e = rnn
        .forward(&x, None, Some(&bad_h0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rnn h0"), "{e}");
    // layers that do not chain
    let mut broken = rnn.clone();
    broken.layers[1].weight_ih = rng.tensor(&[4, 3], 1.0);
    let e = Elman::new(broken.layers).unwrap_err().to_string();
    assert!(e.contains("weight_ih_l1"), "{e}");
}

// ---------------------------------------------------------------------------------
// The RNN encoder-decoder, with and without additive attention
// ---------------------------------------------------------------------------------

fn seq2seq_from(f: &Fixture) -> RnnSeq2Seq {
    let layers = f.param_usize("layers").unwrap();
    let encoder = Elman::new(
        (0..layers)
            .map(|k| ElmanLayer {
                weight_ih: f.t(&format!("encoder.weight_ih_l{k}")),
                weight_hh: f.t(&format!("encoder.weight_hh_l{k}")),
                bias_ih: f.t(&format!("encoder.bias_ih_l{k}")),
                bias_hh: f.t(&format!("encoder.bias_hh_l{k}")),
            })
            .collect(),
    )
    .unwrap();
    let decoder = ElmanLayer {
        weight_ih: f.t("decoder.weight_ih"),
        weight_hh: f.t("decoder.weight_hh"),
        bias_ih: f.t("decoder.bias_ih"),
        bias_hh: f.t("decoder.bias_hh"),
    };
    let attention = f.has("attention.query").then(|| {
        Additive::new(
            f.t("attention.query"),
            f.t("attention.key"),
            f.t("attention.bias"),
            f.t("attention.score"),
        )
        .unwrap()
    });
    RnnSeq2Seq::new(
        Embedding::new(f.t("source_embed.weight")).unwrap(),
        Embedding::new(f.t("target_embed.weight")).unwrap(),
        encoder,
        decoder,
        attention,
        Linear::new(f.t("out.weight"), Some(f.t("out.bias"))).unwrap(),
    )
    .unwrap()
}

fn ids(f: &Fixture, name: &str) -> Vec<usize> {
    f.ints(name).1.iter().map(|&i| i as usize).collect()
}

fn check_seq2seq(name: &str) {
    let f = fixture("rnn", name);
    let model = seq2seq_from(&f);
    let (source, lengths, target) = (
        ids(&f, "source"),
        ids(&f, "source_lengths"),
        ids(&f, "target"),
    );
    let input = Seq2SeqInput {
        source: &source,
        source_lengths: &lengths,
        target: &target,
        batch: lengths.len(),
    };
    let (logits, cache) = model.forward(&input).unwrap();
    assert_close(
        &format!("{name} logits"),
        logits.data(),
        f.t("logits").data(),
        ATOL,
        0.0,
    );
    if f.has("weights") {
        // [B, T, S] in the fixture; qkv keeps each step's [B, S]
        let want = f.t("weights");
        let [b_n, t_n, s_n] = [want.shape()[0], want.shape()[1], want.shape()[2]];
        for i in 0..t_n {
            let got = cache.weights(i).unwrap();
            for b in 0..b_n {
                assert_close(
                    &format!("{name} weights step {i} row {b}"),
                    &got.data()[b * s_n..(b + 1) * s_n],
                    &want.data()[(b * t_n + i) * s_n..][..s_n],
                    ATOL,
                    0.0,
                );
            }
        }
    } else {
        assert!(cache.weights(0).is_none());
    }
    let mut grads = model.zeros_like();
    model
        .backward(&cache, &f.t("d_logits"), &mut grads)
        .unwrap();
    for (path, g) in grads.params() {
        assert_close(
            &format!("{name} d{path}"),
            g.data(),
            f.t(&format!("d{path}")).data(),
            ATOL,
            0.0,
        );
    }
}

#[test]
fn encoder_decoder_with_additive_attention_equals_pytorch() {
    check_seq2seq("seq2seq_attention");
}

#[test]
fn encoder_decoder_without_attention_equals_pytorch() {
    check_seq2seq("seq2seq_plain");
}

#[test]
fn encoder_decoder_backward_equals_finite_differences() {
    const H: f32 = 1e-2;
    let mut rng = Rng::new(8);
    let (v_src, v_tgt, e, hd, a) = (7, 5, 3, 4, 5);
    for attention in [true, false] {
        let model = RnnSeq2Seq::new(
            Embedding::new(rng.tensor(&[v_src, e], 1.0)).unwrap(),
            Embedding::new(rng.tensor(&[v_tgt, e], 1.0)).unwrap(),
            random_elman(&mut rng, e, hd, 2),
            ElmanLayer {
                weight_ih: rng.tensor(&[hd, e + hd], 0.5),
                weight_hh: rng.tensor(&[hd, hd], 0.5),
                bias_ih: rng.tensor(&[hd], 0.5),
                bias_hh: rng.tensor(&[hd], 0.5),
            },
            attention.then(|| {
                Additive::new(
                    rng.tensor(&[a, hd], 0.5),
                    rng.tensor(&[a, hd], 0.5),
                    rng.tensor(&[a], 0.5),
                    rng.tensor(&[a], 1.0),
                )
                .unwrap()
            }),
            Linear::new(
                rng.tensor(&[v_tgt, 2 * hd], 0.5),
                Some(rng.tensor(&[v_tgt], 0.5)),
            )
            .unwrap(),
        )
        .unwrap();
        let (source, lengths, target) = (
            vec![1, 4, 6, 2, 3, 5, 0, 0],
            vec![4, 2],
            vec![0, 3, 1, 4, 2, 2],
        );
        let input = Seq2SeqInput {
            source: &source,
            source_lengths: &lengths,
            target: &target,
            batch: 2,
        };
        let r = rng.tensor(&[2, 3, v_tgt], 1.0);
        let (_, cache) = model.forward(&input).unwrap();
        let mut grads = model.zeros_like();
        model.backward(&cache, &r, &mut grads).unwrap();
        let analytic = grads.params();
        for (i, (name, p)) in model.params().iter().enumerate() {
            let mut data = p.data().to_vec();
            let num = numeric_grad(&mut data, H, |d| {
                let mut moved = model.clone();
                moved.params_mut()[i].1.data_mut().copy_from_slice(d);
                probe_loss(moved.forward(&input).unwrap().0.data(), r.data())
            });
            compare(
                &format!("attention {attention}: d{name}"),
                analytic[i].1.data(),
                &num,
                5e-4,
                1e-3,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A random stack of `layers` Elman layers, input width `input`, state width `hd`.
fn random_elman(rng: &mut Rng, input: usize, hd: usize, layers: usize) -> Elman {
    Elman::new(
        (0..layers)
            .map(|k| ElmanLayer {
                weight_ih: rng.tensor(&[hd, if k == 0 { input } else { hd }], 0.5),
                weight_hh: rng.tensor(&[hd, hd], 0.5),
                bias_ih: rng.tensor(&[hd], 0.5),
                bias_hh: rng.tensor(&[hd], 0.5),
            })
            .collect(),
    )
    .unwrap()
}

#[test]
fn encoder_decoder_bad_input_is_named() {
    let f = fixture("rnn", "seq2seq_attention");
    let model = seq2seq_from(&f);
    let (source, target) = (ids(&f, "source"), ids(&f, "target"));
    let run = |source: &[usize], lengths: &[usize], target: &[usize], batch: usize| {
        let input = Seq2SeqInput {
            source,
            source_lengths: lengths,
            target,
            batch,
        };
        model.forward(&input).unwrap_err().to_string()
    };
    let e = run(&source, &[5, 3], &target, 3);
    assert!(e.contains("2 lengths for a batch of 3"), "{e}");
    let e = run(&source, &[5, 3, 0], &target, 3);
    assert!(e.contains("row 2 has length 0"), "{e}");
    let e = run(&source[..14], &[5, 3, 2], &target, 3);
    assert!(e.contains("do not make 3 non-empty rows"), "{e}");
    let mut bad = target.clone();
    bad[4] = 9;
    let e = run(&source, &[5, 3, 2], &bad, 3);
    assert!(e.contains("embedding id") && e.contains('9'), "{e}");
    // parts that do not fit: a decoder reading the wrong input width
    let mut parts = model.clone();
    parts.decoder.weight_ih = Tensor::zeros(&[6, 7]);
    let e = RnnSeq2Seq::new(
        parts.source_embed,
        parts.target_embed,
        parts.encoder,
        parts.decoder,
        parts.attention,
        parts.out,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("decoder weight_ih"), "{e}");
}

#[test]
fn additive_attention_refuses_a_row_with_every_key_masked() {
    let mut rng = Rng::new(9);
    let a = Additive::new(
        rng.tensor(&[3, 2], 1.0),
        rng.tensor(&[3, 2], 1.0),
        rng.tensor(&[3], 1.0),
        rng.tensor(&[3], 1.0),
    )
    .unwrap();
    let keys = rng.tensor(&[2, 4, 2], 1.0);
    let proj = a.project_keys(&keys).unwrap();
    let query = rng.tensor(&[2, 2], 1.0);
    let mask = [true, false, false, false, false, false, false, false];
    let e = a
        .step(&query, &proj, &keys, Some(&mask))
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 1 masks every key"), "{e}");
    // a real row's weights sum to one and are zero at its padded keys
    let mask = [true, true, false, false, true, true, true, true];
    let step = a.step(&query, &proj, &keys, Some(&mask)).unwrap();
    let w = step.weights.data();
    assert_eq!((w[2], w[3]), (0.0, 0.0));
    assert!((w[..4].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert!((w[4..].iter().sum::<f32>() - 1.0).abs() < 1e-6);
}
