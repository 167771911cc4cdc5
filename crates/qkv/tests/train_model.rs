//! Every family trains, checked against PyTorch in the spirit of llm.c (fixtures
//! `tests/fixtures/train_model/<family>/`, tools/fixtures/gen_train_model.py): the
//! Hugging Face folder loads into the one `Transformer`; the logits, the loss and every
//! parameter's gradient of one batch equal torch.autograd's; ten AdamW steps give
//! PyTorch's losses and final parameters. The batches are read through the `--data`
//! contract (`FixedBatches`), so the same file drives `qkv train --init`.
//!
//! Tolerances: everything is float32 on both sides; gradients are O(1e-3..1e-1) and
//! sums run over at most B·T = 16 tokens and C = 32 features, so agreement to atol
//! 1e-5 + rtol 1e-3 is what float32 allows (the test prints the measured worst
//! differences, around 1e-7..1e-6). Ten AdamW steps each move a parameter by ≈ lr =
//! 1e-3; the generator measured each float32 trajectory against a float64 one (at most
//! 4e-7 apart, param `traj_f32_vs_f64_worst`), so two float32 implementations that
//! differ only in rounding agree to a few 1e-7. 1e-5 leaves a margin of ~25× over
//! that, yet is 100× below one step: a single wrong update anywhere fails the test.

#![cfg(feature = "models")]

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::{assert_close, fixture, Fixture};
use qkv::models::Transformer;
use qkv::module::Module;
use qkv::train::optim::{AdamW, AdamWConfig, DecayRule};
use qkv::train::trainable::TrainableModel;
use qkv::train::trainer::FixedBatches;
use qkv::Tensor;

const LOSS_ATOL: f32 = 1e-5;
const GRAD_ATOL: f32 = 1e-5;
const GRAD_RTOL: f32 = 1e-3;
const TRAJ_ATOL: f32 = 1e-5;

fn fixture_dir(name: &str) -> PathBuf {
    [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "train_model",
        name,
    ]
    .iter()
    .collect()
}

/// Largest |a − b| (for the report; assertions use assert_close).
fn worst(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    out.sort();
    out
}

/// Parameters whose exact gradient is 0 (key biases: softmax ignores a shift shared by
/// a query's scores): name → flat ranges. Their float32 gradients and Adam updates are
/// rounding noise in both implementations.
fn noise_only(f: &Fixture) -> HashMap<String, Vec<(usize, usize)>> {
    f.params["noise_only"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let ranges = v
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    let r = r.as_array().unwrap();
                    (
                        r[0].as_u64().unwrap() as usize,
                        r[1].as_u64().unwrap() as usize,
                    )
                })
                .collect();
            (k.clone(), ranges)
        })
        .collect()
}

/// `values` without the elements in `ranges`.
fn without(values: &[f32], ranges: &[(usize, usize)]) -> Vec<f32> {
    values
        .iter()
        .enumerate()
        .filter(|(i, _)| !ranges.iter().any(|&(a, b)| (a..b).contains(i)))
        .map(|(_, &x)| x)
        .collect()
}

/// The model's gradients in the checkpoint's layout, by checkpoint name.
fn hf_grads(m: &Transformer) -> Vec<(String, Tensor)> {
    m.export(m.grads.as_ref().expect("a backward ran")).unwrap()
}

