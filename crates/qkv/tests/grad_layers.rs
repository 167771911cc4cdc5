//! Backward passes of the ops and layers (activations, softmax, linear, embedding,
//! LayerNorm, RMSNorm, the feed-forward blocks) and the cross-entropy loss, checked
//! two independent ways:
//!
//! - central finite differences (`qkv::train::gradcheck`) on tiny odd shapes, with the
//!   probe loss L = Σ y ∘ r for a fixed random r, every input and parameter gradient;
//! - PyTorch autograd fixtures (tools/fixtures/gen_grad_layers.py): forward outputs
//!   and every gradient, atol 1e-5 unless a case says why it needs more.
//!
//! Residual connections have no backward of their own (the gradient of x + f(x) is
//! dy + f′ᵀdy: the caller adds the branch's dx to dy), so nothing here tests them.
//!
//! Run with `--nocapture` to see the worst difference of every check.

mod common;

use common::{assert_close, fixture, Fixture};
use qkv::layers::{Embedding, FeedForward, FeedForwardCache, Linear, Norm, NormCache};
use qkv::module::Module;
use qkv::ops::{softmax, softmax_backward, Activation};
use qkv::rng::Rng;
use qkv::train::gradcheck::{compare, numeric_grad, probe_loss};
use qkv::train::loss::{cross_entropy, cross_entropy_in_place, IGNORE_INDEX};
use qkv::Tensor;

// ---------------------------------------------------------------------------------
// Finite differences
// ---------------------------------------------------------------------------------

/// Step for the central differences. The inputs, parameters and outputs of these
/// checks are O(1), so (see gradcheck.rs) the f32 rounding of the outputs costs
/// ε_f32·Σ|yᵢrᵢ|/(2h) ≈ 6e-8·10/2e-2 ≈ 3e-5, and truncation h²·|∂³L|/6 ≈ 2e-5·|∂³L|,
/// where a weight's third derivative through an activation carries x³ (|x| up to ~3
/// in these draws): up to ~1e-4. Measured worst: 1.1e-4 (gated GELU, up.weight).
const H: f32 = 1e-2;
/// Tolerance of the finite-difference checks: a few times the error budget above and
/// far below what a wrong gradient gives (a missing term or a wrong sign is O(0.1)).
const FD_ATOL: f64 = 5e-4;
const FD_RTOL: f64 = 1e-3;

/// Numeric gradient of the probe loss Σ forward(t) ∘ r with respect to `t`:
/// `forward` rebuilds whatever `t` belongs to from the perturbed values.
fn numeric(t: &Tensor, r: &Tensor, mut forward: impl FnMut(Tensor) -> Tensor) -> Vec<f64> {
    let mut data = t.data().to_vec();
    numeric_grad(&mut data, H, |d| {
        let y = forward(Tensor::new(t.shape(), d.to_vec()).unwrap());
        probe_loss(y.data(), r.data())
    })
}

/// Compares an analytic gradient with a numeric one and prints the worst difference.
#[track_caller]
fn check_fd(what: &str, analytic: &Tensor, numeric: &[f64]) {
    let worst = analytic
        .data()
        .iter()
        .zip(numeric)
        .map(|(&a, &n)| (a as f64 - n).abs())
        .fold(0.0, f64::max);
    eprintln!("fd  {what:<40} max |analytic − numeric| {worst:.2e}");
    compare(what, analytic.data(), numeric, FD_ATOL, FD_RTOL).unwrap_or_else(|e| panic!("{e}"));
}

fn randn(rng: &mut Rng, shape: &[usize]) -> Tensor {
    rng.tensor(shape, 1.0)
}

#[test]
fn fd_activations() {
    let mut rng = Rng::new(11);
    // Keep |x| > 2h so ReLU's kink is never straddled by a difference.
    let x = Tensor::from_fn(&[9], |_| {
        let v = rng.normal() as f32 * 2.0;
        if v.abs() < 0.05 {
            v + 0.1
        } else {
            v
        }
    });
    let r = randn(&mut rng, &[9]);
    for act in [
        Activation::Relu,
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Silu,
    ] {
        let mut dx = Tensor::zeros(&[9]);
        act.backward_slice(x.data(), r.data(), dx.data_mut())
            .unwrap();
        let num = numeric(&x, &r, |mut x| {
            act.apply_slice(x.data_mut());
            x
        });
        check_fd(&format!("{act:?} dx"), &dx, &num);
    }
}

