//! Gradients of attention (both kernels), RoPE and T5's relative bias:
//! - the tiled (FlashAttention-2) backward equals the reference backward on every mask
//!   kind, GQA/MQA, Dv ≠ D, T ≠ S and sizes beyond one tile;
//! - both equal central finite differences of the forward on tiny shapes;
//! - both equal torch.autograd (tools/fixtures/gen_grad_attention.py).

#![cfg(feature = "models")]

mod common;

use common::{assert_tensor_close, fixture, Fixture};
use qkv::attention::{attention_backward, AttentionGrads};
use qkv::position::{RelativeBias, Rope, RopeLayout};
use qkv::rng::Rng;
use qkv::train::gradcheck::{compare, numeric_grad, probe_loss};
use qkv::{
    attention, AttentionOutput, AttentionSpec, Bias, Broadcast, CausalAlign, Kernel, Tensor,
};

const KERNELS: [Kernel; 2] = [Kernel::Reference, Kernel::Tiled];

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug)]
struct Sz {
    b: usize,
    t: usize,
    s: usize,
    h: usize,
    g: usize,
    d: usize,
    dv: usize,
}

/// Sizes in the order b, t, s, h, g, d, dv.
const fn sz(b: usize, t: usize, s: usize, h: usize, g: usize, d: usize, dv: usize) -> Sz {
    Sz {
        b,
        t,
        s,
        h,
        g,
        d,
        dv,
    }
}

/// One attention problem: inputs plus everything its spec borrows.
struct Case {
    name: String,
    sz: Sz,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Upstream gradient of the output.
    dy: Tensor,
    scale: Option<f32>,
    causal: Option<CausalAlign>,
    window: Option<usize>,
    padding: Option<Vec<bool>>,
    mask: Option<(Vec<bool>, [usize; 4])>,
    /// A dense bias, whose gradient every check asks for.
    bias: Option<Tensor>,
    alibi: Option<Vec<f32>>,
    softcap: Option<f32>,
}

impl Case {
    fn new(name: &str, sz: Sz, rng: &mut Rng) -> Case {
        Case {
            name: format!("{name} {sz:?}"),
            sz,
            q: rng.tensor(&[sz.b, sz.t, sz.h, sz.d], 1.0),
            k: rng.tensor(&[sz.b, sz.s, sz.g, sz.d], 1.0),
            v: rng.tensor(&[sz.b, sz.s, sz.g, sz.dv], 1.0),
            dy: rng.tensor(&[sz.b, sz.t, sz.h, sz.dv], 1.0),
            scale: None,
            causal: None,
            window: None,
            padding: None,
            mask: None,
            bias: None,
            alibi: None,
            softcap: None,
        }
    }

    fn spec_with<'a>(&'a self, bias: Option<&'a Tensor>, kernel: Kernel) -> AttentionSpec<'a> {
        AttentionSpec {
            scale: self.scale,
            causal: self.causal,
            window: self.window,
            key_padding: self.padding.as_deref(),
            mask: self
                .mask
                .as_ref()
                .map(|(m, shape)| Broadcast::new(m, *shape)),
            bias: match (bias, &self.alibi) {
                (Some(b), _) => Some(Bias::Dense(b.as_broadcast().unwrap())),
                (None, Some(slopes)) => Some(Bias::Alibi { slopes }),
                (None, None) => None,
            },
            softcap: self.softcap,
            want_weights: false,
            kernel,
            bf16: false,
        }
    }

    fn spec(&self, kernel: Kernel) -> AttentionSpec<'_> {
        self.spec_with(self.bias.as_ref(), kernel)
    }

    fn forward(&self, kernel: Kernel) -> AttentionOutput {
        attention(&self.q, &self.k, &self.v, &self.spec(kernel))
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    fn backward(&self, kernel: Kernel) -> AttentionGrads {
        let fwd = self.forward(kernel);
        attention_backward(
            &self.q,
            &self.k,
            &self.v,
            &fwd,
            &self.dy,
            &self.spec(kernel),
            self.bias.is_some(),
        )
        .unwrap_or_else(|e| panic!("{} backward: {e}", self.name))
    }
}

