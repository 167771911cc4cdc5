//! The trainable decoder-only model (`qkv::train::model::DecoderLm`):
//!
//! - whole-model checks against PyTorch in the spirit of llm.c (fixtures
//!   `tests/fixtures/train_model/{gpt2,llama}/`, tools/fixtures/gen_train_model.py):
//!   a Hugging Face folder loads; the loss, the logits and every parameter's gradient
//!   of one batch equal PyTorch's; ten AdamW steps give PyTorch's losses and final
//!   parameters;
//! - central finite differences of every parameter of tiny models covering every
//!   position kind, norm kind, FFN kind, pre- and post-norm, biases, tied heads, GQA;
//! - save / load: Hugging Face folders load back in `qkv::models::load` with the same
//!   logits, qkv's own folders round-trip exactly, and (ignored test, needs the fixture
//!   venv) `transformers` loads the saved folders and agrees.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{assert_close, fixture, Fixture};
use qkv::attention::Kernel;
use qkv::models::{self, Model, TokenBatch};
use qkv::rng::Rng;
use qkv::train::gradcheck::{compare, probe_loss};
use qkv::train::model::{DecoderLm, FfnKind, LmConfig, NormKind, PositionKind};
use qkv::train::optim::{AdamW, AdamWConfig, DecayRule};
use qkv::train::trainable::{Batch, TrainableModel};
use qkv::Tensor;

// ------------------------------------------------------------------------------------
// helpers
// ------------------------------------------------------------------------------------

fn fixture_dir(parts: &[&str]) -> PathBuf {
    let mut p: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "fixtures"]
        .iter()
        .collect();
    for part in parts {
        p.push(part);
    }
    p
}

/// A fresh, empty folder under the target directory (removed first if present).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("train_model-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Batch `s` of a reference fixture's `[STEPS, B, T]` input_ids / targets.
fn fixture_batch(f: &Fixture, s: usize) -> Batch {
    let (shape, ids) = f.ints("input_ids");
    let (_, targets) = f.ints("targets");
    let (b, t) = (shape[1], shape[2]);
    let n = b * t;
    Batch {
        inputs: ids[s * n..(s + 1) * n]
            .iter()
            .map(|&x| x as usize)
            .collect(),
        targets: targets[s * n..(s + 1) * n].to_vec(),
        batch: b,
        len: t,
        source: None,
    }
}

