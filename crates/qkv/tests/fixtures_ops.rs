//! Single ops against PyTorch (tools/fixtures/gen_ops.py), atol 1e-5.

#![cfg(feature = "models")]

mod common;

use common::{assert_close, assert_tensor_close, fixture};
use qkv::layers::{Embedding, Linear, Norm};
use qkv::ops::{matmul, softmax, Activation};

#[test]
fn activations_match_torch() {
    let f = fixture("ops", "activations");
    let x = f.t("x");
    for (name, act) in [
        ("gelu", Activation::Gelu),
        ("gelu_tanh", Activation::GeluTanh),
        ("gelu_new", Activation::from_hf_name("gelu_new").unwrap()),
        (
            "gelu_pytorch_tanh",
            Activation::from_hf_name("gelu_pytorch_tanh").unwrap(),
        ),
        ("relu", Activation::Relu),
        ("silu", Activation::Silu),
    ] {
        let mut y = x.data().to_vec();
        act.apply_slice(&mut y);
        // Inputs reach ±1000, so outputs do too: a relative term covers f32 rounding there.
        assert_close(name, &y, f.t(name).data(), 1e-5, 1e-6);
    }
}

#[test]
fn softmax_matches_torch_on_extreme_rows() {
    let f = fixture("ops", "softmax");
    assert_tensor_close("softmax", &softmax(&f.t("x")), &f.t("y"), 1e-5, 0.0);
}

#[test]
fn layer_norm_matches_torch() {
    let f = fixture("ops", "layer_norm");
    for (suffix, eps) in [
        ("", f.param_f32("eps").unwrap()),
        ("_eps12", f.param_f32("eps12").unwrap()),
    ] {
        let ln = Norm::layer_norm(
            f.t(&format!("weight{suffix}")),
            Some(f.t(&format!("bias{suffix}"))),
            eps,
        )
        .unwrap();
        let y = ln.forward(&f.t(&format!("x{suffix}"))).unwrap();
        assert_tensor_close(
            &format!("layer_norm{suffix}"),
            &y,
            &f.t(&format!("y{suffix}")),
            1e-5,
            0.0,
        );
    }
}

#[test]
fn rms_norm_matches_llama_and_torch() {
    let f = fixture("ops", "rms_norm");
    let x = f.t("x");
    let llama = Norm::rms_norm(f.t("weight"), f.param_f32("eps").unwrap()).unwrap();
    assert_tensor_close(
        "LlamaRMSNorm",
        &llama.forward(&x).unwrap(),
        &f.t("y"),
        1e-5,
        1e-6,
    );
    let torch = Norm::rms_norm(f.t("weight"), f.param_f32("eps_torch").unwrap()).unwrap();
    assert_tensor_close(
        "torch RMSNorm",
        &torch.forward(&x).unwrap(),
        &f.t("y_torch"),
        1e-5,
        1e-6,
    );
}

#[test]
fn linear_matches_torch_with_and_without_bias() {
    let f = fixture("ops", "linear");
    let x = f.t("x");
    let with = Linear::new(f.t("weight"), Some(f.t("bias"))).unwrap();
    assert_tensor_close("linear", &with.forward(&x).unwrap(), &f.t("y"), 1e-5, 0.0);
    let without = Linear::new(f.t("weight"), None).unwrap();
    assert_tensor_close(
        "linear no bias",
        &without.forward(&x).unwrap(),
        &f.t("y_nobias"),
        1e-5,
        0.0,
    );
}

#[test]
fn matmul_matches_torch() {
    let f = fixture("ops", "matmul");
    assert_tensor_close(
        "matmul",
        &matmul(&f.t("a"), &f.t("b")).unwrap(),
        &f.t("c"),
        1e-5,
        0.0,
    );
}

#[test]
fn embedding_matches_torch() {
    let f = fixture("ops", "embedding");
    let emb = Embedding::new(f.t("table")).unwrap();
    let (shape, ids) = f.ints("ids");
    let ids: Vec<usize> = ids.into_iter().map(|i| i as usize).collect();
    let y = emb.forward(&ids).unwrap();
    assert_eq!(shape.iter().product::<usize>(), y.shape()[0]);
    assert_close("embedding", y.data(), f.t("y").data(), 0.0, 0.0);
}
