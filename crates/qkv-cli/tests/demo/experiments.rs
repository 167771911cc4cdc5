//! The quick experiments as `qkv demo` runs them (`qkv experiment NAME --quick` runs the
//! same code; tests/experiment.rs runs the command): each keeps the JSON contract,
//! writes its figures, and its verdict is the one the measurement gives here.

use serde_json::Value;

use super::experiment_checks::{attribution_verdict, check_contract, precision_types};
use super::report;

/// The demo's report of experiment `name`, its contract checked.
fn experiment(name: &str) -> &'static Value {
    let doc = &report()["experiments"][name];
    let page = std::path::Path::new(report()["report"].as_str().unwrap());
    check_contract(doc, name, page.parent().unwrap());
    doc
}

#[test]
fn long_range_recurrent_memories_forget_and_attention_does_not() {
    let report = experiment("long_range");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    // a fair race: the four models' sizes are within 10% of each other
    let sizes: Vec<f64> = report["metrics"]["models"]
        .as_object()
        .unwrap()
        .values()
        .map(|m| m["parameters"].as_f64().unwrap())
        .collect();
    let (small, large) = sizes
        .iter()
        .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
    assert!(large <= 1.1 * small, "{sizes:?}");
    // the gradient through the fresh RNN falls by orders of magnitude over the probe…
    let norms = report["metrics"]["rnn_input_gradient"]["norm_by_distance"]
        .as_array()
        .unwrap();
    let (near, far) = (
        norms[0].as_f64().unwrap(),
        norms[norms.len() - 1].as_f64().unwrap(),
    );
    assert!(far < near * 1e-6, "{near} → {far}");
    // through the Transformer it does not: attention's path to every input is one step
    let norms = report["metrics"]["transformer_input_gradient"]["norm_by_distance"]
        .as_array()
        .unwrap();
    let (t_near, t_far) = (
        norms[0].as_f64().unwrap(),
        norms[norms.len() - 1].as_f64().unwrap(),
    );
    assert!(t_far > t_near * 1e-3, "{t_near} → {t_far}");
}

#[test]
fn parallel_reference_attention_memory_grows_as_n_squared_and_tiled_as_n() {
    let report = experiment("parallel");
    // Timings are reported, never asserted (a benchmark is not a test); the extra
    // memory, counted by the binary's allocator, is deterministic for a thread count.
    let slopes = &report["metrics"]["memory_log_log_slope"];
    let (reference, tiled) = (
        slopes["reference"].as_f64().unwrap(),
        slopes["tiled"].as_f64().unwrap(),
    );
    assert!(
        (1.7..=2.3).contains(&reference),
        "reference memory slope {reference}"
    );
    assert!((0.7..=1.3).contains(&tiled), "tiled memory slope {tiled}");
    for layer in ["rnn", "attention (reference)", "attention (tiled)"] {
        let times = report["metrics"]["layers"][layer]["seconds_2_threads"]
            .as_array()
            .unwrap();
        assert!(
            times.iter().all(|t| t["seconds"].as_f64().unwrap() > 0.0),
            "{layer}"
        );
    }
}

#[test]
fn scaling_without_the_square_root_saturates_softmax() {
    let report = experiment("scaling");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    let probe = report["metrics"]["probe"].as_array().unwrap();
    let row = |scaled: bool, d: u64| {
        probe
            .iter()
            .find(|r| r["scaled"] == scaled && r["d_k"] == d)
            .unwrap()
    };
    // near one-hot without the scale, spread over the 16 keys with it
    assert!(row(false, 1024)["largest_weight"].as_f64().unwrap() > 0.9);
    assert!(row(true, 1024)["entropy"].as_f64().unwrap() > 2.0);
    // both small models are trained and evaluated
    for t in report["metrics"]["training"].as_array().unwrap() {
        assert!(t["held_out_accuracy"].as_f64().is_some(), "{t}");
    }
}

