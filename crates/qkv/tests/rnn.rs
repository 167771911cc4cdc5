//! The Elman RNN (`qkv::rnn::Elman`) against `torch.nn.RNN` (tools/fixtures/gen_rnn.py):
//! outputs, final states and every gradient of BPTT, with padded rows through
//! pack_padded_sequence; then the backward again by central finite differences, and
//! the errors bad input gets.

mod common;

use common::{assert_close, fixture, Fixture};
use qkv::module::Module;
use qkv::rng::Rng;
use qkv::rnn::{Elman, ElmanLayer};
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

/// A random stack of `layers` layers, In = 3, Hd = 4.
fn random_stack(rng: &mut Rng, layers: usize) -> Elman {
    Elman::new(
        (0..layers)
            .map(|k| ElmanLayer {
                weight_ih: rng.tensor(&[4, if k == 0 { 3 } else { 4 }], 0.5),
                weight_hh: rng.tensor(&[4, 4], 0.5),
                bias_ih: rng.tensor(&[4], 0.5),
                bias_hh: rng.tensor(&[4], 0.5),
            })
            .collect(),
    )
    .unwrap()
}

#[test]
fn backward_equals_finite_differences() {
    // Values are O(1) and the loss Σ out∘r + Σ h_n∘s sums ~60 terms: with h = 1e-2
    // the f32 rounding of the outputs costs ~6e-8·60/2e-2 ≈ 2e-4 at worst, and the
    // truncation h²·|∂³L|/6 ~ 2e-5.
    const H: f32 = 1e-2;
    let mut rng = Rng::new(5);
    let rnn = random_stack(&mut rng, 2);
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
    let rnn = random_stack(&mut rng, 1);
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
    let rnn = random_stack(&mut rng, 2);
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