fn param_names(m: &DecoderLm) -> Vec<String> {
    let mut names = Vec::new();
    m.visit_ref(&mut |n, _, _| names.push(n.to_string()));
    names
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// Largest |a − b| over a tensor pair (for the report; assertions use assert_close).
fn worst(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Adds N(0, σ²) noise to every parameter (σ = `matrix` for rank ≥ 2, `vector` for
/// norms and biases), so a freshly initialised model (std 0.02, norms at exactly 1,
/// biases at 0) exercises every nonlinearity and every bias.
fn perturb(m: &mut DecoderLm, seed: u64, matrix: f32, vector: f32) {
    let mut rng = Rng::new(seed);
    m.visit_mut(&mut |_, p, _| {
        let std = if p.rank() >= 2 { matrix } else { vector };
        for x in p.data_mut() {
            *x += rng.normal() as f32 * std;
        }
    });
}

/// Overwrites the parameter `name` with `values`.
fn set_param(m: &mut DecoderLm, name: &str, values: &[f32]) {
    let mut found = false;
    m.visit_mut(&mut |n, p, _| {
        if n == name {
            p.data_mut().copy_from_slice(values);
            found = true;
        }
    });
    assert!(found, "no parameter {name}");
}

fn params_of(m: &DecoderLm) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    m.visit_ref(&mut |n, p, _| out.push((n.to_string(), p.data().to_vec())));
    out
}

fn grads_of(m: &DecoderLm) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    m.visit_ref(&mut |n, _, g| out.push((n.to_string(), g.data().to_vec())));
    out
}

// ------------------------------------------------------------------------------------
// whole-model checks against PyTorch
// ------------------------------------------------------------------------------------

/// Loss and gradient tolerances of one batch. Everything is float32 on both sides; the
/// gradients of this model are O(1e-3..1e-1) and sums run over at most B·T = 16 tokens
/// and C = 64 features, so agreement to atol 1e-5 + rtol 1e-3 is what float32 allows
/// (measured worst differences are printed by the test, around 1e-7..1e-6).
const LOSS_ATOL: f32 = 1e-5;
const GRAD_ATOL: f32 = 1e-5;
const GRAD_RTOL: f32 = 1e-3;
/// Ten AdamW steps: each moves a parameter by ≈ lr = 1e-3, and the generator measured
/// the float32 trajectory against a float64 one (≤ 3.4e-7 apart, param
/// traj_f32_vs_f64_worst): the trajectory is well-conditioned, and two float32
/// implementations that differ only in rounding agree to a few 1e-7. 1e-5 leaves a
/// margin of ~30× over that, yet is 100× below a single step, so one wrong update
/// anywhere fails the test.
const TRAJ_PARAM_ATOL: f32 = 1e-5;
const TRAJ_LOSS_ATOL: f32 = 1e-5;

/// The whole llm.c-style check for one fixture folder.
fn check_against_pytorch(name: &str) {
    let dir = fixture_dir(&["train_model", name]);
    let f = fixture(&format!("train_model/{name}"), "reference");
    let names = strings(&f.params["names"]);
    let steps = f.param_usize("steps").unwrap();
    let noise: HashMap<String, (usize, usize)> = f.params["noise_only"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let r = v.as_array().unwrap();
            (
                k.clone(),
                (
                    r[0].as_u64().unwrap() as usize,
                    r[1].as_u64().unwrap() as usize,
                ),
            )
        })
        .collect();

    let mut m = DecoderLm::load_hf(&dir).unwrap();
    assert_eq!(param_names(&m), names, "{name}: parameter names and order");

    // one batch: logits, loss, every gradient
    let b0 = fixture_batch(&f, 0);
    let logits = m.logits(&b0).unwrap();
    let want = f.t("logits");
    assert_eq!(logits.shape(), want.shape());
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
    for (n, g) in m.hf_grads() {
        let want = f.t(&format!("grad.{n}"));
        assert_eq!(g.shape(), want.shape(), "{name}: grad.{n} shape");
        assert_close(
            &format!("{name} grad.{n}"),
            g.data(),
            want.data(),
            GRAD_ATOL,
            GRAD_RTOL,
        );
        let w = worst(g.data(), want.data());
        if w > worst_grad.0 {
            worst_grad = (w, n);
        }
    }
    report.push(format!(
        "worst |Δgrad| {:.1e} ({})",
        worst_grad.0, worst_grad.1
    ));
    // GPT-2's key bias has an exact gradient of 0 (softmax ignores a shift shared by a
    // query's scores): ours is rounding noise, as PyTorch's is.
    for (n, &(a, b)) in &noise {
        let g = m.hf_grads().into_iter().find(|(k, _)| k == n).unwrap().1;
        let max = g.data()[a..b].iter().fold(0.0f32, |w, x| w.max(x.abs()));
        assert!(
            max < 1e-6,
            "{name}: {n}[{a}..{b}] gradient should be ~0, max {max}"
        );
    }

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
    let init: HashMap<String, Tensor> = m.hf_tensors().into_iter().collect();
    let mut got_losses = Vec::new();
    for s in 0..steps {
        m.zero_grads();
        let loss = m.loss_and_backward(&fixture_batch(&f, s)).unwrap();
        got_losses.push(loss);
        opt.step(lr, &mut m).unwrap();
    }
    let decay: Vec<String> = opt
        .param_groups()
        .into_iter()
        .filter(|(_, d)| *d)
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(decay, strings(&f.params["decay"]), "{name}: decay groups");
    assert_close(
        &format!("{name} losses"),
        &got_losses,
        losses.data(),
        TRAJ_LOSS_ATOL,
        0.0,
    );
    let mut worst_final = (0.0f32, String::new());
    for (n, p) in m.hf_tensors() {
        let want = f.t(&format!("final.{n}"));
        let (mut got, mut exp) = (p.data().to_vec(), want.data().to_vec());
        if let Some(&(a, b)) = noise.get(&n) {
            // noise-driven in both implementations: only bound how far it moved
            let moved = p.data()[a..b]
                .iter()
                .zip(&init[&n].data()[a..b])
                .fold(0.0f32, |w, (x, y)| w.max((x - y).abs()));
            assert!(
                moved <= 1.5 * lr as f32 * steps as f32,
                "{name}: {n} key bias moved {moved}"
            );
            got.drain(a..b);
            exp.drain(a..b);
        }
        assert_close(
            &format!("{name} final.{n}"),
            &got,
            &exp,
            TRAJ_PARAM_ATOL,
            0.0,
        );
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
fn gpt2_loss_gradients_and_adamw_trajectory_equal_pytorch() {
    check_against_pytorch("gpt2");
}

#[test]
fn llama_loss_gradients_and_adamw_trajectory_equal_pytorch() {
    check_against_pytorch("llama");
}

/// `load_hf` on the model-family fixtures written by `save_pretrained` (different
/// vocabularies, n_positions, GQA): the first batch row (all 9 tokens real) gives the
/// logits transformers computed.
#[test]
fn load_hf_reads_transformers_folders() {
    for name in ["gpt2", "llama_gqa"] {
        let m = DecoderLm::load_hf(&fixture_dir(&["models", name])).unwrap();
        let f = fixture(&format!("models/{name}"), "reference");
        let (shape, ids) = f.ints("input_ids");
        let t = shape[1];
        let row: Vec<usize> = ids[..t].iter().map(|&x| x as usize).collect();
        let got = m.forward_logits(&row, 1, t).unwrap();
        let want = f.t("logits");
        let v = want.shape()[2];
        assert_close(
            &format!("{name} logits"),
            got.data(),
            &want.data()[..t * v],
            1e-4,
            1e-3,
        );
    }
    // linear RoPE scaling is not something the trainable model has
    let err = DecoderLm::load_hf(&fixture_dir(&["models", "llama_mqa_tied"]))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("rope_scaling") && err.contains("linear"),
        "{err}"
    );
    let err = DecoderLm::load_hf(&fixture_dir(&["models", "bert"]))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("BertModel"), "{err}");
}