#[test]
fn fd_softmax() {
    let mut rng = Rng::new(12);
    let x = rng.tensor(&[3, 5], 2.0);
    let r = randn(&mut rng, &[3, 5]);
    let y = softmax(&x);
    let mut dx = Tensor::zeros(&[3, 5]);
    softmax_backward(y.data(), r.data(), 5, dx.data_mut()).unwrap();
    check_fd("softmax dx", &dx, &numeric(&x, &r, |x| softmax(&x)));
}

#[test]
fn fd_linear() {
    let mut rng = Rng::new(13);
    let x = randn(&mut rng, &[2, 3, 5]);
    let r = randn(&mut rng, &[2, 3, 7]);
    for with_bias in [true, false] {
        let layer = Linear::new(
            randn(&mut rng, &[7, 5]),
            with_bias.then(|| randn(&mut rng, &[7])),
        )
        .unwrap();
        let mut grads = layer.zeros_like();
        let dx = layer.backward(&x, &r, &mut grads).unwrap();
        let tag = if with_bias { "bias" } else { "no bias" };
        check_fd(
            &format!("linear ({tag}) dx"),
            &dx,
            &numeric(&x, &r, |x| layer.forward(&x).unwrap()),
        );
        let num_w = numeric(&layer.weight, &r, |w| {
            Linear::new(w, layer.bias.clone())
                .unwrap()
                .forward(&x)
                .unwrap()
        });
        check_fd(&format!("linear ({tag}) dweight"), &grads.weight, &num_w);
        if let Some(b) = &layer.bias {
            let num_b = numeric(b, &r, |b| {
                Linear::new(layer.weight.clone(), Some(b))
                    .unwrap()
                    .forward(&x)
                    .unwrap()
            });
            check_fd("linear dbias", grads.bias.as_ref().unwrap(), &num_b);
        }
    }
}

#[test]
fn fd_embedding() {
    let mut rng = Rng::new(14);
    let emb = Embedding::new(randn(&mut rng, &[5, 3])).unwrap();
    let ids = [4, 1, 4, 0, 2, 4, 1];
    let r = randn(&mut rng, &[7, 3]);
    let mut grads = emb.zeros_like();
    emb.backward(&ids, &r, &mut grads).unwrap();
    let num = numeric(&emb.weight, &r, |t| {
        Embedding::new(t).unwrap().forward(&ids).unwrap()
    });
    check_fd("embedding dtable", &grads.weight, &num);
    // row 3 is never read: its gradient is exactly zero
    assert!(grads.weight.data()[9..12].iter().all(|&g| g == 0.0));
}

/// Rows of unit scale, one with an offset of 3 so that centring matters.
fn norm_input(rng: &mut Rng, rows: usize, c: usize) -> Tensor {
    let mut x = randn(rng, &[rows, c]);
    for v in &mut x.data_mut()[c..2 * c] {
        *v += 3.0;
    }
    x
}