/// A random `[.., T, S]` boolean mask of `shape` keeping ~60% of keys, at least one
/// per row, except rows listed in `dead` (all false).
fn bool_mask(rng: &mut Rng, shape: [usize; 4], dead: &[usize]) -> (Vec<bool>, [usize; 4]) {
    let (t, s) = (shape[2], shape[3]);
    let n: usize = shape.iter().product();
    let mut m: Vec<bool> = (0..n).map(|_| rng.uniform() < 0.6).collect();
    for (r, row) in m.chunks_mut(s).enumerate() {
        let i = r % t;
        row[(3 * i + 1) % s] = true;
        if dead.contains(&i) {
            row.fill(false);
        }
    }
    (m, shape)
}

/// Key padding `[B, S]`: row b pads `front` keys in front and `back` behind.
fn padding(sz: Sz, rows: &[(usize, usize)]) -> Vec<bool> {
    let mut p = vec![true; sz.b * sz.s];
    for (b, &(front, back)) in rows.iter().enumerate().take(sz.b) {
        for j in 0..sz.s {
            p[b * sz.s + j] = j >= front && j + back < sz.s;
        }
    }
    p
}

/// A dense bias of `shape`, with a fraction `neg_inf` of its entries −∞ (masked).
fn dense_bias(rng: &mut Rng, shape: [usize; 4], neg_inf: f64) -> Tensor {
    let mut b = rng.tensor(&shape, 1.0);
    for x in b.data_mut() {
        if rng.uniform() < neg_inf {
            *x = f32::NEG_INFINITY;
        }
    }
    b
}

/// Every mask kind the spec can express, on sizes `sz`. `finite_bias` keeps dense
/// biases finite (finite differences cannot step a −∞).
fn mask_kinds(sz: Sz, seed: u64, finite_bias: bool) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let rng = &mut rng;
    let (b, t, s, h) = (sz.b, sz.t, sz.s, sz.h);
    let w = (s / 4).max(2);
    let mut cases = Vec::new();
    let mut add = |name: &str, rng: &mut Rng, f: &dyn Fn(&mut Case, &mut Rng)| {
        let mut c = Case::new(name, sz, rng);
        f(&mut c, rng);
        cases.push(c);
    };
    add("none", rng, &|_, _| {});
    add("scale_one", rng, &|c, _| c.scale = Some(1.0));
    add("causal_top_left", rng, &|c, _| {
        c.causal = Some(CausalAlign::TopLeft)
    });
    add("causal_bottom_right", rng, &|c, _| {
        c.causal = Some(CausalAlign::BottomRight)
    });
    add("window_causal", rng, &|c, _| {
        c.causal = Some(CausalAlign::TopLeft);
        c.window = Some(w);
    });
    add("window_bidirectional", rng, &|c, _| c.window = Some(w));
    add("window_bottom_right", rng, &|c, _| {
        c.causal = Some(CausalAlign::BottomRight);
        c.window = Some(w);
    });
    add("key_padding", rng, &|c, _| {
        c.padding = Some(padding(sz, &[(0, s / 3), (s / 4, 0)]))
    });
    add("bool_mask_shared", rng, &|c, r| {
        c.mask = Some(bool_mask(r, [1, 1, t, s], &[]))
    });
    add("bool_mask_per_batch", rng, &|c, r| {
        c.mask = Some(bool_mask(r, [b, 1, t, s], &[]))
    });
    add("bool_mask_per_head", rng, &|c, r| {
        c.mask = Some(bool_mask(r, [b, h, t, s], &[]))
    });
    let inf = if finite_bias { 0.0 } else { 0.1 };
    for (name, shape) in [
        ("bias_per_head", [1, h, t, s]),
        ("bias_per_batch", [b, 1, t, s]),
        ("bias_full", [b, h, t, s]),
        ("bias_shared", [1, 1, t, s]),
    ] {
        add(name, rng, &|c, r| c.bias = Some(dense_bias(r, shape, inf)));
    }
    add("alibi", rng, &|c, _| {
        c.alibi = Some(qkv::position::alibi_slopes(h))
    });
    add("alibi_causal_bottom_right", rng, &|c, _| {
        c.alibi = Some(qkv::position::alibi_slopes(h));
        c.causal = Some(CausalAlign::BottomRight);
    });
    // a cap near the scores' size, where tanh bends them
    add("softcap", rng, &|c, _| c.softcap = Some(1.5));
    add("softcap_bias_causal", rng, &|c, r| {
        c.softcap = Some(2.0);
        c.scale = Some(1.0);
        c.causal = Some(CausalAlign::BottomRight);
        c.bias = Some(dense_bias(r, [1, h, t, s], inf));
    });
    add("fully_masked", rng, &|c, r| {
        // query row 1 sees nothing (bool mask); the last batch row's keys are all padding
        c.mask = Some(bool_mask(r, [1, 1, t, s], &[1]));
        let mut rows = vec![(0, 0); b];
        rows[b - 1] = (0, s);
        c.padding = Some(padding(sz, &rows));
    });
    add("combined", rng, &|c, r| {
        c.causal = Some(CausalAlign::TopLeft);
        c.window = Some(w + 1);
        c.padding = Some(padding(sz, &[(1, 0), (0, s / 5)]));
        c.bias = Some(dense_bias(r, [1, h, t, s], inf));
    });
    cases
}

