//! AdamW, gradient clipping and learning-rate schedules against PyTorch
//! (`tools/fixtures/gen_optim.py` → `tests/fixtures/optim/`).
//!
//! Tolerance: parameters agree to atol 1e-6 + rtol 1e-5 after every one of 10 steps.
//! The update is elementwise f32 arithmetic in torch's order of operations with the
//! same f32-rounded scalars, so what remains is the rounding of a few operations torch
//! evaluates with fused multiply-adds (`lerp`) or in a different association — a few
//! ulp of a value of order 1 per step, far below 1e-6 over 10 steps.

#![cfg(feature = "models")]

mod common;

use common::{assert_close, fixture, Fixture};
use qkv::train::optim::{
    clip_coefficient, clip_grad_norm, grad_norm, AdamW, AdamWConfig, DecayRule, NamedParam,
};
use qkv::train::schedule::Schedule;
use qkv::Tensor;

const ATOL: f32 = 1e-6;
const RTOL: f32 = 1e-5;

fn names(f: &Fixture) -> Vec<String> {
    f.params["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Slice `s` of a `[steps, ...]` tensor, as a tensor of the remaining shape.
fn at(t: &Tensor, s: usize) -> Tensor {
    let inner: usize = t.shape()[1..].iter().product();
    Tensor::new(
        &t.shape()[1..],
        t.data()[s * inner..(s + 1) * inner].to_vec(),
    )
    .unwrap()
}

fn initial(f: &Fixture) -> Vec<NamedParam> {
    names(f)
        .iter()
        .map(|n| NamedParam::new(n.clone(), f.t(&format!("{n}.init"))))
        .collect()
}

fn set_grads(f: &Fixture, params: &mut [NamedParam], s: usize) {
    for p in params.iter_mut() {
        p.grad = at(&f.t(&format!("{}.grads", p.name)), s);
    }
}

/// Replays steps `from..to` of the fixture on `params`, checking every step.
fn replay(
    f: &Fixture,
    opt: &mut AdamW,
    sched: &Schedule,
    params: &mut [NamedParam],
    from: usize,
    to: usize,
) {
    let (lr_ref, clip_max, clip_norm) = (f.t("lr"), f.t("clip_max"), f.t("clip_norm"));
    for s in from..to {
        set_grads(f, params, s);
        let lr = sched.lr(opt.step_count());
        assert_close(
            &format!("{} lr of step {s}", f.name),
            &[lr as f32],
            &lr_ref.data()[s..s + 1],
            0.0,
            1e-6,
        );
        let max = clip_max.data()[s];
        let norm = opt
            .step_clipped(lr, (max > 0.0).then_some(max as f64), params)
            .unwrap();
        if max > 0.0 {
            assert_close(
                &format!("{} clip norm of step {s}", f.name),
                &[norm],
                &clip_norm.data()[s..s + 1],
                0.0,
                1e-6,
            );
        }
        for p in params.iter() {
            let want = at(&f.t(&format!("{}.after", p.name)), s);
            let worst = p
                .value
                .data()
                .iter()
                .zip(want.data())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            if s + 1 == to {
                eprintln!(
                    "{} {}: max |diff| after step {s}: {worst:e}",
                    f.name, p.name
                );
            }
            assert_close(
                &format!("{} {} after step {s}", f.name, p.name),
                p.value.data(),
                want.data(),
                ATOL,
                RTOL,
            );
        }
    }
}

fn check_state(f: &Fixture, opt: &AdamW) {
    let state = opt.state_tensors();
    assert_eq!(state.len(), 2 * names(f).len());
    for (name, t) in state {
        // moments of order 1e-12 (the tiny-gradient parameter) need the relative term
        assert_close(
            &format!("{} {name}", f.name),
            t.data(),
            f.t(&name).data(),
            1e-7,
            1e-5,
        );
    }
}

fn custom() -> (Fixture, AdamWConfig, Schedule) {
    let f = fixture("optim", "adamw");
    let p = &f.params;
    let config = AdamWConfig {
        beta1: p["betas"][0].as_f64().unwrap(),
        beta2: p["betas"][1].as_f64().unwrap(),
        eps: p["eps"].as_f64().unwrap(),
        weight_decay: p["weight_decay"].as_f64().unwrap(),
        decay: DecayRule::Standard,
    };
    let lr = p["lr"].as_f64().unwrap();
    let sched = Schedule::warmup_cosine(
        lr,
        p["warmup"].as_u64().unwrap(),
        p["total"].as_u64().unwrap(),
        lr * p["min_lr_rate"].as_f64().unwrap(),
    );
    (f, config, sched)
}

#[test]
fn adamw_matches_torch_with_decay_groups_schedule_and_clipping() {
    let (f, config, sched) = custom();
    let mut params = initial(&f);
    let mut opt = AdamW::new(config);
    replay(&f, &mut opt, &sched, &mut params, 0, 10);
    assert_eq!(opt.step_count(), 10);
    // the default rule put exactly torch's decay group under weight decay
    let decayed: Vec<&str> = opt
        .param_groups()
        .into_iter()
        .filter(|(_, d)| *d)
        .map(|(n, _)| n)
        .collect();
    let want: Vec<&str> = f.params["decay"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(decayed, want);
    check_state(&f, &opt);
}

#[test]
fn adamw_defaults_match_torch() {
    let f = fixture("optim", "adamw_defaults");
    let config = AdamWConfig {
        decay: DecayRule::All, // torch.optim.AdamW(model.parameters()) decays everything
        ..AdamWConfig::default()
    };
    assert_eq!(config.beta1, f.params["betas"][0].as_f64().unwrap());
    assert_eq!(config.beta2, f.params["betas"][1].as_f64().unwrap());
    assert_eq!(config.eps, f.params["eps"].as_f64().unwrap());
    assert_eq!(
        config.weight_decay,
        f.params["weight_decay"].as_f64().unwrap()
    );
    let mut params = initial(&f);
    let mut opt = AdamW::new(config);
    replay(
        &f,
        &mut opt,
        &Schedule::constant(f.params["lr"].as_f64().unwrap()),
        &mut params,
        0,
        10,
    );
    check_state(&f, &opt);
}

#[test]
fn saved_state_resumes_exactly() {
    let (f, config, sched) = custom();
    let mut params = initial(&f);
    let mut opt = AdamW::new(config.clone());
    replay(&f, &mut opt, &sched, &mut params, 0, 4);
    let saved: Vec<(String, Tensor)> = opt
        .state_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let step = opt.step_count();
    let mut uninterrupted = params.clone();
    replay(&f, &mut opt, &sched, &mut uninterrupted, 4, 10);

    let mut resumed = AdamW::new(config);
    resumed.load_state(step, saved, &mut params[..]).unwrap();
    assert_eq!(resumed.step_count(), 4);
    replay(&f, &mut resumed, &sched, &mut params, 4, 10);
    for (a, b) in params.iter().zip(&uninterrupted) {
        assert_eq!(a.value, b.value, "{} differs after resuming", a.name);
    }
}

#[test]
fn load_state_rejects_mismatched_state() {
    let (f, config, _) = custom();
    let mut params = initial(&f);
    let mut opt = AdamW::new(config.clone());
    set_grads(&f, &mut params, 0);
    opt.step(0.01, &mut params[..]).unwrap();
    let saved: Vec<(String, Tensor)> = opt
        .state_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let load = |state: Vec<(String, Tensor)>, params: &mut [NamedParam]| {
        AdamW::new(config.clone())
            .load_state(1, state, params)
            .unwrap_err()
            .to_string()
    };

    let missing: Vec<_> = saved
        .iter()
        .filter(|(n, _)| n != "wte.weight.exp_avg_sq")
        .cloned()
        .collect();
    let e = load(missing, &mut params);
    assert!(e.contains("missing `wte.weight.exp_avg_sq`"), "{e}");

    let mut extra = saved.clone();
    extra.push(("lm_head.weight.exp_avg".into(), Tensor::zeros(&[2])));
    extra.push(("lm_head.weight.exp_avg_sq".into(), Tensor::zeros(&[2])));
    let e = load(extra, &mut params);
    assert!(e.contains("`lm_head.weight`"), "{e}");

    let mut wrong = saved.clone();
    wrong[0].1 = Tensor::zeros(&[5, 7]);
    let e = load(wrong, &mut params);
    assert!(
        e.contains("blocks.0.attn.weight.exp_avg") && e.contains("[7, 5]"),
        "{e}"
    );

    let mut odd = saved.clone();
    odd.push((
        "blocks.0.attn.weight.momentum".into(),
        Tensor::zeros(&[7, 5]),
    ));
    let e = load(odd, &mut params);
    assert!(e.contains("momentum"), "{e}");

    let e = load(saved.clone(), &mut params[1..]);
    assert!(e.contains("`blocks.0.attn.weight`"), "{e}");
}

#[test]
fn non_finite_gradient_is_named_and_changes_nothing() {
    let (f, config, _) = custom();
    let mut params = initial(&f);
    set_grads(&f, &mut params, 0);
    params[2].grad.data_mut()[4] = f32::NEG_INFINITY;
    let before = params.clone();
    let mut opt = AdamW::new(config);
    let e = opt
        .step_clipped(0.01, Some(1.0), &mut params[..])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("wte.weight (gradient)") && e.contains("index 4"),
        "{e}"
    );
    let e = opt.step(0.01, &mut params[..]).unwrap_err().to_string();
    assert!(e.contains("wte.weight (gradient)"), "{e}");
    assert_eq!(opt.step_count(), 0);
    assert!(opt.state_tensors().is_empty());
    for (a, b) in params.iter().zip(&before) {
        assert_eq!(a.value, b.value);
    }
}

#[test]
fn clip_grad_norm_matches_torch() {
    let f = fixture("optim", "clip");
    let names = names(&f);
    let (max_norms, totals) = (f.t("max_norm"), f.t("total_norm"));
    for k in 0..f.param_usize("cases").unwrap() {
        let mut grads: Vec<Tensor> = names.iter().map(|n| f.t(&format!("{n}.grad"))).collect();
        let mut named: Vec<(&str, &mut Tensor)> = names
            .iter()
            .map(String::as_str)
            .zip(grads.iter_mut())
            .collect();
        let max = max_norms.data()[k] as f64;
        let total = clip_grad_norm(&mut named, max).unwrap();
        assert_close(
            &format!("total norm, case {k}"),
            &[total],
            &totals.data()[k..k + 1],
            0.0,
            1e-6,
        );
        for (n, g) in names.iter().zip(&grads) {
            assert_close(
                &format!("{n} clipped to {max}"),
                g.data(),
                f.t(&format!("{n}.clipped{k}")).data(),
                1e-7,
                1e-6,
            );
        }
        // the visitor path: norm, then the coefficient applied while reading
        let mut params: Vec<NamedParam> = names
            .iter()
            .map(|n| {
                let g = f.t(&format!("{n}.grad"));
                NamedParam {
                    name: n.clone(),
                    value: Tensor::zeros(g.shape()),
                    grad: g,
                }
            })
            .collect();
        assert_eq!(grad_norm(&mut params[..]).unwrap(), total);
        let coef = clip_coefficient(total, max).unwrap();
        for p in &params {
            let scaled: Vec<f32> = p.grad.data().iter().map(|x| x * coef).collect();
            assert_close(
                &format!("{} scaled by the coefficient, case {k}", p.name),
                &scaled,
                f.t(&format!("{}.clipped{k}", p.name)).data(),
                1e-7,
                1e-6,
            );
        }
    }
}

#[test]
fn schedules_match_transformers() {
    let f = fixture("optim", "schedule");
    for name in ["cosine", "cosine_min", "cosine_nowarmup"] {
        let c = &f.params[name];
        let lr = c["lr"].as_f64().unwrap();
        let total = c["total"].as_u64().unwrap();
        let s = Schedule::warmup_cosine(
            lr,
            c["warmup"].as_u64().unwrap(),
            total,
            lr * c["min_lr_rate"].as_f64().unwrap(),
        );
        s.validate().unwrap();
        let ours: Vec<f32> = (0..=total).map(|t| s.lr(t) as f32).collect();
        // stored as f32: agreement to f32 rounding
        assert_close(name, &ours, f.t(name).data(), 1e-12, 1e-6);
        assert_eq!(s.lr(total + 5), s.lr(total), "{name}: flat after the end");
    }
}