#[test]
fn fd_layer_norm() {
    let mut rng = Rng::new(15);
    let x = norm_input(&mut rng, 3, 7);
    let r = randn(&mut rng, &[3, 7]);
    for with_bias in [true, false] {
        let ln = Norm::layer_norm(
            rng.tensor(&[7], 0.3),
            with_bias.then(|| rng.tensor(&[7], 0.3)),
            1e-5,
        )
        .unwrap();
        let mut cache = NormCache::default();
        ln.forward_with_cache(&x, &mut cache).unwrap();
        let mut grads = ln.zeros_like();
        let dx = ln.backward(&r, &x, &cache, &mut grads).unwrap();
        let tag = if with_bias { "bias" } else { "no bias" };
        check_fd(
            &format!("layer_norm ({tag}) dx"),
            &dx,
            &numeric(&x, &r, |x| ln.forward(&x).unwrap()),
        );
        let num_w = numeric(&ln.weight, &r, |w| {
            Norm::layer_norm(w, ln.bias.clone(), ln.eps)
                .unwrap()
                .forward(&x)
                .unwrap()
        });
        check_fd(
            &format!("layer_norm ({tag}) dweight"),
            &grads.weight,
            &num_w,
        );
        if let Some(b) = &ln.bias {
            let num_b = numeric(b, &r, |b| {
                Norm::layer_norm(ln.weight.clone(), Some(b), ln.eps)
                    .unwrap()
                    .forward(&x)
                    .unwrap()
            });
            check_fd("layer_norm dbias", grads.bias.as_ref().unwrap(), &num_b);
        }
    }
}

#[test]
fn fd_rms_norm() {
    let mut rng = Rng::new(16);
    let x = norm_input(&mut rng, 3, 7);
    let r = randn(&mut rng, &[3, 7]);
    let rms = Norm::rms_norm(rng.tensor(&[7], 0.3), 1e-6).unwrap();
    let mut cache = NormCache::default();
    rms.forward_with_cache(&x, &mut cache).unwrap();
    let mut grads = rms.zeros_like();
    let dx = rms.backward(&r, &x, &cache, &mut grads).unwrap();
    check_fd(
        "rms_norm dx",
        &dx,
        &numeric(&x, &r, |x| rms.forward(&x).unwrap()),
    );
    let num_w = numeric(&rms.weight, &r, |w| {
        Norm::rms_norm(w, rms.eps).unwrap().forward(&x).unwrap()
    });
    check_fd("rms_norm dweight", &grads.weight, &num_w);
}

/// A feed-forward block C → F → C with N(0, 1/in) weights (unit-scale activations)
/// and biases when asked.
fn ffn(rng: &mut Rng, c: usize, f: usize, act: Activation, gated: bool, bias: bool) -> FeedForward {
    let mut lin = |n_in: usize, n_out: usize| {
        let w = rng.tensor(&[n_out, n_in], 1.0 / (n_in as f32).sqrt());
        Linear::new(w, bias.then(|| rng.tensor(&[n_out], 0.3))).unwrap()
    };
    let up = lin(c, f);
    let gate_up = gated.then(|| lin(c, f));
    let down = lin(f, c);
    FeedForward::new(up, gate_up, down, act).unwrap()
}

/// The linear layers of a feed-forward block by name, for perturbing one of them.
fn ffn_linear<'a>(m: &'a mut FeedForward, name: &str) -> &'a mut Linear {
    match name {
        "up" => &mut m.up,
        "gate_up" => m.gate_up.as_mut().unwrap(),
        "down" => &mut m.down,
        _ => unreachable!(),
    }
}