#[test]
fn mask_without_it_training_cheats_and_generation_fails() {
    let report = experiment("mask");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    let models = report["metrics"]["models"].as_array().unwrap();
    let (masked, unmasked) = (&models[0], &models[1]);
    assert_eq!(masked["model"], "causal mask");
    // causality exactly: later tokens leave earlier logits bit for bit unchanged
    assert_eq!(
        masked["max_logit_change_at_or_before_t"].as_f64(),
        Some(0.0)
    );
    assert!(
        unmasked["max_logit_change_at_or_before_t"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

#[test]
fn order_without_positions_is_no_better_than_a_bag_of_symbols() {
    let report = experiment("order");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    let m = &report["metrics"];
    let acc = |e: &str| m["encodings"][e]["held_out_accuracy"].as_f64().unwrap();
    let bag = m["order_blind_best"].as_f64().unwrap();
    assert!(acc("none") <= bag + 0.05, "{} against {bag}", acc("none"));
    assert!(acc("learned") >= 0.95 && acc("sinusoidal") >= 0.95, "{m:#}");
}

#[test]
fn positions_sinusoids_shift_linearly_and_rope_scores_are_relative() {
    let report = experiment("positions");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    let m = &report["metrics"];
    assert!(m["rope_relative_shift_deviation"].as_f64().unwrap() <= 1e-4);
    // every encoding is trained and evaluated at each length
    let acc = m["extrapolation"]["accuracy"].as_object().unwrap();
    assert_eq!(acc.len(), 5);
    assert!(acc.values().all(|v| v.as_array().unwrap().len() == 3));
}

#[test]
fn cross_attention_finds_the_aligned_source_word() {
    let report = experiment("cross");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    let m = &report["metrics"];
    assert!(
        m["held_out_token_accuracy"].as_f64().unwrap() >= 0.9,
        "{m:#}"
    );
    let best = m["aligned_by_layer"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(best >= 0.8, "{m:#}");
    // the figures are maps: a panel per layer (captioned "layer L (…% aligned)"),
    // then a panel per head of the best layer
    for (i, caption, panels) in [(0, "\nlayer ", 2), (1, "\nhead ", 4)] {
        let svg = std::fs::read_to_string(report["figures"][i].as_str().unwrap()).unwrap();
        assert_eq!(svg.matches(caption).count(), panels, "figure {i}");
    }
}

#[test]
fn heads_several_heads_learn_five_relations_one_head_does_not() {
    let report = experiment("heads");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    let models = report["metrics"]["models"].as_array().unwrap();
    let acc = |i: usize| models[i]["held_out_accuracy"].as_f64().unwrap();
    assert!(acc(0) < 0.8 && acc(2) >= 0.9, "{models:#?}");
    // the same parameters, split differently
    assert_eq!(models[0]["parameters"], models[2]["parameters"]);
    // the four heads share the five offsets out: each leans on its own
    let by_head = models[2]["mean_weight_by_offset_and_head"]
        .as_array()
        .unwrap();
    let mut favourite: Vec<usize> = by_head
        .iter()
        .map(|h| {
            let w: Vec<f64> = h
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            (0..w.len()).max_by(|&a, &b| w[a].total_cmp(&w[b])).unwrap()
        })
        .collect();
    favourite.sort();
    favourite.dedup();
    assert!(favourite.len() >= 3, "{by_head:?}");
}

#[test]
fn precision_reduced_types_attend_where_f32_does_on_the_trained_decoder() {
    let report = experiment("precision");
    assert_eq!(report["verdict"], "supported", "{report:#}");
    assert!(report["metrics"]["held_out_accuracy"].as_f64().unwrap() >= 0.99);
    let types = precision_types(report, 0);
    let worst = |i: usize| types[i].1["worst_head_js_bits"].as_f64().unwrap();
    // bf16 keeps 8 significant bits of every weight; int8 about 7 of a block's largest
    assert!(worst(0) < worst(1), "{types:#?}");
    for (name, t) in &types {
        assert!(t["clear_rows"].as_u64().unwrap() > 0, "{name}");
        assert!(
            t["clear_top_key_agreement"].as_f64().unwrap() >= 0.99,
            "{name}: {t:#}"
        );
        assert!(
            t["output_min_cosine"].as_f64().unwrap() > 0.999,
            "{name}: {t:#}"
        );
    }
    // the figures: one line plot per model, then one heatmap row of the four types
    assert_eq!(report["figures"].as_array().unwrap().len(), 2);
}

#[test]
fn attribution_compares_each_method_with_ablation_on_the_recall_decoder() {
    let report = experiment("attribution");
    let m = &report["metrics"]["recall_decoder"];
    assert_eq!(m["rows"], 24);
    // the trained decoder uses what the task says it must: hiding the pair's value
    // moves its answer most in most rows (0.83 of them here)
    assert!(
        m["ablation_puts_the_answer_first"].as_f64().unwrap() >= 0.5,
        "{m:#}"
    );
    let rho = m["mean_spearman_with_ablation"].as_object().unwrap();
    assert_eq!(rho.len(), 5);
    assert!(rho
        .values()
        .all(|r| (-1.0..=1.0).contains(&r.as_f64().unwrap())));
    assert_eq!(report["metrics"]["decided_on"], "the recall decoder");
    assert_eq!(report["verdict"], attribution_verdict(rho));
    let best = report["metrics"]["best_method"].as_str().unwrap();
    let top = rho
        .iter()
        .max_by(|a, b| a.1.as_f64().unwrap().total_cmp(&b.1.as_f64().unwrap()));
    assert_eq!(best, top.unwrap().0);
}
