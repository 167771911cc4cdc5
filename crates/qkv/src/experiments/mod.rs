//! Experiments that measure the articles' claims (`../shared/seeds/`): each trains or
//! probes real models here, reports its numbers, the data of one figure, and a verdict
//! computed from those numbers by a rule the experiment states. Plotting and printing
//! are the caller's (the `qkv experiment` command); this module only measures.

pub mod attribution;
pub mod cross;
pub mod heads;
pub mod long_range;
pub mod mask;
pub mod order;
pub mod parallel;
pub mod positions;
pub mod precision;
mod report;
pub mod scaling;
mod training;

pub use report::{
    Claim, Figure, Heatmaps, Lines, MemoryProbe, Options, Panel, Report, Series, Verdict,
};

use crate::error::{Error, Result};

/// Every experiment, by the name `qkv experiment NAME` takes.
pub const NAMES: [&str; 10] = [
    "long_range",
    "parallel",
    "scaling",
    "mask",
    "order",
    "positions",
    "cross",
    "heads",
    "precision",
    "attribution",
];

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
        "precision" => precision::run(options, progress),
        "attribution" => attribution::run(options, progress),
        _ => Err(Error::invalid(
            "experiment",
            format!("unknown experiment `{name}`; known: {}", NAMES.join(", ")),
        )),
    }
}
