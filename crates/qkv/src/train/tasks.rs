//! Built-in synthetic tasks that cannot be solved without attention, as next-token
//! prediction batches for a decoder-only model.
//!
//! Every example is a token sequence `s` of `T + 1` tokens; the model reads
//! `inputs = s[0..T]` and position `t` is trained to predict `targets[t] = s[t + 1]`
//! — or nothing, [`IGNORE_INDEX`] (−100), where the next token is not determined by the
//! sequence so far (the random source part). Only the answer is scored. Inputs are
//! teacher-forced, so a row whose scored positions are all predicted correctly (see
//! [`exact_match`]) is also produced by greedy generation from the prompt.
//!
//! | task | tokens | `T` | scored positions |
//! |---|---|---|---|
//! | `copy` | symbols `0..n`, separator `n` | `2·length` | `length` |
//! | `reverse` | symbols `0..n`, separator `n` | `2·length` | `length` |
//! | `sort` | symbols `0..n`, separator `n` | `2·length` | `length` |
//! | `recall` | keys `0..n`, values `n..2n`, separator `2n` | `2·(length + queries)` | `queries` |
//! | `long_range` | symbols `0..n` | `length` | `length − distance + 1` |
//!
//! (`n` = `symbols`.) Each task's doc comment on [`TaskKind`] shows an example.

use std::fmt;

use crate::error::{Error, Result};
use crate::rng::Rng;

pub use crate::train::loss::IGNORE_INDEX;
pub use crate::train::trainable::{Batch, Source};

/// The six tasks. `n` is `symbols`; examples use the tokens of the default layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// `length` random symbols, the separator, then the same symbols again.
    /// length 3, n = 10 (separator 10): `s = 3 1 4 | 10 | 3 1 4` →
    /// inputs `3 1 4 10 3 1`, targets `−100 −100 −100 3 1 4`.
    Copy,
    /// As `copy`, but the answer is the source reversed.
    /// `s = 3 1 4 10 4 1 3` → inputs `3 1 4 10 4 1`, targets `−100 −100 −100 4 1 3`.
    Reverse,
    /// As `copy`, but the answer is the source sorted ascending (repeats kept).
    /// `s = 3 1 3 10 1 3 3` → inputs `3 1 3 10 1 3`, targets `−100 −100 −100 1 3 3`.
    Sort,
    /// Associative recall: `length` key–value pairs with distinct keys (tokens `0..n`)
    /// and random values (tokens `n..2n`), the separator `2n`, then `queries` times a
    /// key from the pairs followed by its value; each query position is scored with
    /// the value. length 2, queries 1, n = 4 (values 4..8, separator 8):
    /// `s = 2 5 0 7 8 0 7` → inputs `2 5 0 7 8 0`, targets `−100 ×5, 7`.
    Recall,
    /// Long-range dependency: the first `distance` tokens are random symbols and every
    /// later token repeats the one `distance` positions before it, so `s[i] = s[i − d]`
    /// for `i ≥ d`. Every position whose next token is such a repeat is scored: the
    /// model must look `d − 1` positions back from `t` (to `s[t + 1 − d]`).
    /// length 7, distance 3: `s = 5 2 7 5 2 7 5 2` → inputs `5 2 7 5 2 7 5`,
    /// targets `−100 −100 5 2 7 5 2`.
    LongRange,
    /// The first token after `distance` distractors: a symbol, `distance` random
    /// symbols, the separator, then the first symbol again, the only scored token. The
    /// answer lies `distance + 1` positions back from where it is asked for.
    /// distance 3, n = 10: `s = 4 | 7 1 7 | 10 | 4` → inputs `4 7 1 7 10`,
    /// targets `−100 ×4, 4`.
    First,
}

impl TaskKind {
    /// Every task name, in the order [`Task::from_name`] lists them.
    pub const NAMES: [&'static str; 6] =
        ["copy", "reverse", "sort", "recall", "long_range", "first"];

    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Copy => "copy",
            TaskKind::Reverse => "reverse",
            TaskKind::Sort => "sort",
            TaskKind::Recall => "recall",
            TaskKind::LongRange => "long_range",
            TaskKind::First => "first",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "copy" => TaskKind::Copy,
            "reverse" => TaskKind::Reverse,
            "sort" => TaskKind::Sort,
            "recall" => TaskKind::Recall,
            "long_range" => TaskKind::LongRange,
            "first" => TaskKind::First,
            _ => return None,
        })
    }
}