#[test]
fn fd_feed_forward() {
    let mut rng = Rng::new(17);
    let (c, f) = (5, 7);
    for (act, gated, bias, what) in [
        (Activation::Relu, false, true, "ReLU MLP"),
        (Activation::GeluTanh, false, true, "GELU (tanh) MLP"),
        (Activation::Gelu, false, false, "GELU MLP, no bias"),
        (Activation::Silu, true, false, "SwiGLU"),
        (Activation::Gelu, true, true, "gated GELU with biases"),
    ] {
        let m = ffn(&mut rng, c, f, act, gated, bias);
        // ReLU's kink: a difference that moves a pre-activation across 0 measures a
        // secant, not the derivative. Perturbing x or W by h moves a pre-activation by
        // at most ~3h = 0.03 here, so draw x until every |up(x)| exceeds 0.1.
        let x = loop {
            let x = randn(&mut rng, &[3, c]);
            let h = m.up.forward(&x).unwrap();
            if act != Activation::Relu || h.data().iter().all(|v| v.abs() > 0.1) {
                break x;
            }
        };
        let r = randn(&mut rng, &[3, c]);
        let mut cache = FeedForwardCache::default();
        let y = m.forward_with_cache(&x, &mut cache).unwrap();
        assert_eq!(y, m.forward(&x).unwrap(), "{what}: cached forward differs");
        let mut grads = m.zeros_like();
        let dx = m.backward(&r, &x, &cache, &mut grads).unwrap();
        check_fd(
            &format!("{what} dx"),
            &dx,
            &numeric(&x, &r, |x| m.forward(&x).unwrap()),
        );
        let names: &[&str] = if gated {
            &["up", "gate_up", "down"]
        } else {
            &["up", "down"]
        };
        for &name in names {
            let g = match name {
                "up" => &grads.up,
                "gate_up" => grads.gate_up.as_ref().unwrap(),
                _ => &grads.down,
            };
            let mut probe = m.clone();
            let w = ffn_linear(&mut probe, name).weight.clone();
            let num_w = numeric(&w, &r, |w| {
                ffn_linear(&mut probe, name).weight = w;
                probe.forward(&x).unwrap()
            });
            check_fd(&format!("{what} d{name}.weight"), &g.weight, &num_w);
            if let Some(b) = ffn_linear(&mut m.clone(), name).bias.clone() {
                let mut probe = m.clone();
                let num_b = numeric(&b, &r, |b| {
                    ffn_linear(&mut probe, name).bias = Some(b);
                    probe.forward(&x).unwrap()
                });
                check_fd(
                    &format!("{what} d{name}.bias"),
                    g.bias.as_ref().unwrap(),
                    &num_b,
                );
            }
        }
    }
}

#[test]
fn fd_cross_entropy() {
    let mut rng = Rng::new(18);
    // [B, T, V] logits as a language model produces them; one target ignored.
    let logits = rng.tensor(&[2, 3, 7], 2.0);
    let targets = [3, IGNORE_INDEX, 0, 6, 2, 6];
    let (_, d) = cross_entropy(&logits, &targets).unwrap();
    // The loss is the scalar itself: probe with r = [1].
    let one = Tensor::new(&[1], vec![1.0]).unwrap();
    let num = numeric(&logits, &one, |z| {
        let (loss, _) = cross_entropy(&z, &targets).unwrap();
        Tensor::new(&[1], vec![loss]).unwrap()
    });
    check_fd("cross_entropy dlogits", &d, &num);
    // the ignored row has exactly zero gradient
    assert!(d.data()[7..14].iter().all(|&g| g == 0.0));
}

// ---------------------------------------------------------------------------------
// Contract: backward accumulates, caches are what the forward saved, bad input errors
// ---------------------------------------------------------------------------------

fn doubled(once: &Tensor, twice: &Tensor) -> bool {
    once.data()
        .iter()
        .zip(twice.data())
        .all(|(a, b)| (2.0 * a - b).abs() <= 1e-6 * (1.0 + a.abs()))
}