fn fully_masked_rows(fwd: &AttentionOutput) -> Vec<usize> {
    fwd.lse
        .data()
        .iter()
        .enumerate()
        .filter(|(_, l)| **l == f32::NEG_INFINITY)
        .map(|(i, _)| i)
        .collect()
}

fn assert_finite(what: &str, x: &Tensor) {
    assert!(
        x.data().iter().all(|v| v.is_finite()),
        "{what}: non-finite gradient"
    );
}

/// Zero dQ on every fully masked query row, and finite gradients everywhere.
fn check_masked_rows(c: &Case, fwd: &AttentionOutput, g: &AttentionGrads, kernel: Kernel) {
    let what = format!("{} ({kernel:?})", c.name);
    for (name, x) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
        assert_finite(&format!("{what} {name}"), x);
    }
    if let Some(db) = &g.dbias {
        assert_finite(&format!("{what} dbias"), db);
    }
    let Sz { t, h, d, .. } = c.sz;
    for bhi in fully_masked_rows(fwd) {
        let (b, hh, i) = (bhi / (h * t), bhi / t % h, bhi % t);
        let row = &g.dq.data()[((b * t + i) * h + hh) * d..][..d];
        assert!(
            row.iter().all(|&x| x == 0.0),
            "{what}: dq of fully masked row b{b} h{hh} i{i} is {row:?}"
        );
    }
}

