//! Attention against PyTorch: `F.scaled_dot_product_attention` for every mask kind and
//! `nn.MultiheadAttention` for the module (tools/fixtures/gen_sdpa.py, gen_mha.py).
//! Both kernels are checked against the same reference numbers.

#![cfg(feature = "models")]

mod common;

use common::{assert_close, assert_tensor_close, fixture, Fixture};
use qkv::attention::{attention_backward, attention_backward_views, attention_views, HeadsView};
use qkv::layers::Linear;
use qkv::{
    attention, AttentionSpec, Bias, Broadcast, CausalAlign, Kernel, MultiHeadAttention, Tensor,
};

const SDPA_CASES: &[&str] = &[
    "self_plain",
    "cross",
    "causal_top_left",
    "causal_top_left_rect",
    "causal_bottom_right",
    "decode_bottom_right",
    "bool_mask_shared",
    "bool_mask_per_batch",
    "bool_mask_per_head",
    "bias_per_head",
    "key_padding",
    "window_causal",
    "window_bidirectional",
    "gqa",
    "mqa",
    "scale_one",
    "value_dim",
    "fully_masked",
    "combined",
    "long",
];

fn shape4(shape: &[usize]) -> [usize; 4] {
    shape.try_into().expect("4-d mask")
}

/// A fixture's masks and bias, owned, for the spec that borrows them.
struct Extras {
    mask: Option<(Vec<usize>, Vec<bool>)>,
    padding: Option<Vec<bool>>,
    bias: Option<Tensor>,
}

impl Extras {
    fn of(f: &Fixture) -> Self {
        Extras {
            mask: f.has("bool_mask").then(|| f.bools("bool_mask")),
            padding: f.has("key_padding").then(|| f.bools("key_padding").1),
            bias: f.has("bias").then(|| f.t("bias")),
        }
    }

    fn spec(&self, f: &Fixture, kernel: Kernel) -> AttentionSpec<'_> {
        AttentionSpec {
            scale: f.param_f32("scale"),
            causal: match f.param_str("causal") {
                None => None,
                Some("top_left") => Some(CausalAlign::TopLeft),
                Some("bottom_right") => Some(CausalAlign::BottomRight),
                Some(other) => panic!("{}: unknown causal {other}", f.name),
            },
            window: f.param_usize("window"),
            key_padding: self.padding.as_deref(),
            mask: self
                .mask
                .as_ref()
                .map(|(shape, m)| Broadcast::new(m, shape4(shape))),
            bias: self
                .bias
                .as_ref()
                .map(|b| Bias::Dense(b.as_broadcast().unwrap())),
            softcap: None,
            want_weights: true,
            kernel,
            bf16: false,
        }
    }
}

fn check_sdpa_case(f: &Fixture, kernel: Kernel) {
    let (q, k, v) = (f.t("q"), f.t("k"), f.t("v"));
    let extras = Extras::of(f);
    let spec = extras.spec(f, kernel);
    let a = attention(&q, &k, &v, &spec).unwrap_or_else(|e| panic!("{}: {e}", f.name));
    let what = format!("{} ({kernel:?})", f.name);
    assert_tensor_close(
        &format!("{what} weights"),
        a.weights.as_ref().unwrap(),
        &f.t("weights"),
        1e-5,
        0.0,
    );

    let expected = f.t("out");
    let [b, t, h, dv] = shape4(expected.shape());
    let s = k.shape()[1];
    let weights = f.t("weights");
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let row = ((bi * t + i) * h + hi) * dv;
                let w_row = &weights.data()[((bi * h + hi) * t + i) * s..][..s];
                let got = &a.out.data()[row..row + dv];
                if w_row.iter().all(|&w| w == 0.0) {
                    // Every key masked: qkv defines the output as zeros (never NaN).
                    assert!(
                        got.iter().all(|&x| x == 0.0),
                        "{what}: masked row {bi},{i},{hi} not zero"
                    );
                } else {
                    assert_close(
                        &format!("{what} out[{bi},{i},{hi}]"),
                        got,
                        &expected.data()[row..row + dv],
                        1e-5,
                        0.0,
                    );
                }
            }
        }
    }
}

#[test]
fn sdpa_reference_kernel_matches_torch() {
    for case in SDPA_CASES {
        check_sdpa_case(&fixture("sdpa", case), Kernel::Reference);
    }
}

#[test]
fn sdpa_tiled_kernel_matches_torch() {
    for case in SDPA_CASES {
        check_sdpa_case(&fixture("sdpa", case), Kernel::Tiled);
    }
}