/// The whole llm.c-style check for one fixture folder.
fn check_against_pytorch(name: &str) {
    let dir = fixture_dir(name);
    let f = fixture(&format!("train_model/{name}"), "reference");
    let data = FixedBatches::open(&dir.join("reference.safetensors")).unwrap();
    let steps = f.param_usize("steps").unwrap();
    let noise = noise_only(&f);

    let mut m = Transformer::load(&dir).unwrap();
    let mut names: Vec<String> = m
        .export(&m.weights)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    names.sort();
    assert_eq!(
        names,
        strings(&f.params["names"]),
        "{name}: parameter names"
    );

    // one batch: logits, loss, every gradient
    let b0 = data.get(0).unwrap();
    let logits = m.logits(&b0).unwrap();
    let want = f.t("logits");
    assert_eq!(logits.shape(), want.shape(), "{name}: logits shape");
    assert_close(
        &format!("{name} logits"),
        logits.data(),
        want.data(),
        2e-5,
        1e-4,
    );
    let losses = f.t("losses");
    m.zero_grads();
    let loss = m.loss_and_backward(&b0).unwrap();
    assert_close(
        &format!("{name} loss"),
        &[loss],
        &losses.data()[..1],
        LOSS_ATOL,
        0.0,
    );
    let mut report = vec![format!(
        "{name}: |Δlogits| {:.1e}, |Δloss| {:.1e}",
        worst(logits.data(), want.data()),
        (loss - losses.data()[0]).abs()
    )];
    let mut worst_grad = (0.0f32, String::new());
    for (n, g) in hf_grads(&m) {
        let want = f.t(&format!("grad.{n}"));
        assert_eq!(g.shape(), want.shape(), "{name}: grad.{n} shape");
        let ranges = noise.get(&n).cloned().unwrap_or_default();
        let (got, exp) = (without(g.data(), &ranges), without(want.data(), &ranges));
        assert_close(
            &format!("{name} grad.{n}"),
            &got,
            &exp,
            GRAD_ATOL,
            GRAD_RTOL,
        );
        let w = worst(&got, &exp);
        if w > worst_grad.0 {
            worst_grad = (w, n.clone());
        }
        for &(a, b) in &ranges {
            let max = g.data()[a..b].iter().fold(0.0f32, |w, x| w.max(x.abs()));
            assert!(
                max < 1e-6,
                "{name}: {n}[{a}..{b}] gradient should be ~0, max {max}"
            );
        }
    }
    report.push(format!(
        "worst |Δgrad| {:.1e} ({})",
        worst_grad.0, worst_grad.1
    ));

    // ten AdamW steps, each on its own batch
    let lr = f.param_f32("lr").unwrap() as f64;
    let betas = f.params["betas"].as_array().unwrap();
    let mut opt = AdamW::new(AdamWConfig {
        beta1: betas[0].as_f64().unwrap(),
        beta2: betas[1].as_f64().unwrap(),
        eps: f.params["eps"].as_f64().unwrap(),
        weight_decay: f.params["weight_decay"].as_f64().unwrap(),
        decay: DecayRule::Standard,
    });
    let init: HashMap<String, Tensor> = m.export(&m.weights).unwrap().into_iter().collect();
    let mut got_losses = Vec::new();
    for s in 0..steps {
        m.zero_grads();
        got_losses.push(m.loss_and_backward(&data.get(s).unwrap()).unwrap());
        opt.step(lr, &mut m).unwrap();
    }
    // the decay groups, in checkpoint names: a checkpoint tensor decays when its parts do
    let decays: HashMap<&str, bool> = opt.param_groups().into_iter().collect();
    let mut flags = m.weights.clone();
    for (path, t) in flags.params_mut() {
        t.data_mut().fill(decays[path.as_str()] as u8 as f32);
    }
    let mut decayed: Vec<String> = m
        .export(&flags)
        .unwrap()
        .into_iter()
        .filter(|(_, t)| t.data().iter().all(|&x| x == 1.0))
        .map(|(n, _)| n)
        .collect();
    decayed.sort();
    assert_eq!(decayed, strings(&f.params["decay"]), "{name}: decay groups");
    assert_close(
        &format!("{name} losses"),
        &got_losses,
        losses.data(),
        LOSS_ATOL,
        0.0,
    );
    let mut worst_final = (0.0f32, String::new());
    for (n, p) in m.export(&m.weights).unwrap() {
        let want = f.t(&format!("final.{n}"));
        let ranges = noise.get(&n).cloned().unwrap_or_default();
        for &(a, b) in &ranges {
            // noise-driven in both implementations: only bound how far it moved
            let moved = p.data()[a..b]
                .iter()
                .zip(&init[&n].data()[a..b])
                .fold(0.0f32, |w, (x, y)| w.max((x - y).abs()));
            assert!(
                moved <= 1.5 * lr as f32 * steps as f32,
                "{name}: {n} moved {moved}"
            );
        }
        let (got, exp) = (without(p.data(), &ranges), without(want.data(), &ranges));
        assert_close(&format!("{name} final.{n}"), &got, &exp, TRAJ_ATOL, 0.0);
        let w = worst(&got, &exp);
        if w > worst_final.0 {
            worst_final = (w, n);
        }
    }
    report.push(format!(
        "10 steps: worst |Δloss| {:.1e}, worst |Δparam| {:.1e} ({})",
        worst(&got_losses, losses.data()),
        worst_final.0,
        worst_final.1
    ));
    eprintln!("{}", report.join("; "));
}