#[test]
fn tiled_backward_equals_reference_on_every_mask_kind() {
    let sizes = [
        sz(2, 7, 9, 2, 2, 8, 8),
        // GQA, Dv ≠ D, more queries than keys
        sz(2, 9, 7, 4, 2, 8, 5),
        // MQA
        sz(2, 5, 11, 3, 1, 4, 6),
        // beyond one tile in both directions
        sz(2, 130, 130, 2, 1, 16, 16),
        sz(2, 33, 200, 4, 2, 16, 8),
    ];
    let mut worst = [0.0f32; 4];
    let mut worst_scale_one = [0.0f32; 4];
    let mut saw_fully_masked = false;
    for (n, &sz) in sizes.iter().enumerate() {
        for c in mask_kinds(sz, 1000 + n as u64, false) {
            let fwd = c.forward(Kernel::Reference);
            saw_fully_masked |= !fully_masked_rows(&fwd).is_empty();
            let r = c.backward(Kernel::Reference);
            let tl = c.backward(Kernel::Tiled);
            check_masked_rows(&c, &fwd, &r, Kernel::Reference);
            check_masked_rows(&c, &fwd, &tl, Kernel::Tiled);
            let pairs = [
                ("dq", &tl.dq, &r.dq),
                ("dk", &tl.dk, &r.dk),
                ("dv", &tl.dv, &r.dv),
            ];
            // Equal to 1e-5 absolute (+1e-5 relative) on O(1) logits, where the worst measured
            // difference is 5e-6 (ALiBi over 200 keys, logits up to ~50). With scale 1 the logits are ~N(0, D = 16) and the
            // gradients reach ~12; the tiled kernel's P = exp(s − lse) then carries the
            // rounding of |s|, |lse| ~ 15 (≈ 1e-6 relative) into sums over up to 200 keys,
            // measured up to 1.7e-5: 1e-4 there.
            let atol = if c.name.starts_with("scale_one") {
                1e-4
            } else {
                1e-5
            };
            let worst = if c.name.starts_with("scale_one") {
                &mut worst_scale_one
            } else {
                &mut worst
            };
            for (w, (name, a, e)) in worst.iter_mut().zip(pairs) {
                assert_tensor_close(&format!("{} {name}", c.name), a, e, atol, 1e-5);
                *w = w.max(a.max_abs_diff(e));
            }
            match (&tl.dbias, &r.dbias, &c.bias) {
                (Some(a), Some(e), Some(bias)) => {
                    assert_tensor_close(&format!("{} dbias", c.name), a, e, atol, 1e-5);
                    worst[3] = worst[3].max(a.max_abs_diff(e));
                    // No gradient reaches a −∞ (masked) bias entry.
                    for (i, (&bv, &g)) in bias.data().iter().zip(a.data()).enumerate() {
                        if bv == f32::NEG_INFINITY {
                            assert_eq!(g, 0.0, "{}: dbias[{i}] at a −∞ entry", c.name);
                        }
                    }
                }
                (None, None, None) => {}
                _ => panic!("{}: dbias present in one kernel only", c.name),
            }
        }
    }
    assert!(saw_fully_masked, "no case had a fully masked row");
    eprintln!(
        "tiled vs reference, worst |diff| (dq, dk, dv, dbias): {worst:?}; with scale 1: {worst_scale_one:?}"
    );
}

/// Central differences of L = Σ out ∘ dy in each of q, k, v and the dense bias.
///
/// Tolerance: the step h = 1e-2 leaves a truncation error ~h²·|∂³L|/6 ≈ 1e-5·|∂³L|, and
/// the f32 forward adds rounding ~ε_f32·|L|/h ≈ 1e-5 for |L| ~ 1..10. Gradients are O(1),
/// so atol 5e-4 + rtol 5e-3 sits well above both and far below what a wrong term in a
/// backward formula produces (O(0.1)).
#[test]
fn attention_backward_matches_finite_differences() {
    let sizes = [
        sz(2, 3, 4, 2, 2, 4, 3),
        // GQA with T > S (bottom-right leaves the first query row with no key)
        sz(2, 4, 3, 2, 1, 3, 4),
    ];
    let (atol, rtol) = (5e-4, 5e-3);
    let step = 1e-2;
    let mut worst: f64 = 0.0;
    for (n, &sz) in sizes.iter().enumerate() {
        for c in mask_kinds(sz, 2000 + n as u64, true) {
            for kernel in KERNELS {
                let g = c.backward(kernel);
                let what = format!("{} ({kernel:?})", c.name);
                let loss = |q: &Tensor, k: &Tensor, v: &Tensor, bias: Option<&Tensor>| {
                    let out = attention(q, k, v, &c.spec_with(bias, kernel)).unwrap().out;
                    probe_loss(out.data(), c.dy.data())
                };
                let shape_of = |x: &Tensor| x.shape().to_vec();
                let bias = c.bias.as_ref();
                let mut checks: Vec<(&str, Vec<f64>, &Tensor)> = Vec::new();
                let mut x = c.q.data().to_vec();
                let num = numeric_grad(&mut x, step, |x| {
                    loss(
                        &Tensor::new(&shape_of(&c.q), x.to_vec()).unwrap(),
                        &c.k,
                        &c.v,
                        bias,
                    )
                });
                checks.push(("dq", num, &g.dq));
                let mut x = c.k.data().to_vec();
                let num = numeric_grad(&mut x, step, |x| {
                    loss(
                        &c.q,
                        &Tensor::new(&shape_of(&c.k), x.to_vec()).unwrap(),
                        &c.v,
                        bias,
                    )
                });
                checks.push(("dk", num, &g.dk));
                let mut x = c.v.data().to_vec();
                let num = numeric_grad(&mut x, step, |x| {
                    loss(
                        &c.q,
                        &c.k,
                        &Tensor::new(&shape_of(&c.v), x.to_vec()).unwrap(),
                        bias,
                    )
                });
                checks.push(("dv", num, &g.dv));
                if let Some(b) = bias {
                    let mut x = b.data().to_vec();
                    let num = numeric_grad(&mut x, step, |x| {
                        let bt = Tensor::new(&shape_of(b), x.to_vec()).unwrap();
                        loss(&c.q, &c.k, &c.v, Some(&bt))
                    });
                    checks.push(("dbias", num, g.dbias.as_ref().expect("dbias asked for")));
                }
                for (name, num, analytic) in checks {
                    compare(&format!("{what} {name}"), analytic.data(), &num, atol, rtol)
                        .unwrap_or_else(|e| panic!("{e}"));
                    for (a, n) in analytic.data().iter().zip(&num) {
                        worst = worst.max((*a as f64 - n).abs());
                    }
                }
            }
        }
    }
    eprintln!("attention vs finite differences, worst |diff| {worst:e}");
}