/// Task options; `None` takes the task's default. An option the task does not use is
/// an error (e.g. `distance` for `copy`).
///
/// | option | copy / reverse / sort | recall | long_range | first |
/// |---|---|---|---|---|
/// | `length` | source length, default 8 | pairs, default 8 | `T`, default 32 | — |
/// | `symbols` | default 10 | keys = values, default 16 | default 10 | default 10 |
/// | `queries` | — | default 4 (≤ `length`) | — | — |
/// | `distance` | — | — | default 8 (2 ≤ d ≤ `length`) | distractors, default 8 (≥ 1) |
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskOptions {
    pub length: Option<usize>,
    pub symbols: Option<usize>,
    pub queries: Option<usize>,
    pub distance: Option<usize>,
}

/// A configured synthetic task. Built with [`Task::from_name`], which validates the
/// options, so sampling cannot fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    kind: TaskKind,
    length: usize,
    symbols: usize,
    queries: usize,
    distance: usize,
}

impl Task {
    /// The task called `name` with `options` (defaults for `None`). Errors on an
    /// unknown name (listing the known ones), an option the task does not take, or an
    /// option out of range.
    pub fn from_name(name: &str, options: &TaskOptions) -> Result<Task> {
        let kind = TaskKind::from_name(name).ok_or_else(|| {
            Error::invalid(
                "task",
                format!(
                    "unknown task `{name}`; known tasks: {}",
                    TaskKind::NAMES.join(", ")
                ),
            )
        })?;
        let forbid = |field: &str, v: Option<usize>| match v {
            Some(_) => Err(Error::invalid(
                field,
                format!("task `{name}` does not take this option"),
            )),
            None => Ok(()),
        };
        let at_least = |field: &str, v: usize, min: usize, why: &str| {
            if v >= min {
                Ok(v)
            } else {
                Err(Error::invalid(field, format!("{v} is below {min} ({why})")))
            }
        };
        let o = options;
        let task = match kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort => {
                forbid("queries", o.queries)?;
                forbid("distance", o.distance)?;
                Task {
                    kind,
                    length: at_least("length", o.length.unwrap_or(8), 1, "one source symbol")?,
                    symbols: at_least("symbols", o.symbols.unwrap_or(10), 2, "two symbols")?,
                    queries: 0,
                    distance: 0,
                }
            }
            TaskKind::Recall => {
                forbid("distance", o.distance)?;
                let length = at_least("length", o.length.unwrap_or(8), 1, "one key-value pair")?;
                let symbols = at_least(
                    "symbols",
                    o.symbols.unwrap_or(16.max(length)),
                    length.max(2),
                    "the keys of one example are distinct, so symbols ≥ length",
                )?;
                let queries = at_least(
                    "queries",
                    o.queries.unwrap_or(4.min(length)),
                    1,
                    "one query",
                )?;
                if queries > length {
                    return Err(Error::invalid(
                        "queries",
                        format!("{queries} is more than the {length} pairs (each query asks a distinct key)"),
                    ));
                }
                Task {
                    kind,
                    length,
                    symbols,
                    queries,
                    distance: 0,
                }
            }
            TaskKind::LongRange => {
                forbid("queries", o.queries)?;
                let distance = at_least(
                    "distance",
                    o.distance.unwrap_or(8),
                    2,
                    "distance 1 would only repeat the current token",
                )?;
                let length = o.length.unwrap_or(32.max(distance));
                if length < distance {
                    return Err(Error::invalid(
                        "length",
                        format!(
                            "{length} is shorter than distance {distance}: nothing would be scored"
                        ),
                    ));
                }
                Task {
                    kind,
                    length,
                    symbols: at_least("symbols", o.symbols.unwrap_or(10), 2, "two symbols")?,
                    queries: 0,
                    distance,
                }
            }
            TaskKind::First => {
                forbid("length", o.length)?;
                forbid("queries", o.queries)?;
                let distance = at_least("distance", o.distance.unwrap_or(8), 1, "one distractor")?;
                Task {
                    kind,
                    // the source: the first symbol and the distractors
                    length: distance + 1,
                    symbols: at_least("symbols", o.symbols.unwrap_or(10), 2, "two symbols")?,
                    queries: 0,
                    distance,
                }
            }
        };
        Ok(task)
    }

    pub fn kind(&self) -> TaskKind {
        self.kind
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The options with every value the task uses filled in (defaults resolved), to
    /// record in a checkpoint and rebuild the same task with [`Task::from_name`].
    pub fn options(&self) -> TaskOptions {
        let mut o = TaskOptions {
            length: Some(self.length),
            symbols: Some(self.symbols),
            ..Default::default()
        };
        match self.kind {
            TaskKind::Recall => o.queries = Some(self.queries),
            TaskKind::LongRange => o.distance = Some(self.distance),
            TaskKind::First => {
                o.length = None;
                o.distance = Some(self.distance);
            }
            _ => {}
        }
        o
    }

    /// Vocabulary size `V` a model needs: every token id is below it.
    pub fn vocab_size(&self) -> usize {
        match self.kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort | TaskKind::First => {
                self.symbols + 1
            }
            TaskKind::Recall => 2 * self.symbols + 1,
            TaskKind::LongRange => self.symbols,
        }
    }

    /// The separator token, for tasks that have one.
    pub fn separator(&self) -> Option<usize> {
        match self.kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort | TaskKind::First => {
                Some(self.symbols)
            }
            TaskKind::Recall => Some(2 * self.symbols),
            TaskKind::LongRange => None,
        }
    }

    /// Model input length `T` (every example has exactly this length).
    pub fn seq_len(&self) -> usize {
        match self.kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort => 2 * self.length,
            TaskKind::Recall => 2 * (self.length + self.queries),
            TaskKind::LongRange => self.length,
            TaskKind::First => self.length + 1,
        }
    }

    /// Scored targets per example.
    pub fn scored_per_example(&self) -> usize {
        match self.kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort => self.length,
            TaskKind::Recall => self.queries,
            TaskKind::LongRange => self.length - self.distance + 1,
            TaskKind::First => 1,
        }
    }

    /// One example `(inputs [T], targets [T])`, drawn from `rng`.
    pub fn example(&self, rng: &mut Rng) -> (Vec<usize>, Vec<i64>) {
        let mut s = Vec::with_capacity(self.seq_len() + 1);
        let mut targets = vec![IGNORE_INDEX; self.seq_len()];
        let n = self.symbols;
        match self.kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort => {
                let l = self.length;
                s.extend((0..l).map(|_| rng.below(n)));
                let mut answer = s.clone();
                match self.kind {
                    TaskKind::Reverse => answer.reverse(),
                    TaskKind::Sort => answer.sort_unstable(),
                    _ => {}
                }
                s.push(n);
                s.extend_from_slice(&answer);
                // s[l + 1 + i] = answer[i] is predicted at position l + i
                for (i, &a) in answer.iter().enumerate() {
                    targets[l + i] = a as i64;
                }
            }
            TaskKind::Recall => {
                let l = self.length;
                let keys = distinct(rng, n, l);
                let values: Vec<usize> = (0..l).map(|_| n + rng.below(n)).collect();
                for (&k, &v) in keys.iter().zip(&values) {
                    s.push(k);
                    s.push(v);
                }
                s.push(2 * n);
                // queries ask distinct pairs, in random order
                for (j, pair) in distinct(rng, l, self.queries).into_iter().enumerate() {
                    s.push(keys[pair]);
                    s.push(values[pair]);
                    // the query key sits at 2l + 1 + 2j; its value is the next token
                    targets[2 * l + 1 + 2 * j] = values[pair] as i64;
                }
            }
            TaskKind::LongRange => {
                let d = self.distance;
                s.extend((0..d).map(|_| rng.below(n)));
                for i in d..=self.length {
                    s.push(s[i - d]);
                }
                // the next token of position t is s[t + 1], a repeat when t + 1 ≥ d
                for t in d - 1..self.length {
                    targets[t] = s[t + 1] as i64;
                }
            }
            TaskKind::First => {
                s.extend((0..self.length).map(|_| rng.below(n)));
                s.push(n);
                s.push(s[0]);
                // asked for at the separator, position `length`
                targets[self.length] = s[0] as i64;
            }
        }
        debug_assert_eq!(s.len(), self.seq_len() + 1);
        s.pop();
        (s, targets)
    }

    /// `batch_size` examples drawn one after another from `rng`: the same seed gives
    /// the same batch.
    pub fn batch(&self, batch_size: usize, rng: &mut Rng) -> Batch {
        let t = self.seq_len();
        let mut inputs = Vec::with_capacity(batch_size * t);
        let mut targets = Vec::with_capacity(batch_size * t);
        for _ in 0..batch_size {
            let (x, y) = self.example(rng);
            inputs.extend_from_slice(&x);
            targets.extend_from_slice(&y);
        }
        Batch::rows(inputs, targets, batch_size, t)
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(length={}, symbols={}",
            self.name(),
            self.length,
            self.symbols
        )?;
        match self.kind {
            TaskKind::Recall => write!(f, ", queries={}", self.queries)?,
            TaskKind::LongRange | TaskKind::First => write!(f, ", distance={}", self.distance)?,
            _ => {}
        }
        write!(f, ")")
    }
}

