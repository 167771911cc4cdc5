//! The llm.c-style training check of a Hugging Face folder against PyTorch
//! (`tests/fixtures/train_model/<name>/`, tools/fixtures/gen_train_model.py, and their
//! transformers-5 twins `train_model_v5/<name>/`, tools/fixtures/gen_v5.py): parameter
//! names, logits, loss and every gradient of one batch, ten AdamW steps (losses, decay
//! groups, final parameters). Tolerances and their reasons: train_model.rs.

use std::collections::HashMap;
use std::path::Path;

use super::{assert_close, Fixture};
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

/// Where [`check_training`] reads the `grad.*` and `final.*` tensors: the reference
/// itself, or the 4.57 reference a transformers-5 twin takes them from.
pub struct Outputs<'a> {
    pub grads: &'a Fixture,
    pub finals: &'a Fixture,
}

/// The whole llm.c-style check of the model folder `dir` against the reference `f`
/// (its inputs drive the steps, through the `--data` contract; its params, logits and
/// losses are the expected ones), with the gradients and final parameters of `outputs`.
/// `name` labels the failures.
pub fn check_training(name: &str, dir: &Path, f: &Fixture, outputs: Outputs) {
    let data = FixedBatches::open(f.path()).unwrap();
    let steps = f.param_usize("steps").unwrap();
    let noise = noise_only(f);

    let mut m = Transformer::load(dir).unwrap_or_else(|e| panic!("loading {name}: {e}"));
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
        let want = outputs.grads.t(&format!("grad.{n}"));
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
        let want = outputs.finals.t(&format!("final.{n}"));
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
