//! The decoder the experiment trains: associative recall. A row lists PAIRS key–value
//! pairs (distinct keys of KEYS symbols, values of VALUES symbols), then asks for every
//! key again in another order, each followed by its value; the row ends on the last
//! key asked. The model answers each asked key's value (PAIRS supervised positions per
//! row, which trains far faster than one). The key and value the last answer needs are
//! known, and each held-out row is one text to explain.

use super::super::training::{self, Drawn};
use crate::error::Result;
use crate::models::{Arch, Transformer};
use crate::rng::Rng;
use crate::train::tasks::{distinct, IGNORE_INDEX};
use crate::train::trainable::Batch;
use crate::train::trainer::{evaluate, BatchSource};

pub(super) const KEYS: usize = 8;
const VALUES: usize = 8;
pub(super) const PAIRS: usize = 4;
/// The pairs, then PAIRS − 1 asked keys with their values, then the last asked key.
pub(super) const LENGTH: usize = 4 * PAIRS - 1;
pub(super) const WIDTH: usize = 64;
pub(super) const LAYERS: usize = 2;
pub(super) const HEADS: usize = 4;

/// Rows of `k₁ v₁ … k_P v_P q₁ a₁ … q_P`, keys 0..KEYS, values KEYS..KEYS+VALUES, the
/// q a shuffle of the keys; the target at each q is its value.
fn recall(batch_size: usize, rng: &mut Rng) -> Batch {
    let n = batch_size * LENGTH;
    let (mut inputs, mut targets) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..batch_size {
        let keys = distinct(rng, KEYS, PAIRS);
        let values: Vec<usize> = (0..PAIRS).map(|_| KEYS + rng.below(VALUES)).collect();
        for (k, v) in keys.iter().zip(&values) {
            inputs.extend([*k, *v]);
            targets.extend([IGNORE_INDEX; 2]);
        }
        for (i, asked) in distinct(rng, PAIRS, PAIRS).into_iter().enumerate() {
            inputs.push(keys[asked]);
            targets.push(values[asked] as i64);
            if i + 1 < PAIRS {
                inputs.push(values[asked]);
                targets.push(IGNORE_INDEX);
            }
        }
    }
    Batch::rows(inputs, targets, batch_size, LENGTH)
}

/// A decoder trained for `steps` steps on the task, its held-out accuracy, and
/// `rows` held-out rows (their ids).
pub(super) fn trained(
    seed: u64,
    steps: u64,
    rows: usize,
) -> Result<(Transformer, f64, Vec<Vec<usize>>)> {
    let mut data = Drawn {
        batch_size: 32,
        len: LENGTH,
        salt: 0x7265_6361_6c6c,
        draw: recall,
    };
    let arch = Arch::gpt2(KEYS + VALUES, WIDTH, LAYERS, HEADS, LENGTH);
    let mut model = Transformer::new(&arch, seed)?;
    training::train(&mut model, &mut data, steps, seed)?;
    let eval = data.eval_batches(seed, 4)?;
    let accuracy = evaluate(&model, &eval)?.accuracy;
    let held_out = eval
        .iter()
        .flat_map(|b| b.inputs.chunks_exact(LENGTH).map(<[usize]>::to_vec))
        .take(rows)
        .collect();
    Ok((model, accuracy, held_out))
}

/// The position of the value the last key asks for in `row`, among the pairs.
pub(super) fn answer_position(row: &[usize]) -> usize {
    let asked = row[LENGTH - 1];
    (0..PAIRS)
        .map(|p| 2 * p)
        .find(|&p| row[p] == asked)
        .map_or(0, |p| p + 1)
}

/// Readable labels of a row: `k3` and `v5` for the pairs' keys and values, `q3` and `a5`
/// for the keys asked again and their answers.
pub(super) fn labels(row: &[usize]) -> Vec<String> {
    row.iter()
        .enumerate()
        .map(|(i, &x)| {
            let (kind, n) = match x < KEYS {
                true => ("k", x),
                false => ("v", x - KEYS),
            };
            match (i < 2 * PAIRS, kind) {
                (true, _) => format!("{kind}{n}"),
                (false, "k") => format!("q{n}"),
                (false, _) => format!("a{n}"),
            }
        })
        .collect()
}