#[test]
fn tiled_backward_is_bit_identical_for_any_thread_count() {
    let c = mask_kinds(sz(1, 130, 150, 4, 2, 16, 8), 3000, false)
        .into_iter()
        .find(|c| c.name.starts_with("combined"))
        .unwrap();
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| c.backward(Kernel::Tiled))
    };
    let one = run(1);
    for threads in [2, 3] {
        let many = run(threads);
        assert_eq!(one.dq, many.dq, "dq with {threads} threads");
        assert_eq!(one.dk, many.dk, "dk with {threads} threads");
        assert_eq!(one.dv, many.dv, "dv with {threads} threads");
        assert_eq!(one.dbias, many.dbias, "dbias with {threads} threads");
    }
}

#[test]
fn backward_rejects_bad_input() {
    let mut rng = Rng::new(7);
    let c = Case::new("bad", sz(1, 3, 4, 2, 1, 4, 4), &mut rng);
    let fwd = c.forward(Kernel::Tiled);
    let spec = c.spec(Kernel::Tiled);
    // dbias without a dense bias
    let err = attention_backward(&c.q, &c.k, &c.v, &fwd, &c.dy, &spec, true).unwrap_err();
    assert!(err.to_string().contains("want_dbias"), "{err}");
    // d_out of the wrong shape
    let dy = Tensor::zeros(&[1, 3, 2, 3]);
    let err = attention_backward(&c.q, &c.k, &c.v, &fwd, &dy, &spec, false).unwrap_err();
    assert!(err.to_string().contains("d_out"), "{err}");
    // forward from other shapes
    let mut stale = fwd.clone();
    stale.lse = Tensor::zeros(&[1, 2, 4]);
    let err = attention_backward(&c.q, &c.k, &c.v, &stale, &c.dy, &spec, false).unwrap_err();
    assert!(err.to_string().contains("lse"), "{err}");
    // non-finite upstream gradient
    let mut dy = c.dy.clone();
    dy.data_mut()[0] = f32::NAN;
    let err = attention_backward(&c.q, &c.k, &c.v, &fwd, &dy, &spec, false).unwrap_err();
    assert!(err.to_string().contains("d_out"), "{err}");
}

// ---------------------------------------------------------------------------------
// torch.autograd fixtures
// ---------------------------------------------------------------------------------

const TORCH_CASES: &[&str] = &[
    "causal",
    "causal_rect",
    "bool_mask",
    "bias",
    "gqa",
    "key_padding",
    "fully_masked",
    "combined",
];