#[test]
fn backward_accumulates_into_grads() {
    let mut rng = Rng::new(19);
    let x = randn(&mut rng, &[3, 5]);
    let dy5 = randn(&mut rng, &[3, 5]);

    let m = ffn(&mut rng, 5, 7, Activation::Silu, true, true);
    let mut cache = FeedForwardCache::default();
    m.forward_with_cache(&x, &mut cache).unwrap();
    let mut g = m.zeros_like();
    m.backward(&dy5, &x, &cache, &mut g).unwrap();
    let once = g.clone();
    m.backward(&dy5, &x, &cache, &mut g).unwrap();
    for (a, b) in [
        (&once.up.weight, &g.up.weight),
        (once.up.bias.as_ref().unwrap(), g.up.bias.as_ref().unwrap()),
        (
            &once.gate_up.as_ref().unwrap().weight,
            &g.gate_up.as_ref().unwrap().weight,
        ),
        (&once.down.weight, &g.down.weight),
        (
            once.down.bias.as_ref().unwrap(),
            g.down.bias.as_ref().unwrap(),
        ),
    ] {
        assert!(doubled(a, b), "ffn grads did not accumulate");
    }

    let ln = Norm::layer_norm(randn(&mut rng, &[5]), Some(randn(&mut rng, &[5])), 1e-5).unwrap();
    let mut cache = NormCache::default();
    ln.forward_with_cache(&x, &mut cache).unwrap();
    let mut g = ln.zeros_like();
    ln.backward(&dy5, &x, &cache, &mut g).unwrap();
    let once = g.clone();
    ln.backward(&dy5, &x, &cache, &mut g).unwrap();
    assert!(
        doubled(&once.weight, &g.weight)
            && doubled(once.bias.as_ref().unwrap(), g.bias.as_ref().unwrap())
    );

    let rms = Norm::rms_norm(randn(&mut rng, &[5]), 1e-6).unwrap();
    let mut cache = NormCache::default();
    rms.forward_with_cache(&x, &mut cache).unwrap();
    let mut g = rms.zeros_like();
    rms.backward(&dy5, &x, &cache, &mut g).unwrap();
    let once = g.clone();
    rms.backward(&dy5, &x, &cache, &mut g).unwrap();
    assert!(doubled(&once.weight, &g.weight));

    let emb = Embedding::new(randn(&mut rng, &[4, 5])).unwrap();
    let mut g = emb.zeros_like();
    emb.backward(&[1, 3, 1], &dy5, &mut g).unwrap();
    let once = g.clone();
    emb.backward(&[1, 3, 1], &dy5, &mut g).unwrap();
    assert!(doubled(&once.weight, &g.weight));

    // activations and softmax accumulate into dx as well
    let mut dx = vec![1.0f32; 5];
    Activation::Relu
        .backward_slice(&[1.0, -1.0, 2.0, -2.0, 3.0], &[1.0; 5], &mut dx)
        .unwrap();
    assert_eq!(dx, vec![2.0, 1.0, 2.0, 1.0, 2.0]);
}

#[test]
fn cached_forwards_equal_plain_forwards() {
    let mut rng = Rng::new(20);
    let x = norm_input(&mut rng, 4, 9);
    let ln = Norm::layer_norm(randn(&mut rng, &[9]), Some(randn(&mut rng, &[9])), 1e-5).unwrap();
    let mut c = NormCache::default();
    assert_eq!(
        ln.forward_with_cache(&x, &mut c).unwrap(),
        ln.forward(&x).unwrap()
    );
    assert_eq!((c.mean.len(), c.rstd.len()), (4, 4));
    let rms = Norm::rms_norm(randn(&mut rng, &[9]), 1e-6).unwrap();
    let mut c = NormCache::default();
    assert_eq!(
        rms.forward_with_cache(&x, &mut c).unwrap(),
        rms.forward(&x).unwrap()
    );
    // a reused cache is overwritten, not appended to
    rms.forward_with_cache(&x, &mut c).unwrap();
    assert_eq!(c.rstd.len(), 4);
}

#[test]
fn backward_rejects_mismatched_input() {
    let mut rng = Rng::new(21);
    let lin = Linear::new(randn(&mut rng, &[3, 4]), Some(randn(&mut rng, &[3]))).unwrap();
    let x = randn(&mut rng, &[2, 4]);
    let mut g = lin.zeros_like();
    assert!(lin.backward(&x, &Tensor::zeros(&[2, 4]), &mut g).is_err());
    assert!(lin
        .backward(&Tensor::zeros(&[2, 3]), &Tensor::zeros(&[2, 3]), &mut g)
        .is_err());
    g.bias = None;
    let err = lin
        .backward(&x, &Tensor::zeros(&[2, 3]), &mut g)
        .unwrap_err();
    assert!(err.to_string().contains("bias"), "{err}");

    let ln = Norm::layer_norm(randn(&mut rng, &[4]), None, 1e-5).unwrap();
    let mut cache = NormCache::default();
    ln.forward_with_cache(&Tensor::zeros(&[3, 4]), &mut cache)
        .unwrap();
    let err = ln
        .backward(&x, &x, &cache, &mut ln.zeros_like())
        .unwrap_err();
    assert!(err.to_string().contains("forward_with_cache"), "{err}");

    let emb = Embedding::new(randn(&mut rng, &[3, 4])).unwrap();
    let mut g = emb.zeros_like();
    assert!(emb.backward(&[0, 3], &x, &mut g).is_err());
    assert!(emb.backward(&[0], &x, &mut g).is_err());

    let m = ffn(&mut rng, 4, 6, Activation::Silu, true, false);
    let plain = ffn(&mut rng, 4, 6, Activation::Silu, false, false);
    let mut cache = FeedForwardCache::default();
    plain.forward_with_cache(&x, &mut cache).unwrap();
    let err = m.backward(&x, &x, &cache, &mut m.zeros_like()).unwrap_err();
    assert!(err.to_string().contains("cache"), "{err}");
}

