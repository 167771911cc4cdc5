//! Training as one library call: a request (the `qkv train` flags, the `qkv.train`
//! keywords) → the run's spec, its model, its batches, its checks and its output
//! folder → the steps. The CLI and the Python package are thin callers of [`run`].

mod files;
mod model;
mod request;
mod spec;
mod training;

pub use model::{arch, Model};
pub use request::{DecayChoice, FfnChoice, Network, NormChoice, PositionChoice, RunRequest, Style};
pub use spec::{RunSpec, Source};
pub use training::{run, RunInfo, Summary, Watch};
