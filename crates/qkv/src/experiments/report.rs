//! What an experiment is given and what it reports: its options, the claim it tests,
//! its numbers, its figures' data and the verdict its rule computed.

use serde::Serialize;

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
    /// Model folders an experiment also probes, where it says so (`precision`).
    pub checkpoints: &'a [std::path::PathBuf],
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

/// `impl From<Kind> for Figure` for each kind of figure.
macro_rules! figure_kinds {
    ($($kind:ident),*) => {
        $(impl From<$kind> for Figure {
            fn from(figure: $kind) -> Self {
                Figure::$kind(figure)
            }
        })*
    };
}
figure_kinds!(Lines, Heatmaps);

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