fn shape4(shape: &[usize]) -> [usize; 4] {
    shape.try_into().expect("4-d")
}

/// Gradients agree with torch to 1e-5 absolute (plus 1e-5 relative for the few
/// entries of magnitude > 1): both sides sum at most 17 f32 products per entry.
fn check_torch_case(f: &Fixture, kernel: Kernel) -> f32 {
    let (q, k, v, dy) = (f.t("q"), f.t("k"), f.t("v"), f.t("dy"));
    let mask = f.has("bool_mask").then(|| f.bools("bool_mask"));
    let padding = f.has("key_padding").then(|| f.bools("key_padding").1);
    let bias = f.has("bias").then(|| f.t("bias"));
    let spec = AttentionSpec {
        scale: f.param_f32("scale"),
        causal: match f.param_str("causal") {
            None => None,
            Some("top_left") => Some(CausalAlign::TopLeft),
            Some(other) => panic!("{}: unknown causal {other}", f.name),
        },
        key_padding: padding.as_deref(),
        mask: mask
            .as_ref()
            .map(|(shape, m)| Broadcast::new(m, shape4(shape))),
        bias: bias
            .as_ref()
            .map(|b| Bias::Dense(b.as_broadcast().unwrap())),
        kernel,
        ..Default::default()
    };
    let what = format!("{} ({kernel:?})", f.name);
    let fwd = attention(&q, &k, &v, &spec).unwrap();
    assert_tensor_close(&format!("{what} out"), &fwd.out, &f.t("out"), 1e-5, 1e-5);
    let g = attention_backward(&q, &k, &v, &fwd, &dy, &spec, bias.is_some())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut worst = 0.0f32;
    for (name, got) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
        let want = f.t(name);
        assert_tensor_close(&format!("{what} {name}"), got, &want, 1e-5, 1e-5);
        worst = worst.max(got.max_abs_diff(&want));
    }
    if let Some(db) = &g.dbias {
        let want = f.t("dbias");
        assert_tensor_close(&format!("{what} dbias"), db, &want, 1e-5, 1e-5);
        worst = worst.max(db.max_abs_diff(&want));
    }
    worst
}

#[test]
fn attention_gradients_match_torch_autograd() {
    let mut worst = 0.0f32;
    for case in TORCH_CASES {
        let f = fixture("grad", &format!("attention_{case}"));
        for kernel in KERNELS {
            worst = worst.max(check_torch_case(&f, kernel));
        }
    }
    eprintln!("attention vs torch autograd, worst |diff| {worst:e}");
}

#[test]
fn torch_gives_zero_gradients_on_fully_masked_rows_too() {
    // What torch 2.9.1 did when the fixture was generated; our contract is zeros.
    let f = fixture("grad", "attention_fully_masked");
    assert_eq!(f.param_str("torch_fully_masked_dq"), Some("zeros"));
    let dq = f.t("dq");
    let d = dq.shape()[3];
    assert!(dq.data().chunks(d).any(|row| row.iter().all(|&x| x == 0.0)));
}

// ---------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------

fn positions(f: &Fixture) -> Vec<usize> {
    f.ints("position_ids")
        .1
        .into_iter()
        .map(|p| p as usize)
        .collect()
}