// ---------------------------------------------------------------------------------
// PyTorch autograd fixtures
// ---------------------------------------------------------------------------------

const ATOL: f32 = 1e-5;

/// assert_close with the worst difference printed, so `--nocapture` shows the margin.
#[track_caller]
fn close(what: &str, actual: &Tensor, expected: &Tensor, atol: f32, rtol: f32) {
    assert_eq!(actual.shape(), expected.shape(), "{what}: shape");
    let worst = actual
        .data()
        .iter()
        .zip(expected.data())
        .filter(|(a, e)| a != e)
        .map(|(a, e)| (a - e).abs())
        .fold(0.0f32, f32::max);
    eprintln!("pt  {what:<40} max |qkv − torch| {worst:.2e}");
    assert_close(what, actual.data(), expected.data(), atol, rtol);
}

fn usize_ids(f: &Fixture, name: &str) -> Vec<usize> {
    f.ints(name).1.into_iter().map(|i| i as usize).collect()
}

#[test]
fn torch_linear() {
    let f = fixture("grad", "linear");
    let x = f.t("x");
    for (sfx, bias) in [("", Some(f.t("bias"))), ("_nobias", None)] {
        let lin = Linear::new(f.t("weight"), bias).unwrap();
        close(
            &format!("linear{sfx} y"),
            &lin.forward(&x).unwrap(),
            &f.t(&format!("y{sfx}")),
            ATOL,
            0.0,
        );
        let mut g = lin.zeros_like();
        let dx = lin.backward(&x, &f.t("dy"), &mut g).unwrap();
        close(
            &format!("linear{sfx} dx"),
            &dx,
            &f.t(&format!("dx{sfx}")),
            ATOL,
            0.0,
        );
        close(
            &format!("linear{sfx} dweight"),
            &g.weight,
            &f.t(&format!("dweight{sfx}")),
            ATOL,
            0.0,
        );
        if let Some(db) = &g.bias {
            close("linear dbias", db, &f.t("dbias"), ATOL, 0.0);
        }
    }
}

#[test]
fn torch_embedding_with_repeated_ids() {
    let f = fixture("grad", "embedding");
    let emb = Embedding::new(f.t("table")).unwrap();
    let ids = usize_ids(&f, "ids");
    let dy = f.t("dy");
    let y = emb.forward(&ids).unwrap().reshape(dy.shape()).unwrap();
    close("embedding y", &y, &f.t("y"), 0.0, 0.0);
    let mut g = emb.zeros_like();
    emb.backward(&ids, &dy, &mut g).unwrap();
    close("embedding dtable", &g.weight, &f.t("dtable"), ATOL, 0.0);
}