/// `[B, L, N, E]` → `[B, N, L, E]`, PyTorch's SDPA layout.
fn heads_major(x: &Tensor) -> Vec<f32> {
    let [b, l, n, e] = shape4(x.shape());
    let mut out = Vec::with_capacity(x.numel());
    for bi in 0..b {
        for ni in 0..n {
            for li in 0..l {
                let at = ((bi * l + li) * n + ni) * e;
                out.extend_from_slice(&x.data()[at..at + e]);
            }
        }
    }
    out
}

/// Q, K and V read in place in the heads-major layout `[B, H, T, D]` give what the
/// positions-major tensors give, forward and backward, on every kernel path (the decode
/// path takes the one-query cases).
#[test]
fn heads_major_views_equal_the_positions_major_layout() {
    for case in SDPA_CASES {
        let f = fixture("sdpa", case);
        let (q, k, v) = (f.t("q"), f.t("k"), f.t("v"));
        let (qh, kh, vh) = (heads_major(&q), heads_major(&k), heads_major(&v));
        let swap = |t: &Tensor| {
            let [b, l, n, e] = shape4(t.shape());
            [b, n, l, e]
        };
        let views = (
            HeadsView::heads_major(&qh, swap(&q)),
            HeadsView::heads_major(&kh, swap(&k)),
            HeadsView::heads_major(&vh, swap(&v)),
        );
        let extras = Extras::of(&f);
        for kernel in [Kernel::Reference, Kernel::Tiled] {
            let spec = extras.spec(&f, kernel);
            let want = attention(&q, &k, &v, &spec).unwrap();
            let got = attention_views(&views.0, &views.1, &views.2, &spec).unwrap();
            let what = format!("{case} ({kernel:?})");
            assert_tensor_close(&format!("{what} out"), &got.out, &want.out, 1e-6, 0.0);
            assert_tensor_close(&format!("{what} lse"), &got.lse, &want.lse, 1e-6, 0.0);
            let d_out = Tensor::from_fn(want.out.shape(), |i| (i as f32 * 0.37).sin());
            let want_g = attention_backward(&q, &k, &v, &want, &d_out, &spec, false).unwrap();
            let got_g =
                attention_backward_views(&views.0, &views.1, &views.2, &got, &d_out, &spec, false)
                    .unwrap();
            for (name, g, w) in [
                ("dq", &got_g.dq, &want_g.dq),
                ("dk", &got_g.dk, &want_g.dk),
                ("dv", &got_g.dv, &want_g.dv),
            ] {
                assert_tensor_close(&format!("{what} {name}"), g, w, 1e-6, 0.0);
            }
        }
    }
}

#[test]
fn fully_masked_case_really_has_masked_rows() {
    // Guards the zero-row branch above against silently never running.
    let f = fixture("sdpa", "fully_masked");
    assert_eq!(
        f.params.get("fully_masked_rows").and_then(|v| v.as_bool()),
        Some(true)
    );
    let w = f.t("weights");
    let s = w.shape()[3];
    assert!(w.data().chunks(s).any(|row| row.iter().all(|&x| x == 0.0)));
}

fn mha_from(f: &Fixture) -> MultiHeadAttention {
    let lin = |w: &str, b: &str| Linear::new(f.t(w), Some(f.t(b))).unwrap();
    let h = f.param_usize("n_heads").unwrap();
    MultiHeadAttention::new(
        lin("wq", "bq"),
        lin("wk", "bk"),
        lin("wv", "bv"),
        lin("wo", "bo"),
        h,
        h,
    )
    .unwrap()
}

#[test]
fn multi_head_attention_matches_torch_module() {
    for case in ["self", "self_padding", "causal", "cross_padding"] {
        let f = fixture("mha", case);
        let mha = mha_from(&f);
        let padding = f.has("key_padding").then(|| f.bools("key_padding").1);
        let context = f.has("context").then(|| f.t("context"));
        let causal = f.params.get("causal").and_then(|v| v.as_bool()).unwrap();
        for kernel in [Kernel::Reference, Kernel::Tiled] {
            let spec = AttentionSpec {
                causal: causal.then_some(CausalAlign::TopLeft),
                key_padding: padding.as_deref(),
                want_weights: true,
                kernel,
                ..Default::default()
            };
            let a = mha.forward(&f.t("x"), context.as_ref(), &spec).unwrap();
            let what = format!("mha/{case} ({kernel:?})");
            assert_tensor_close(&format!("{what} out"), &a.out, &f.t("out"), 1e-5, 1e-5);
            assert_tensor_close(
                &format!("{what} weights"),
                a.weights.as_ref().unwrap(),
                &f.t("weights"),
                1e-5,
                0.0,
            );
        }
    }
}