/// `k` distinct values from `0..n` in random order (partial Fisher–Yates).
pub(crate) fn distinct(rng: &mut Rng, n: usize, k: usize) -> Vec<usize> {
    let mut pool: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let j = i + rng.below(n - i);
        pool.swap(i, j);
    }
    pool.truncate(k);
    pool
}

/// Correct predictions among scored positions; add counts over batches, then read
/// [`Accuracy::fraction`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accuracy {
    pub correct: usize,
    pub total: usize,
}

impl Accuracy {
    /// `correct / total`, or 0 when nothing was scored.
    pub fn fraction(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.correct as f64 / self.total as f64
        }
    }
}

impl std::ops::AddAssign for Accuracy {
    fn add_assign(&mut self, o: Accuracy) {
        self.correct += o.correct;
        self.total += o.total;
    }
}

fn check_lengths(predictions: &[usize], targets: &[i64]) -> Result<()> {
    if predictions.len() != targets.len() {
        return Err(Error::shape(
            "predictions",
            format!("[{}] like targets", targets.len()),
            &[predictions.len()],
        ));
    }
    Ok(())
}

/// Token accuracy: among positions whose target is not [`IGNORE_INDEX`], how many have
/// `predictions` (e.g. the argmax of the logits, `[B·T]`) equal to the target.
pub fn accuracy(predictions: &[usize], targets: &[i64]) -> Result<Accuracy> {
    check_lengths(predictions, targets)?;
    let mut acc = Accuracy::default();
    for (&p, &t) in predictions.iter().zip(targets) {
        if t != IGNORE_INDEX {
            acc.total += 1;
            acc.correct += usize::from(t >= 0 && p as i64 == t);
        }
    }
    Ok(acc)
}