// ------------------------------------------------------------------------------------
// finite differences
// ------------------------------------------------------------------------------------

/// Tiny shapes: V = 11, C = 8, H = 2, F = 12, 2 layers, max_len 6; B = 2, T = 5.
fn tiny(position: PositionKind, norm: NormKind, pre_norm: bool, ffn: FfnKind) -> LmConfig {
    LmConfig {
        vocab: 11,
        d_model: 8,
        n_layers: 2,
        n_heads: 2,
        n_kv_heads: 2,
        ffn_dim: 12,
        max_len: 6,
        position,
        norm,
        pre_norm,
        ffn,
        bias: true,
        tie_embeddings: false,
    }
}

/// Every position kind, norm kind, FFN kind, pre- and post-norm, with and without
/// biases, tied and untied, MHA / GQA / MQA, fused (GPT-2 tree) and split projections.
fn variants() -> Vec<(&'static str, LmConfig)> {
    let ln = NormKind::LayerNorm { eps: 1e-5 };
    let rms = NormKind::RmsNorm { eps: 1e-6 };
    let rope = PositionKind::Rope { theta: 100.0 };
    let mut gpt2 = LmConfig::gpt2_style(11, 8, 2, 2, 6);
    gpt2.ffn_dim = 12;
    let mut llama = LmConfig::llama_style(11, 8, 2, 4, 2, 6);
    llama.ffn_dim = 12;
    let mut none_post = tiny(PositionKind::None, ln, false, FfnKind::Relu);
    none_post.tie_embeddings = true;
    let mut sin = tiny(PositionKind::Sinusoidal, rms, true, FfnKind::Gelu);
    sin.bias = false;
    let mut alibi = tiny(PositionKind::Alibi, ln, false, FfnKind::SwiGlu);
    alibi.n_heads = 4;
    alibi.n_kv_heads = 1;
    alibi.bias = false;
    let learned_post = tiny(PositionKind::Learned, rms, false, FfnKind::GeluTanh);
    let rope_ln = tiny(rope, ln, true, FfnKind::Gelu);
    vec![
        ("gpt2_style", gpt2),
        ("llama_style_gqa", llama),
        ("none_postnorm_layernorm_relu_tied", none_post),
        ("sinusoidal_rmsnorm_gelu_nobias", sin),
        ("alibi_postnorm_layernorm_nobias_swiglu_mqa", alibi),
        ("learned_postnorm_rmsnorm_gelutanh", learned_post),
        ("rope_prenorm_layernorm_gelu", rope_ln),
    ]
}

const B: usize = 2;
const T: usize = 5;