#[test]
fn gpt2_trains_as_pytorch() {
    check_against_pytorch("gpt2");
}

#[test]
fn llama_trains_as_pytorch() {
    check_against_pytorch("llama");
}

#[test]
fn mistral_trains_as_pytorch() {
    check_against_pytorch("mistral");
}

/// Q/K/V biases under RoPE, tied embeddings and YaRN-scaled RoPE (its attention factor
/// scales the rotation, in the backward pass too).
#[test]
fn qwen2_trains_as_pytorch() {
    check_against_pytorch("qwen2");
}

/// The per-head q/k RMSNorms: their weights' gradients and the gradient through them
/// to the projections, with heads narrower than C / H.
#[test]
fn qwen3_trains_as_pytorch() {
    check_against_pytorch("qwen3");
}

/// The parallel residual (d_out reaches both branches and the stream), RoPE over half
/// of each head, the fused per-head QKV.
#[test]
fn gpt_neox_trains_as_pytorch() {
    check_against_pytorch("gpt_neox");
}

/// Soft caps on scores and logits, the norms after each sub-layer, 1 + w RMSNorm,
/// √C-scaled tied embeddings, GeGLU, a local and a global layer.
#[test]
fn gemma2_trains_as_pytorch() {
    check_against_pytorch("gemma2");
}

/// Fused QKV and gate/up projections, LongRoPE's long factors and attention factor
/// (every position of the batch is past the pre-training length of 4), partial rotary.
#[test]
fn phi3_trains_as_pytorch() {
    check_against_pytorch("phi3");
}

/// RoBERTa's positions from padding_idx + 1 (padding at padding_idx) and its lm_head.
#[test]
fn roberta_masked_lm_trains_as_pytorch() {
    check_against_pytorch("roberta");
}

/// DistilBERT's names, no token types, its vocab_transform / vocab_projector head.
#[test]
fn distilbert_masked_lm_trains_as_pytorch() {
    check_against_pytorch("distilbert");
}

/// ModernBERT: a local layer windowed on both sides of the query with its own RoPE
/// base, GeGLU, no biases, no attention norm in the first layer, a head whose dense
/// layer has no bias.
#[test]
fn modernbert_masked_lm_trains_as_pytorch() {
    check_against_pytorch("modernbert");
}

/// Per-head q/k norms scaling by 1 + w, a local layer rotating with its own RoPE base
/// beside a global one with linear scaling, sandwich norms.
#[test]
fn gemma3_trains_as_pytorch() {
    check_against_pytorch("gemma3");
}

#[test]
fn bloom_trains_as_pytorch() {
    check_against_pytorch("bloom");
}

#[test]
fn bert_masked_lm_trains_as_pytorch() {
    check_against_pytorch("bert");
}

#[test]
fn marian_trains_as_pytorch() {
    check_against_pytorch("marian");
}

#[test]
fn t5_trains_as_pytorch() {
    check_against_pytorch("t5");
}

#[test]
fn t5_gated_untied_trains_as_pytorch() {
    check_against_pytorch("t5_gated");
}