#[test]
fn torch_layer_norm() {
    let f = fixture("grad", "layer_norm");
    for (sfx, eps) in [("", "eps"), ("_eps12", "eps12"), ("_nobias", "eps_nobias")] {
        let n = |name: &str| format!("{name}{sfx}");
        let bias = f.has(&n("bias")).then(|| f.t(&n("bias")));
        let ln = Norm::layer_norm(f.t(&n("weight")), bias, f.param_f32(eps).unwrap()).unwrap();
        let x = f.t(&n("x"));
        let mut cache = NormCache::default();
        let y = ln.forward_with_cache(&x, &mut cache).unwrap();
        // The +100-offset row: torch's f32 row mean is off by up to ~1e-5 (its f32
        // sum of 24 values near 2400 rounds at ulp(2400)/2 = 1.2e-4, divided by 24),
        // ours by ulp(100)/2 ≈ 3.8e-6 (f64 sum rounded to f32); times 1/σ·w ≈ 1.5
        // that is ~1.6e-5 between the two (checked against an f64 LayerNorm: torch
        // is 1.1e-5 off, qkv 5.6e-6).
        close(&n("layer_norm y"), &y, &f.t(&n("y")), 3e-5, 0.0);
        let mut g = ln.zeros_like();
        let dx = ln.backward(&f.t(&n("dy")), &x, &cache, &mut g).unwrap();
        // dx = r·(…) with r = 1/σ = 316 (constant row, eps 1e-5) or 1e6 (eps 1e-12):
        // r multiplies the f32 rounding of the O(1) bracket, so dx agrees to a
        // relative 1e-5 there (measured 2.5e-7). On the +100 row torch's x̂ inherits
        // its ~1e-5 mean error (see y above): 3e-5 absolute. Against an f64 autograd
        // LayerNorm, qkv's dx on that row is 1e-6 off and torch's f32 one 1.1e-5.
        close(&n("layer_norm dx"), &dx, &f.t(&n("dx")), 3e-5, 1e-5);
        // dweight sums dy·x̂ over the rows, x̂ of the +100 row included: same 3e-5.
        close(
            &n("layer_norm dweight"),
            &g.weight,
            &f.t(&n("dweight")),
            3e-5,
            0.0,
        );
        if let Some(db) = &g.bias {
            close(&n("layer_norm dbias"), db, &f.t(&n("dbias")), ATOL, 0.0);
        }
    }
}

#[test]
fn torch_llama_rms_norm() {
    let f = fixture("grad", "rms_norm");
    let rms = Norm::rms_norm(f.t("weight"), f.param_f32("eps").unwrap()).unwrap();
    let x = f.t("x");
    let mut cache = NormCache::default();
    let y = rms.forward_with_cache(&x, &mut cache).unwrap();
    close("rms_norm y", &y, &f.t("y"), ATOL, 1e-6);
    let mut g = rms.zeros_like();
    let dx = rms.backward(&f.t("dy"), &x, &cache, &mut g).unwrap();
    // r = 1/rms reaches ~700 on the ~1e-3 row, amplifying rounding as in LayerNorm.
    close("rms_norm dx", &dx, &f.t("dx"), ATOL, 1e-5);
    close("rms_norm dweight", &g.weight, &f.t("dweight"), ATOL, 1e-6);
}

#[test]
fn torch_activations() {
    let f = fixture("grad", "activations");
    let (x, dy) = (f.t("x"), f.t("dy"));
    for (name, act) in [
        ("relu", Activation::Relu),
        ("gelu", Activation::Gelu),
        ("gelu_tanh", Activation::GeluTanh),
        ("gelu_new", Activation::from_hf_name("gelu_new").unwrap()),
        ("silu", Activation::Silu),
    ] {
        let mut y = x.clone();
        act.apply_slice(y.data_mut());
        // outputs reach ±1000: a relative term covers f32 rounding there
        close(
            &format!("{name} y"),
            &y,
            &f.t(&format!("y_{name}")),
            ATOL,
            1e-6,
        );
        let mut dx = Tensor::zeros(x.shape());
        act.backward_slice(x.data(), dy.data(), dx.data_mut())
            .unwrap();
        close(
            &format!("{name} dx"),
            &dx,
            &f.t(&format!("dx_{name}")),
            ATOL,
            0.0,
        );
    }
}

#[test]
fn torch_softmax() {
    let f = fixture("grad", "softmax");
    let y = softmax(&f.t("x"));
    close("softmax y", &y, &f.t("y"), ATOL, 0.0);
    let mut dx = Tensor::zeros(y.shape());
    softmax_backward(y.data(), f.t("dy").data(), y.last_dim(), dx.data_mut()).unwrap();
    close("softmax dx", &dx, &f.t("dx"), ATOL, 0.0);
}