fn tiny_inputs(seed: u64, vocab: usize) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    (0..B * T).map(|_| rng.below(vocab)).collect()
}

/// Central differences of `f` (the model's loss for the current contents of parameter
/// `name`) for every element of that parameter, compared with `analytic`.
///
/// An element is first checked with step `h`; one that fails is retried with h/10 and
/// h/100, where the tolerance grows as the rounding noise does (∝ 1/h): a ReLU whose
/// pre-activation lies within h of its kink makes the central difference average the
/// two one-sided slopes, and a smaller step no longer crosses the kink. Returns how
/// many elements needed a retry.
fn check_param(
    what: &str,
    m: &DecoderLm,
    name: &str,
    analytic: &[f32],
    h: f32,
    (atol, rtol): (f64, f64),
    mut f: impl FnMut(&DecoderLm) -> f64,
) -> (usize, f64) {
    let values = params_of(m).into_iter().find(|(n, _)| n == name).unwrap().1;
    let mut probe = m.clone();
    let mut x = values.clone();
    let (mut retried, mut worst) = (0, 0.0f64);
    for i in 0..x.len() {
        let mut last = String::new();
        let ok = [1.0f32, 0.1, 0.01].iter().enumerate().any(|(k, &s)| {
            let step = h * s;
            let mut eval = |v: f32, x: &mut Vec<f32>| {
                x[i] = v;
                set_param(&mut probe, name, x);
                (f(&probe), x[i])
            };
            let (up, x_up) = eval(values[i] + step, &mut x);
            let (down, x_down) = eval(values[i] - step, &mut x);
            x[i] = values[i];
            let numeric = (up - down) / (x_up as f64 - x_down as f64);
            let result = compare(what, &analytic[i..i + 1], &[numeric], atol / s as f64, rtol);
            if k == 0 && result.is_ok() {
                worst = worst.max((analytic[i] as f64 - numeric).abs());
            }
            if k > 0 && result.is_ok() {
                retried += 1;
                if std::env::var_os("QKV_FD_VERBOSE").is_some() {
                    eprintln!(
                        "{what} {name}[{i}] passed at h = {step}: analytic {} numeric {numeric}",
                        analytic[i]
                    );
                }
            }
            last = format!(
                "{} (element {i}, h = {step})",
                result.err().unwrap_or_default()
            );
            last.len() <= 30
        });
        assert!(ok, "{what}: {name}: {last}");
    }
    (retried, worst)
}