#[test]
fn rope_backward_matches_hf_autograd() {
    let f = fixture("grad", "rope_half");
    let rope = Rope::new(8, f.param_f32("base").unwrap(), RopeLayout::HalfSplit).unwrap();
    let pos = positions(&f);
    let mut worst = 0.0f32;
    for name in ["q", "k"] {
        let mut x = f.t(name);
        rope.apply(&mut x, &pos).unwrap();
        assert_tensor_close(
            &format!("rope_half {name}_out"),
            &x,
            &f.t(&format!("{name}_out")),
            1e-5,
            0.0,
        );
        let mut dx = f.t(&format!("dy_{name}"));
        rope.backward(&mut dx, &pos).unwrap();
        let want = f.t(&format!("d{name}"));
        assert_tensor_close(&format!("rope_half d{name}"), &dx, &want, 1e-5, 0.0);
        worst = worst.max(dx.max_abs_diff(&want));
    }

    let f = fixture("grad", "rope_interleaved_partial");
    let rope = Rope::partial(
        f.param_usize("head_dim").unwrap(),
        f.param_usize("rotary_dim").unwrap(),
        f.param_f32("base").unwrap(),
        RopeLayout::Interleaved,
    )
    .unwrap();
    let pos = positions(&f);
    let mut y = f.t("x");
    rope.apply(&mut y, &pos).unwrap();
    assert_tensor_close("rope_interleaved_partial y", &y, &f.t("y"), 1e-5, 0.0);
    let mut dx = f.t("dy");
    rope.backward(&mut dx, &pos).unwrap();
    assert_tensor_close("rope_interleaved_partial dx", &dx, &f.t("dx"), 1e-5, 0.0);
    worst = worst.max(dx.max_abs_diff(&f.t("dx")));
    eprintln!("rope vs torch autograd, worst |diff| {worst:e}");
}

/// RoPE is linear in x, so central differences have no truncation error; what is left
/// is f32 rounding of the forward, ~ε_f32·|L|/h ≈ 1e-5 with h = 1e-2.
#[test]
fn rope_backward_matches_finite_differences() {
    let mut rng = Rng::new(11);
    for (layout, rotary) in [
        (RopeLayout::HalfSplit, 6),
        (RopeLayout::Interleaved, 6),
        (RopeLayout::HalfSplit, 4),
        (RopeLayout::Interleaved, 4),
    ] {
        let rope = Rope::partial(6, rotary, 10000.0, layout).unwrap();
        let x = rng.tensor(&[2, 3, 2, 6], 1.0);
        let r = rng.tensor(&[2, 3, 2, 6], 1.0);
        let pos = [0, 1, 2, 5, 9, 40];
        let mut dx = r.clone();
        rope.backward(&mut dx, &pos).unwrap();
        let mut data = x.data().to_vec();
        let num = numeric_grad(&mut data, 1e-2, |d| {
            let mut y = Tensor::new(x.shape(), d.to_vec()).unwrap();
            rope.apply(&mut y, &pos).unwrap();
            probe_loss(y.data(), r.data())
        });
        compare(
            &format!("rope {layout:?} R={rotary}"),
            dx.data(),
            &num,
            1e-4,
            1e-4,
        )
        .unwrap_or_else(|e| panic!("{e}"));

        // Rotation back undoes rotation: backward is the inverse of apply.
        let mut y = x.clone();
        rope.apply(&mut y, &pos).unwrap();
        rope.backward(&mut y, &pos).unwrap();
        assert_tensor_close("rope backward ∘ apply", &y, &x, 1e-6, 1e-6);
        // The offset form agrees with explicit positions.
        let mut a = r.clone();
        let mut b = r.clone();
        rope.backward_offset(&mut a, 3).unwrap();
        rope.backward(&mut b, &[3, 4, 5, 3, 4, 5]).unwrap();
        assert_eq!(a, b);
    }
}

// ---------------------------------------------------------------------------------
// T5 relative bias
// ---------------------------------------------------------------------------------

