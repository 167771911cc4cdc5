//! What the CLI draws from the library's measurements: SVG figures.

pub mod figure;
mod heatmap;