/// Sequence accuracy: among rows of `seq_len` with at least one scored position, how
/// many have every scored position right.
pub fn exact_match(predictions: &[usize], targets: &[i64], seq_len: usize) -> Result<Accuracy> {
    check_lengths(predictions, targets)?;
    if seq_len == 0 || !targets.len().is_multiple_of(seq_len) {
        return Err(Error::invalid(
            "seq_len",
            format!("{seq_len} does not divide the {} targets", targets.len()),
        ));
    }
    let mut acc = Accuracy::default();
    for (p, t) in predictions.chunks(seq_len).zip(targets.chunks(seq_len)) {
        let row = accuracy(p, t)?;
        if row.total > 0 {
            acc.total += 1;
            acc.correct += usize::from(row.correct == row.total);
        }
    }
    Ok(acc)
}

/// A decoder-only task batch (prompt, separator, answer in one row, as
/// [`Task::batch`] makes them) as an encoder-decoder batch: each row is split
/// at its first `separator`, which must sit at the same position k in every row.
/// The source is `inputs[..k]` (no padding); the decoder reads `inputs[k..]`, the
/// separator as start token followed by the answer shifted right, and is scored on
/// `targets[k..]`. Errors if a row lacks the separator, rows disagree on k, or a
/// target before k is scored (it would be lost).
///
/// `reverse`, length 3: inputs `3 1 4 | 10 4 1`, targets `−100 ×3, 4 1 3` →
/// source `3 1 4`, decoder inputs `10 4 1`, targets `4 1 3`.
pub fn source_target_batch(batch: &Batch, separator: usize) -> Result<Batch> {
    let (b, t) = (batch.batch, batch.len);
    if b == 0 || t == 0 || batch.inputs.len() != b * t || batch.targets.len() != b * t {
        return Err(Error::invalid(
            "batch",
            format!("needs B, T ≥ 1 and B·T inputs and targets, got B = {b}, T = {t}"),
        ));
    }
    let mut k = None;
    for (r, row) in batch.inputs.chunks_exact(t).enumerate() {
        let at = row.iter().position(|&x| x == separator).ok_or_else(|| {
            Error::invalid(
                "separator",
                format!("row {r} has no separator token {separator}"),
            )
        })?;
        match k {
            None if at == 0 => {
                return Err(Error::invalid(
                    "separator",
                    "the separator opens row 0: the source would be empty",
                ))
            }
            None => k = Some(at),
            Some(k) if k != at => {
                return Err(Error::invalid(
                    "separator",
                    format!("row {r} has it at {at}, row 0 at {k}: rows need equal source lengths"),
                ))
            }
            _ => {}
        }
    }
    let k = k.expect("B ≥ 1");
    let mut source = Vec::with_capacity(b * k);
    let mut inputs = Vec::with_capacity(b * (t - k));
    let mut targets = Vec::with_capacity(b * (t - k));
    for (row, tgt) in batch
        .inputs
        .chunks_exact(t)
        .zip(batch.targets.chunks_exact(t))
    {
        if tgt[..k].iter().any(|&x| x != IGNORE_INDEX) {
            return Err(Error::invalid(
                "targets",
                "a target inside the source part is scored; it has no place in the decoder",
            ));
        }
        source.extend_from_slice(&row[..k]);
        inputs.extend_from_slice(&row[k..]);
        targets.extend_from_slice(&tgt[k..]);
    }
    Ok(Batch {
        inputs,
        targets,
        batch: b,
        len: t - k,
        mask: None,
        source: Some(Source {
            mask: vec![true; source.len()],
            ids: source,
            len: k,
        }),
    })
}
