//! **order**: self-attention alone does not know word order; position encodings give it.
//!
//! A two-layer bidirectional Transformer (an encoder with a language-model head) learns
//! to reverse 8 symbols in place: position i must output the symbol at position 7 − i.
//! Without positions every position computes the same function of its own symbol and
//! of the bag of all symbols, so it cannot tell which symbol is its mirror. The same
//! model trains with no encoding, sinusoidal, learned, RoPE and ALiBi positions. An
//! encoder is used because a causal mask alone already tells positions apart (position
//! t sees t + 1 tokens), which would hide what the claim is about.

use serde_json::json;

use super::report::{Claim, Lines, Options, Report, Series, Verdict};
use super::training::{self, Drawn};
use crate::error::Result;
use crate::models::{Arch, Transformer};
use crate::rng::Rng;
use crate::train::trainable::Batch;
use crate::train::trainer::{evaluate, BatchSource};

const CLAIM: Claim = Claim {
    zh: "更严格地说，标准 Self-Attention 对输入具有置换等变性：如果把输入矩阵的行顺序打乱，输出矩阵的行也会以相同方式被重新排列，但每个位置对应的计算规则本身并不知道原始顺序。",
    en: "More precisely, standard self-attention is permutation-equivariant: shuffle the rows of the input and the rows of the output are shuffled the same way, but the rule each position computes does not know the original order.",
};

const LENGTH: usize = 8;
const SYMBOLS: usize = 10;
const ENCODINGS: [&str; 5] = ["none", "sinusoidal", "learned", "rope", "alibi"];

/// The task's batch source: batches of 32 rows.
fn task() -> Drawn {
    Drawn {
        batch_size: 32,
        len: LENGTH,
        salt: 0x6f72_6465,
        draw: mirror,
    }
}

/// Rows of LENGTH random symbols; every position's target is the symbol mirrored.
fn mirror(batch_size: usize, rng: &mut Rng) -> Batch {
    let mut inputs = Vec::with_capacity(batch_size * LENGTH);
    let mut targets = Vec::with_capacity(batch_size * LENGTH);
    for _ in 0..batch_size {
        let row: Vec<usize> = (0..LENGTH).map(|_| rng.below(SYMBOLS)).collect();
        targets.extend(row.iter().rev().map(|&s| s as i64));
        inputs.extend(row);
    }
    Batch::rows(inputs, targets, batch_size, LENGTH)
}

/// The best accuracy without any order: a position that knows only its own symbol and
/// the bag of the row's symbols sees its mirror as any of the other LENGTH − 1
/// positions alike, so it can do no better than answer the commonest of their symbols.
fn bag_accuracy(batches: &[Batch]) -> f64 {
    let (mut expected, mut positions) = (0.0, 0usize);
    for b in batches {
        for (row, want) in b
            .inputs
            .chunks_exact(LENGTH)
            .zip(b.targets.chunks_exact(LENGTH))
        {
            for (i, &w) in want.iter().enumerate() {
                let mut counts = [0usize; SYMBOLS];
                for (j, &s) in row.iter().enumerate() {
                    if j != i {
                        counts[s] += 1;
                    }
                }
                let top = *counts.iter().max().expect("symbols");
                // a tie among the commonest symbols is broken at random
                if counts[w as usize] == top {
                    expected += 1.0 / counts.iter().filter(|&&c| c == top).count() as f64;
                }
                positions += 1;
            }
        }
    }
    expected / positions as f64
}

/// Trains the encoder with `encoding`; returns (losses, held-out token accuracy).
fn train(encoding: &str, steps: u64, seed: u64) -> Result<(Vec<f64>, f64)> {
    let mut arch = Arch::gpt2(SYMBOLS, 64, 2, 4, LENGTH);
    arch.encoder = arch.decoder.take();
    arch.position = training::position(encoding, LENGTH);
    // the original Transformer scales its token embeddings by √C before adding the
    // sinusoids (whose entries are ±1); without it the small initial embeddings drown
    arch.embed.scale = encoding == "sinusoidal";
    let mut model = Transformer::new(&arch, seed)?;
    let mut data = task();
    let eval = data.eval_batches(seed, 8)?;
    let losses = training::train(&mut model, &mut data, steps, seed)?;
    Ok((losses, evaluate(&model, &eval)?.accuracy))
}

pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let steps = if options.quick { 400 } else { 1500 };
    let mut results = serde_json::Map::new();
    let mut accuracy = Vec::new();
    let mut curves = Vec::new();
    for encoding in ENCODINGS {
        let (losses, acc) = train(encoding, steps, options.seed)?;
        progress(&format!(
            "positions {encoding}: held-out token accuracy {acc:.3}"
        ));
        results.insert(
            encoding.to_string(),
            json!({"held_out_accuracy": acc, "final_loss": losses.last()}),
        );
        accuracy.push((encoding, acc));
        curves.push(Series {
            label: encoding.to_string(),
            points: losses
                .iter()
                .enumerate()
                .map(|(i, &l)| ((i + 1) as f64, l.max(1e-6)))
                .collect(),
        });
    }
    let chance = 1.0 / SYMBOLS as f64;
    let bag = bag_accuracy(&task().eval_batches(options.seed, 8)?);
    let none = accuracy[0].1;
    let encoded: Vec<f64> = accuracy[1..].iter().map(|&(_, a)| a).collect();
    let verdict = if none <= bag + 0.05 && encoded.iter().any(|&a| a >= 0.95) {
        Verdict::Supported
    } else if none >= 0.9 {
        Verdict::NotSupported
    } else {
        Verdict::Inconclusive
    };
    let rule = format!(
        "supported when the encoder without positions does no better than 0.05 above the best order-blind answer (the commonest other symbol of the row: {bag:.3} on the same held-out rows) while at least one encoding reaches 0.95; not supported when it reaches 0.9 without positions; inconclusive otherwise"
    );
    Ok(Report {
        name: "order",
        claim: CLAIM,
        verdict,
        rule,
        metrics: json!({
            "task": format!("mirror {LENGTH} symbols of {SYMBOLS} in place, two-layer encoder"),
            "steps": steps,
            "chance": chance,
            "order_blind_best": bag,
            "encodings": results,
        }),
        figures: vec![Lines {
            title: "Reversing in place, by position encoding".into(),
            x_label: "step".into(),
            y_label: "training loss".into(),
            log_x: false,
            log_y: true,
            series: curves,
        }
        .into()],
    })
}