#[test]
fn torch_cross_entropy_with_ignored_targets() {
    let f = fixture("grad", "cross_entropy");
    let targets = f.ints("targets").1;
    let (loss, d) = cross_entropy(&f.t("logits"), &targets).unwrap();
    let want = f.t("loss").data()[0];
    eprintln!(
        "pt  {:<40} |qkv − torch| {:.2e}",
        "cross_entropy loss",
        (loss - want).abs()
    );
    assert!((loss - want).abs() <= ATOL, "loss {loss} vs torch {want}");
    close("cross_entropy dlogits", &d, &f.t("dlogits"), ATOL, 0.0);
    // the in-place form gives the same bits
    let mut z = f.t("logits");
    assert_eq!(cross_entropy_in_place(&mut z, &targets).unwrap(), loss);
    assert_eq!(z, d);

    // Every target ignored: PyTorch's mean is 0/0 = NaN; qkv refuses the batch with an
    // error that says so rather than pass a NaN (or a perfect-looking 0) on.
    assert!(f.t("loss_all_ignored").data()[0].is_nan());
    let err = cross_entropy(&f.t("logits_all_ignored"), &f.ints("targets_all_ignored").1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no scored targets"), "{err}");
}

/// Runs a feed-forward fixture: forward output, dx, and every linear's gradients.
/// `linears` maps (FeedForward slot, fixture prefix).
fn check_mlp(case: &str, act: Activation, up: &str, gate_up: Option<&str>, down: &str) {
    let f = fixture("grad", case);
    let lin = |p: &str| {
        let b = format!("{p}_bias");
        Linear::new(f.t(&format!("{p}_weight")), f.has(&b).then(|| f.t(&b))).unwrap()
    };
    let m = FeedForward::new(lin(up), gate_up.map(lin), lin(down), act).unwrap();
    let x = f.t("x");
    let mut cache = FeedForwardCache::default();
    let y = m.forward_with_cache(&x, &mut cache).unwrap();
    close(&format!("{case} y"), &y, &f.t("y"), ATOL, 0.0);
    let mut g = m.zeros_like();
    let dx = m.backward(&f.t("dy"), &x, &cache, &mut g).unwrap();
    close(&format!("{case} dx"), &dx, &f.t("dx"), ATOL, 0.0);
    let mut pairs = vec![(up, &g.up), (down, &g.down)];
    if let (Some(name), Some(gg)) = (gate_up, &g.gate_up) {
        pairs.push((name, gg));
    }
    for (p, lg) in pairs {
        close(
            &format!("{case} d{p}_weight"),
            &lg.weight,
            &f.t(&format!("d{p}_weight")),
            ATOL,
            0.0,
        );
        if let Some(b) = &lg.bias {
            close(
                &format!("{case} d{p}_bias"),
                b,
                &f.t(&format!("d{p}_bias")),
                ATOL,
                0.0,
            );
        }
    }
}

#[test]
fn torch_gpt2_mlp() {
    // transformers GPT2MLP: c_fc → gelu_new → c_proj (Conv1D weights stored transposed
    // into Linear's [out, in] by the generator).
    check_mlp("gpt2_mlp", Activation::GeluTanh, "c_fc", None, "c_proj");
}

#[test]
fn torch_llama_swiglu_mlp() {
    // LlamaMLP: down_proj(silu(gate_proj x) ⊙ up_proj x); our `up` is the activated
    // branch (gate_proj), `gate_up` the multiplied one (up_proj), as in models/llama.rs.
    check_mlp(
        "llama_mlp",
        Activation::Silu,
        "gate_proj",
        Some("up_proj"),
        "down_proj",
    );
}

#[test]
fn torch_t5_gated_gelu_mlp() {
    check_mlp(
        "t5_gated_mlp",
        Activation::GeluTanh,
        "wi_0",
        Some("wi_1"),
        "wo",
    );
}

#[test]
fn torch_relu_mlp() {
    check_mlp("relu_mlp", Activation::Relu, "fc1", None, "fc2");
}
