//! **attribution**: do attention weights show what a model uses?
//!
//! The articles read a map of attention weights as the explanation: reading "it", the
//! model looks at "animal". Ablation answers what the model uses: hide one key from
//! every attention and measure how much the target moves. Each method (the raw
//! weights, value norms, rollout, flow, gradient × attention) credits the keys of a
//! text for the target; Spearman's ρ between that credit and ablation's, averaged over
//! texts, says how well the method tracks what the model uses.
//!
//! The texts: held-out rows of a decoder qkv trains here on associative recall (the
//! target: its prediction's log-probability), and, for each sentence-transformers
//! folder given (`--model`, all-MiniLM-L6-v2), sixteen sentences each compared with
//! another (the target: their cosine), plus the articles' sentence, where each method
//! says whether "it" points at "animal" or at "street".

mod measure;
mod recall;
mod sentences;

use serde_json::json;

use super::report::{Claim, Heatmaps, Options, Panel, Report, Verdict};
use crate::error::Result;
use crate::models::explain::Target;
use crate::models::{Input, TokenBatch};
use measure::{agreement, Agreement, COMPARED};

const CLAIM: Claim = Claim {
    zh: "先用 Query 和 Key 算出“应该关注哪里”，再用这些权重对 Value 做加权求和。……我们自然会把 “it” 理解为 “animal”，而不是 “street”。",
    en: "Attention weights say where the model looks (reading \"it\", at \"animal\"); do they show what it uses?",
};

/// Within this much of the best method's mean ρ, weights explain as well as any.
const MARGIN: f64 = 0.1;
/// The mean ρ from which a method is said to track ablation.
const TRACKS: f64 = 0.5;

/// Mean ρ and top-key agreement of each compared method over `texts`.
fn summary(texts: &[Agreement]) -> (Vec<f64>, Vec<f64>) {
    let n = texts.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Agreement, usize) -> f64| -> Vec<f64> {
        (0..COMPARED.len())
            .map(|m| texts.iter().map(|a| f(a, m)).sum::<f64>() / n)
            .collect()
    };
    (
        mean(&|a, m| a.rho[m]),
        mean(&|a, m| f64::from(u8::from(a.same_top[m]))),
    )
}

