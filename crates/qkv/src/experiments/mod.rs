//! Experiments that measure the articles' claims (`../shared/seeds/`): each trains or
//! probes real models here, reports its numbers, the data of one figure, and a verdict
//! computed from those numbers by a rule the experiment states. Plotting and printing
//! are the caller's (the `qkv experiment` command); this module only measures.

pub mod cross;
pub mod heads;
pub mod long_range;
pub mod mask;
pub mod order;
pub mod parallel;
pub mod positions;
pub mod scaling;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::models::Position;
use crate::position::SinusoidalLayout;
use crate::rng::Rng;
use crate::train::trainable::{Batch, TrainableModel};
use crate::train::trainer::{BatchSource, RunOptions, TrainConfig, Trainer};

/// Every experiment, by the name `qkv experiment NAME` takes.
pub const NAMES: [&str; 8] = [
    "long_range",
    "parallel",
    "scaling",
    "mask",
    "order",
    "positions",
    "cross",
    "heads",
];

/// How an experiment runs.
#[derive(Clone, Copy, Default)]
pub struct Options<'a> {
    /// The small version: at most about two minutes on two cores.
    pub quick: bool,
    /// Seed of the data and of every model's initial weights.
    pub seed: u64,
    /// The process's allocation counter, for experiments that measure memory; the
    /// library cannot count allocations itself (the global allocator is the program's).
    pub memory: Option<&'a dyn MemoryProbe>,
}

/// A program's count of the bytes it has allocated.
pub trait MemoryProbe: Sync {
    /// Starts a new peak at the bytes allocated now, and returns them.
    fn reset_peak(&self) -> usize;
    /// The most bytes allocated at once since the last reset.
    fn peak(&self) -> usize;
}

/// What a measurement says about the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "supported")]
    Supported,
    #[serde(rename = "not supported")]
    NotSupported,
    #[serde(rename = "inconclusive")]
    Inconclusive,
}

/// One line of a figure: (x, y) points.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// The data of one figure.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Figure {
    Lines(Lines),
    Heatmaps(Heatmaps),
}

/// Line plots sharing axes.
#[derive(Clone, Debug, Serialize)]
pub struct Lines {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Base-2 logarithmic x axis.
    pub log_x: bool,
    /// Base-10 logarithmic y axis.
    pub log_y: bool,
    pub series: Vec<Series>,
}

impl From<Lines> for Figure {
    fn from(lines: Lines) -> Self {
        Figure::Lines(lines)
    }
}

/// Heatmaps side by side over the same labelled rows and columns, such as the
/// attention weights of several heads: `panels[p].values[row][column]`, row 0 on top.
#[derive(Clone, Debug, Serialize)]
pub struct Heatmaps {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub columns: Vec<String>,
    pub rows: Vec<String>,
    pub panels: Vec<Panel>,
}

impl From<Heatmaps> for Figure {
    fn from(maps: Heatmaps) -> Self {
        Figure::Heatmaps(maps)
    }
}

/// One heatmap: `values[row][column]`, each in [0, 1].
#[derive(Clone, Debug, Serialize)]
pub struct Panel {
    pub label: String,
    pub values: Vec<Vec<f64>>,
}

/// A claim of the articles: the sentence quoted in Chinese, and an English gloss.
#[derive(Clone, Debug, Serialize)]
pub struct Claim {
    pub zh: &'static str,
    pub en: &'static str,
}

/// An experiment's result.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub name: &'static str,
    pub claim: Claim,
    pub verdict: Verdict,
    /// The rule that turned the metrics into the verdict, in words.
    pub rule: String,
    pub metrics: serde_json::Value,
    /// One or more figures; the first is the experiment's main picture.
    pub figures: Vec<Figure>,
}

/// Runs the experiment called `name`; `progress` receives a line per finished unit of
/// work (a model trained, a probe done).
pub fn run(name: &str, options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    match name {
        "long_range" => long_range::run(options, progress),
        "parallel" => parallel::run(options, progress),
        "scaling" => scaling::run(options, progress),
        "mask" => mask::run(options, progress),
        "order" => order::run(options, progress),
        "positions" => positions::run(options, progress),
        "cross" => cross::run(options, progress),
        "heads" => heads::run(options, progress),
        _ => Err(Error::invalid(
            "experiment",
            format!("unknown experiment `{name}`; known: {}", NAMES.join(", ")),
        )),
    }
}

/// An experiment's own synthetic task: `draw(batch_size, rng)` makes a batch of rows of
/// `len` tokens. Held-out batches come from `seed ^ salt`, a different stream per task.
struct Drawn {
    batch_size: usize,
    len: usize,
    salt: u64,
    draw: fn(usize, &mut Rng) -> Batch,
}

impl BatchSource for Drawn {
    fn train_batch(&mut self, _step: u64, rng: &mut Rng) -> Result<Batch> {
        Ok((self.draw)(self.batch_size, rng))
    }

    fn eval_batches(&self, seed: u64, count: u64) -> Result<Vec<Batch>> {
        let mut rng = Rng::new(seed ^ self.salt);
        Ok((0..count)
            .map(|_| (self.draw)(self.batch_size, &mut rng))
            .collect())
    }

    fn tokens_per_batch(&self) -> usize {
        self.batch_size * self.len
    }

    fn check(&self, _vocab: usize, _max_positions: Option<usize>, _steps: u64) -> Result<()> {
        Ok(())
    }
}

/// Trains `model` on `data` for `steps` steps with the one recipe every experiment
/// uses (AdamW at 3e-3, 20 warm-up steps, cosine decay to 3e-4, clipping at 1), with
/// no evaluation during the run; returns the training loss of every step.
fn train(
    model: &mut dyn TrainableModel,
    data: &mut dyn BatchSource,
    steps: u64,
    seed: u64,
) -> Result<Vec<f64>> {
    let config = TrainConfig {
        steps,
        lr: 3e-3,
        warmup: 20,
        min_lr: 3e-4,
        clip: Some(1.0),
        eval_every: 0,
        seed,
        ..TrainConfig::default()
    };
    let mut losses = Vec::new();
    let mut trainer = Trainer::new(model, config, serde_json::Value::Null)?;
    trainer.run(data, &[], RunOptions::default(), &mut |log| {
        losses.push(log.loss as f64)
    })?;
    Ok(losses)
}

/// The position encoding called `name` (none, sinusoidal, learned, rope, alibi) for
/// sequences of up to `max_len` tokens.
fn position(name: &str, max_len: usize) -> Position {
    match name {
        "sinusoidal" => Position::Sinusoidal {
            max_len,
            layout: SinusoidalLayout::Interleaved,
        },
        "learned" => Position::Learned { max_len },
        "rope" => Position::Rope {
            theta: 10_000.0,
            scaling: crate::position::RopeScaling::None,
            max_len: Some(max_len),
        },
        "alibi" => Position::Alibi,
        _ => Position::None,
    }
}
