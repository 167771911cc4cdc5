//! Attention against PyTorch: `F.scaled_dot_product_attention` for every mask kind and
//! `nn.MultiheadAttention` for the module (tools/fixtures/gen_sdpa.py, gen_mha.py).
//! Both kernels are checked against the same reference numbers.

mod common;

use common::{assert_close, assert_tensor_close, fixture, Fixture};
use qkv::layers::Linear;
use qkv::{attention, AttentionSpec, Bias, Broadcast, CausalAlign, Kernel, MultiHeadAttention};

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

fn check_sdpa_case(f: &Fixture, kernel: Kernel) {
    let (q, k, v) = (f.t("q"), f.t("k"), f.t("v"));
    let mask = f.has("bool_mask").then(|| f.bools("bool_mask"));
    let padding = f.has("key_padding").then(|| f.bools("key_padding").1);
    let bias = f.has("bias").then(|| f.t("bias"));
    let spec = AttentionSpec {
        scale: f.param_f32("scale"),
        causal: match f.param_str("causal") {
            None => None,
            Some("top_left") => Some(CausalAlign::TopLeft),
            Some("bottom_right") => Some(CausalAlign::BottomRight),
            Some(other) => panic!("{}: unknown causal {other}", f.name),
        },
        window: f.param_usize("window"),
        key_padding: padding.as_deref(),
        mask: mask
            .as_ref()
            .map(|(shape, m)| Broadcast::new(m, shape4(shape))),
        bias: bias
            .as_ref()
            .map(|b| Bias::Dense(b.as_broadcast().unwrap())),
        want_weights: true,
        kernel,
    };
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