fn by_method(values: &[f64]) -> serde_json::Value {
    COMPARED
        .iter()
        .zip(values)
        .map(|(m, v)| (m.name().to_string(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Each method's row of credit (ablation last) scaled to its largest value, negative
/// credit shown as 0: one heatmap, methods as rows.
fn figure(title: String, tokens: Vec<String>, credit: &[Vec<f32>]) -> Heatmaps {
    let rows: Vec<String> = COMPARED
        .iter()
        .map(|m| m.name().to_string())
        .chain(["ablation".to_string()])
        .collect();
    let values = credit
        .iter()
        .map(|row| {
            let top = row.iter().fold(1e-12f32, |m, &x| m.max(x)) as f64;
            row.iter().map(|&x| (x as f64).max(0.0) / top).collect()
        })
        .collect();
    Heatmaps {
        title,
        x_label: "key token".into(),
        y_label: "method".into(),
        columns: tokens,
        rows,
        panels: vec![Panel {
            label: "each row scaled to its largest credit; negative credit shown as 0".into(),
            values,
        }],
    }
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let (steps, rows) = if options.quick {
        (2000, 24)
    } else {
        (6000, 128)
    };
    let (decoder, accuracy, held_out) = recall::trained(options.seed, steps, rows)?;
    progress(&format!("recall decoder: held-out accuracy {accuracy:.3}"));
    let mut texts = Vec::new();
    let mut answer_first = 0usize;
    for row in &held_out {
        let batch = TokenBatch::single(row.clone())?;
        let input = Input {
            target: Some(&batch),
            ..Default::default()
        };
        let a = agreement(&decoder, &input, &Target::NextToken(None))?;
        let truth = a.scores.last().expect("ablation's scores");
        let top = (0..truth.len()).fold(0, |b, i| if truth[i] > truth[b] { i } else { b });
        answer_first += usize::from(top == recall::answer_position(row));
        texts.push(a);
    }
    let (dec_rho, dec_top) = summary(&texts);
    progress(&format!("recall decoder: {} rows explained", texts.len()));
    let example = &held_out[0];
    let mut figures = vec![figure(
        "The recall decoder's last answer: each method's credit".into(),
        recall::labels(example),
        &texts[0].scores,
    )
    .into()];

    let mut models = Vec::new();
    let mut deciding = (dec_rho.clone(), "the recall decoder".to_string());
    for (i, dir) in options.checkpoints.iter().enumerate() {
        let s = sentences::measure(dir, progress)?;
        let (rho, top) = summary(&s.texts);
        let it = &s.it;
        let points: serde_json::Map<_, _> = COMPARED
            .iter()
            .map(|m| m.name())
            .chain(["ablation"])
            .zip(&it.credit)
            .map(|(m, c)| {
                let at = if c[it.animal] > c[it.street] {
                    "animal"
                } else {
                    "street"
                };
                (
                    m.to_string(),
                    json!({"points_at": at, "animal": c[it.animal], "street": c[it.street]}),
                )
            })
            .collect();
        figures.insert(
            i,
            figure(
                format!(
                    "Where \"it\" points, by method ({}, the articles' sentence)",
                    s.name
                ),
                it.tokens.clone(),
                &it.credit,
            )
            .into(),
        );
        if i == 0 {
            deciding = (rho.clone(), s.name.clone());
        }
        models.push(json!({
            "model": s.name,
            "texts": s.texts.len(),
            "mean_spearman_with_ablation": by_method(&rho),
            "same_top_key_as_ablation": by_method(&top),
            "it_in_the_articles_sentence": points,
        }));
    }

    let (rho, on) = deciding;
    let best = (0..COMPARED.len())
        .max_by(|&a, &b| rho[a].total_cmp(&rho[b]))
        .expect("methods");
    let weights = rho[0];
    let verdict = if rho[best] - weights >= MARGIN {
        Verdict::NotSupported
    } else if weights >= TRACKS {
        Verdict::Supported
    } else {
        Verdict::Inconclusive
    };
    let rule = format!(
        "ablation (the target minus the target with one key hidden from every attention) is what the model uses; each method's credit for the target is compared with it by Spearman's ρ over a text's keys, averaged over texts, on the first sentence encoder given with --model, else on the recall decoder. The claim that raw attention weights (the last layer's, heads averaged) show what the model uses is not supported when another method's mean ρ exceeds theirs by {MARGIN} or more; supported when theirs is at least {TRACKS} and within {MARGIN} of the best; inconclusive otherwise"
    );
    Ok(Report {
        name: "attribution",
        claim: CLAIM,
        verdict,
        rule,
        metrics: json!({
            "decided_on": on,
            "best_method": COMPARED[best].name(),
            "recall_decoder": {
                "task": format!("associative recall: {} key–value pairs of {} keys, then a key; GPT-2-style decoder, {} layers × {} heads, d_model {}", recall::PAIRS, recall::KEYS, recall::LAYERS, recall::HEADS, recall::WIDTH),
                "steps": steps,
                "held_out_accuracy": accuracy,
                "rows": texts.len(),
                "ablation_puts_the_answer_first": answer_first as f64 / texts.len() as f64,
                "mean_spearman_with_ablation": by_method(&dec_rho),
                "same_top_key_as_ablation": by_method(&dec_top),
            },
            "sentence_encoders": models,
            "articles_sentence": sentences::ANIMAL,
            "sentence_pairs": if options.checkpoints.is_empty() { json!([]) } else { json!(sentences::PAIRS) },
        }),
        figures,
    })
}