#[test]
fn relative_bias_backward_matches_hf_autograd() {
    let f = fixture("grad", "t5_bias_table");
    let (t, s) = (f.param_usize("T").unwrap(), f.param_usize("S").unwrap());
    let md = f.param_usize("max_distance").unwrap();
    let off = f.param_usize("dec_offset").unwrap();
    let mut worst = 0.0f32;
    for (suffix, bidirectional, offset) in [("", true, 0), ("_dec", false, off)] {
        let table = f.t(&format!("table{suffix}"));
        let rb = RelativeBias::new(table.clone(), bidirectional, md).unwrap();
        let bias = rb.compute(t, s, offset);
        assert_tensor_close(
            &format!("t5 bias{suffix}"),
            &bias,
            &f.t(&format!("bias{suffix}")),
            0.0,
            0.0,
        );
        // backward adds: start from a non-zero gradient and subtract it afterwards.
        let mut grads = Tensor::from_fn(table.shape(), |i| i as f32);
        rb.backward(&f.t(&format!("dy{suffix}")), offset, &mut grads)
            .unwrap();
        for (i, x) in grads.data_mut().iter_mut().enumerate() {
            *x -= i as f32;
        }
        let want = f.t(&format!("dtable{suffix}"));
        assert_tensor_close(&format!("t5 dtable{suffix}"), &grads, &want, 1e-5, 1e-5);
        worst = worst.max(grads.max_abs_diff(&want));
    }

    // Through attention: table → bias → sdpa(scale 1) → out.
    let f = fixture("grad", "t5_bias_attention");
    let rb = RelativeBias::new(f.t("table"), true, f.param_usize("max_distance").unwrap()).unwrap();
    let (q, k, v, dy) = (f.t("q"), f.t("k"), f.t("v"), f.t("dy"));
    let (t, s) = (q.shape()[1], k.shape()[1]);
    let bias = rb.compute(t, s, 0);
    for kernel in KERNELS {
        let spec = AttentionSpec {
            scale: Some(1.0),
            bias: Some(Bias::Dense(bias.as_broadcast().unwrap())),
            kernel,
            ..Default::default()
        };
        let fwd = attention(&q, &k, &v, &spec).unwrap();
        assert_tensor_close("t5 attention out", &fwd.out, &f.t("out"), 1e-5, 1e-5);
        let g = attention_backward(&q, &k, &v, &fwd, &dy, &spec, true).unwrap();
        let mut dtable = Tensor::zeros(rb.table.shape());
        rb.backward(g.dbias.as_ref().unwrap(), 0, &mut dtable)
            .unwrap();
        for (name, got) in [
            ("dq", &g.dq),
            ("dk", &g.dk),
            ("dv", &g.dv),
            ("dtable", &dtable),
        ] {
            let want = f.t(name);
            // dtable sums dS over up to 2·6·6/8 entries per bucket: still ≤ 1e-5.
            assert_tensor_close(
                &format!("t5 attention {name} ({kernel:?})"),
                got,
                &want,
                1e-5,
                1e-5,
            );
            worst = worst.max(got.max_abs_diff(&want));
        }
    }
    eprintln!("relative bias vs torch autograd, worst |diff| {worst:e}");
}

/// compute() is linear in the table, so only f32 rounding of the loss remains
/// (~ε_f32·|L|/h ≈ 1e-5 with h = 1e-2).
#[test]
fn relative_bias_backward_matches_finite_differences() {
    let mut rng = Rng::new(21);
    for (bidirectional, offset) in [(true, 0), (false, 0), (false, 3), (true, 2)] {
        let table = rng.tensor(&[8, 3], 1.0);
        let (t, s) = (4, 9);
        let r = rng.tensor(&[1, 3, t, s], 1.0);
        let mut rb = RelativeBias::new(table.clone(), bidirectional, 20).unwrap();
        let mut grads = Tensor::zeros(&[8, 3]);
        rb.backward(&r, offset, &mut grads).unwrap();
        let mut data = table.data().to_vec();
        let num = numeric_grad(&mut data, 1e-2, |x| {
            rb.table = Tensor::new(&[8, 3], x.to_vec()).unwrap();
            probe_loss(rb.compute(t, s, offset).data(), r.data())
        });
        compare(
            &format!("relative bias bidirectional={bidirectional} offset={offset}"),
            grads.data(),
            &num,
            1e-4,
            1e-4,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    // Shape errors name the tensor.
    let rb = RelativeBias::new(Tensor::zeros(&[8, 3]), true, 20).unwrap();
    let err = rb
        .backward(
            &Tensor::zeros(&[1, 2, 4, 4]),
            0,
            &mut Tensor::zeros(&[8, 3]),
        )
        .unwrap_err();
    assert!(err.to_string().contains("relative bias gradient"), "{err}");
}