/// Every element of every parameter of every variant: d(Σ logits ∘ R)/dθ by central
/// differences (f32 forward, f64 probe sum) against `backward_from_logits(R)`.
///
/// Weights: matrices σ = 0.3, norms and biases 1 or 0 ± 0.2, embeddings σ ≈ 1 (a stream
/// of O(1) entries keeps the norms' curvature, ∝ 1/σ³, moderate). Gradients are then
/// O(0.1..20). Tolerance, measured and reasoned: the probe sum of B·T·V = 110 logits
/// is known to ~4e-6 in f32 (errors of ~1e-3 at h = 2e-3 are pure rounding), so with
/// h = 5e-3 rounding adds ≤ 4e-4; truncation h²/6·f‴ stays below ~5e-4 (worst measured
/// error over all variants ≈ 1.2e-3 absolute on a gradient of 0.42). atol 2e-3 +
/// rtol 1e-2 is below any missing or wrong term, which would be O(0.1) or more.
#[test]
fn finite_differences_every_parameter_of_every_variant() {
    let mut report = Vec::new();
    for (vi, (label, cfg)) in variants().into_iter().enumerate() {
        // seeds chosen so that no ReLU pre-activation sits within a step of its kink
        let vi = vi as u64 + 10;
        let m = fd_model(&cfg, 100 + vi);
        let ids = tiny_inputs(300 + vi, cfg.vocab);
        let r = Rng::new(400 + vi).tensor(&[B, T, cfg.vocab], 1.0);
        let mut m = m;
        m.zero_grads();
        m.backward_from_logits(&ids, B, T, &r).unwrap();
        let (mut count, mut retried, mut worst) = (0, 0, 0.0f64);
        for (name, g) in grads_of(&m) {
            let (r, w) = check_param(label, &m, &name, &g, 5e-3, (2e-3, 1e-2), |p| {
                probe_loss(p.forward_logits(&ids, B, T).unwrap().data(), r.data())
            });
            retried += r;
            worst = worst.max(w);
            count += g.len();
        }
        assert_eq!(count, m.num_params());
        // only a ReLU has kinks; smooth variants must pass at the first step everywhere,
        // and a kink may excuse at most 1% of a ReLU model's elements
        if cfg.ffn != FfnKind::Relu {
            assert_eq!(retried, 0, "{label}: smooth model needed smaller steps");
        } else {
            assert!(
                retried * 100 <= count,
                "{label}: {retried} of {count} elements retried"
            );
        }
        report.push(format!(
            "{label}: {count} elements, worst |analytic − numeric| {worst:.1e} ({retried} retried)"
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// A tiny model with weights far from the initialisation (see the test above).
fn fd_model(cfg: &LmConfig, seed: u64) -> DecoderLm {
    let mut m = DecoderLm::new(cfg, seed).unwrap();
    perturb(&mut m, seed + 1000, 0.3, 0.2);
    let mut rng = Rng::new(seed + 2000);
    m.visit_mut(&mut |n, p, _| {
        if ["wte", "wpe", "embed"].iter().any(|s| n.contains(s)) {
            for x in p.data_mut() {
                *x += rng.normal() as f32;
            }
        }
    });
    m
}

/// The composed path through the real loss: cross-entropy with ignored targets and
/// the tied head. The loss is an f32 mean (≈ 3, rounding ~3e-7), so with h = 5e-3 the
/// quotient carries ≤ 1e-4 of rounding and ~1e-4 of truncation (the mean divides the
/// curvature by the 8 scored tokens): atol 5e-4, rtol 1e-2.
#[test]
fn finite_differences_through_cross_entropy() {
    let (_, cfg) = variants().remove(0);
    let mut m = fd_model(&cfg, 7);
    let ids = tiny_inputs(9, cfg.vocab);
    let mut targets: Vec<i64> = tiny_inputs(10, cfg.vocab)
        .iter()
        .map(|&x| x as i64)
        .collect();
    targets[3] = -100;
    targets[7] = -100;
    let batch = Batch {
        inputs: ids,
        targets,
        batch: B,
        len: T,
        source: None,
    };
    m.zero_grads();
    m.loss_and_backward(&batch).unwrap();
    for (name, g) in grads_of(&m) {
        let (retried, _) = check_param("cross-entropy", &m, &name, &g, 5e-3, (5e-4, 1e-2), |p| {
            p.loss(&batch).unwrap() as f64
        });
        assert_eq!(retried, 0, "{name}");
    }
}

/// The reference and tiled attention kernels give the same gradients through the
/// whole model (ALiBi and MQA included).
#[test]
fn reference_and_tiled_kernels_agree() {
    for (label, cfg) in variants() {
        let mut m = DecoderLm::new(&cfg, 11).unwrap();
        perturb(&mut m, 12, 0.3, 0.2);
        let ids = tiny_inputs(13, cfg.vocab);
        let r = Rng::new(14).tensor(&[B, T, cfg.vocab], 1.0);
        let mut grads = Vec::new();
        for kernel in [Kernel::Reference, Kernel::Tiled] {
            m.kernel = kernel;
            m.zero_grads();
            m.backward_from_logits(&ids, B, T, &r).unwrap();
            grads.push(grads_of(&m));
        }
        for ((n, a), (_, b)) in grads[0].iter().zip(&grads[1]) {
            assert_close(&format!("{label}: {n}"), a, b, 1e-5, 1e-4);
        }
    }
}

// ------------------------------------------------------------------------------------
// construction, batches, init
// ------------------------------------------------------------------------------------

#[test]
fn init_is_gpt2s_and_seeded() {
    let cfg = LmConfig::gpt2_style(50, 64, 4, 4, 32);
    let m = DecoderLm::new(&cfg, 1).unwrap();
    let again = DecoderLm::new(&cfg, 1).unwrap();
    assert_eq!(params_of(&m), params_of(&again));
    let other = DecoderLm::new(&cfg, 2).unwrap();
    assert_ne!(params_of(&m), params_of(&other));
    let std = |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
    for (name, v) in params_of(&m) {
        let s = std(&v);
        if name.ends_with("ln_1.weight")
            || name.ends_with("ln_2.weight")
            || name.ends_with("ln_f.weight")
        {
            assert!(v.iter().all(|&x| x == 1.0), "{name}");
        } else if name.ends_with(".bias") {
            assert!(v.iter().all(|&x| x == 0.0), "{name}");
        } else if name.ends_with("c_proj.weight") {
            // residual projections: 0.02 / √(2·4)
            assert!(
                (s / (0.02 / 8f32.sqrt()) - 1.0).abs() < 0.05,
                "{name}: std {s}"
            );
        } else {
            assert!((s / 0.02 - 1.0).abs() < 0.05, "{name}: std {s}");
        }
    }
    // 50·64 wte + 32·64 wpe + 4·(12·64² + 13·64) + 2·64 ln_f
    assert_eq!(
        m.num_params(),
        50 * 64 + 32 * 64 + 4 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    );
}

#[test]
fn bad_batches_are_clear_errors() {
    let mut m = DecoderLm::new(&LmConfig::gpt2_style(11, 8, 1, 2, 4), 0).unwrap();
    let batch = |inputs: Vec<usize>, targets: Vec<i64>, b, t| Batch {
        inputs,
        targets,
        batch: b,
        len: t,
        source: None,
    };
    let err = |m: &mut DecoderLm, b: Batch| m.loss_and_backward(&b).unwrap_err().to_string();
    let e = err(&mut m, batch(vec![1; 5], vec![1; 6], 2, 3));
    assert!(e.contains("inputs"), "{e}");
    let e = err(&mut m, batch(vec![1; 6], vec![1; 5], 2, 3));
    assert!(e.contains("targets"), "{e}");
    let e = err(&mut m, batch(vec![1; 10], vec![1; 10], 2, 5));
    assert!(e.contains("max_len"), "{e}");
    let e = err(&mut m, batch(vec![11, 1], vec![1, 1], 1, 2));
    assert!(e.contains("11"), "{e}");
    let e = err(&mut m, batch(vec![1, 1], vec![1, 11], 1, 2));
    assert!(e.contains("target"), "{e}");
    let e = err(&mut m, batch(vec![], vec![], 0, 3));
    assert!(e.contains("empty"), "{e}");
    // RoPE has no table: any length runs
    let mut l = DecoderLm::new(&LmConfig::llama_style(11, 8, 1, 2, 1, 4), 0).unwrap();
    l.loss_and_backward(&batch(vec![1; 9], vec![2; 9], 1, 9))
        .unwrap();
}

// ------------------------------------------------------------------------------------
// save and load
// ------------------------------------------------------------------------------------

fn save_styles() -> Vec<(&'static str, LmConfig)> {
    let mut gpt2_untied = LmConfig::gpt2_style(40, 16, 2, 2, 12);
    gpt2_untied.tie_embeddings = false;
    gpt2_untied.ffn = FfnKind::Gelu;
    let mut llama_tied_bias = LmConfig::llama_style(40, 16, 2, 4, 1, 12);
    llama_tied_bias.tie_embeddings = true;
    llama_tied_bias.bias = true;
    llama_tied_bias.position = PositionKind::Rope { theta: 500.0 };
    vec![
        ("gpt2", LmConfig::gpt2_style(40, 16, 2, 2, 12)),
        ("gpt2_untied_gelu", gpt2_untied),
        ("llama", LmConfig::llama_style(40, 16, 2, 4, 2, 12)),
        ("llama_tied_bias_mqa", llama_tied_bias),
    ]
}

fn trained_like(cfg: &LmConfig, seed: u64) -> DecoderLm {
    let mut m = DecoderLm::new(cfg, seed).unwrap();
    perturb(&mut m, seed + 1, 0.2, 0.1);
    m
}

fn causal_logits(dir: &Path, ids: &[usize], b: usize, t: usize) -> Tensor {
    let loaded = models::load(dir).unwrap();
    let Model::Causal(lm) = loaded.model else {
        panic!("{} is not a causal LM", dir.display())
    };
    let tokens = TokenBatch::new(ids.to_vec(), None, b, t).unwrap();
    lm.forward_cached(&tokens, &mut lm.new_cache(b)).unwrap()
}

/// GPT-2 and Llama styles save as Hugging Face folders that `qkv::models::load` (the
/// inference families) runs with the same logits, and that load back exactly.
#[test]
fn saved_hf_folders_load_in_the_inference_families() {
    for (i, (label, cfg)) in save_styles().into_iter().enumerate() {
        let m = trained_like(&cfg, 50 + i as u64);
        let dir = scratch(label);
        TrainableModel::save(&m, &dir).unwrap();
        let (b, t) = (2, 7);
        let ids = tiny_inputs(60 + i as u64, cfg.vocab)
            .into_iter()
            .chain(tiny_inputs(61, cfg.vocab))
            .take(b * t)
            .collect::<Vec<_>>();
        let ours = m.forward_logits(&ids, b, t).unwrap();
        let theirs = causal_logits(&dir, &ids, b, t);
        assert_close(
            &format!("{label}: models::load logits"),
            theirs.data(),
            ours.data(),
            1e-5,
            1e-4,
        );
        let back = DecoderLm::load(&dir).unwrap();
        assert_eq!(back.config(), m.config(), "{label}");
        assert_eq!(
            params_of(&back),
            params_of(&m),
            "{label}: parameters round trip"
        );
        // the Hugging Face folder has exactly the checkpoint names
        let file = qkv::io::TensorFile::open(dir.join("model.safetensors")).unwrap();
        let mut names: Vec<String> = m.hf_tensors().into_iter().map(|(n, _)| n).collect();
        names.sort();
        assert_eq!(file.names().unwrap(), names, "{label}");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let arch = config["architectures"][0].as_str().unwrap();
        assert_eq!(
            arch,
            if label.starts_with("gpt2") {
                "GPT2LMHeadModel"
            } else {
                "LlamaForCausalLM"
            }
        );
    }
}

/// Architectures no Hugging Face family has are saved as qkv's own folder and load
/// back exactly (ids as loaded from an HF config are kept too).
#[test]
fn qkv_native_folders_round_trip() {
    for (label, cfg) in variants().into_iter().skip(2) {
        let m = trained_like(&cfg, 70);
        let dir = scratch(&format!("native-{label}"));
        m.save(&dir).unwrap();
        let back = DecoderLm::load(&dir).unwrap();
        assert_eq!(back.config(), &cfg, "{label}");
        assert_eq!(params_of(&back), params_of(&m), "{label}");
        let ids = tiny_inputs(71, cfg.vocab);
        assert_eq!(
            back.forward_logits(&ids, B, T).unwrap(),
            m.forward_logits(&ids, B, T).unwrap(),
            "{label}"
        );
        assert!(
            models::load(&dir).is_err(),
            "{label}: not an inference family"
        );
    }
    // special ids survive a load/save cycle
    let m = DecoderLm::load_hf(&fixture_dir(&["train_model", "gpt2"])).unwrap();
    let dir = scratch("special-ids");
    m.save(&dir).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (
            config["bos_token_id"].as_u64(),
            config["eos_token_id"].as_u64()
        ),
        (Some(1), Some(2))
    );
}

/// The Python side of the save check: `transformers` loads folders saved by qkv and
/// computes the same logits. Needs the fixture venv (`.venv-ref`, see
/// tools/fixtures/README.md); run with
/// `cargo test -p qkv --test train_model -- --ignored transformers`.
#[test]
#[ignore = "needs the Python fixture environment (.venv-ref with torch and transformers)"]
fn transformers_loads_saved_folders() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("QKV_REF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-ref/bin/python"));
    assert!(
        python.exists(),
        "no Python at {} (set QKV_REF_PYTHON)",
        python.display()
    );
    let mut dirs = Vec::new();
    for (i, (label, cfg)) in save_styles().into_iter().enumerate() {
        let m = trained_like(&cfg, 80 + i as u64);
        let dir = scratch(&format!("transformers-{label}"));
        m.save(&dir).unwrap();
        let (b, t) = (2, 9);
        let ids: Vec<usize> = (0..b * t).map(|k| (k * 7 + i) % cfg.vocab).collect();
        let logits = m.forward_logits(&ids, b, t).unwrap();
        let ids_t = Tensor::new(&[b, t], ids.iter().map(|&x| x as f32).collect()).unwrap();
        qkv::io::save(
            &dir.join("qkv_check.safetensors"),
            &[("input_ids", &ids_t), ("logits", &logits)],
            None,
        )
        .unwrap();
        dirs.push(dir);
    }
    let out = std::process::Command::new(&python)
        .arg(root.join("tools/fixtures/check_saved.py"))
        .args(&dirs)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "check_saved.py failed:\n{text}");
}
