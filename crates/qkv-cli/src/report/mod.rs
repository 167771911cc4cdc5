//! What the CLI draws from the library's measurements: SVG figures, experiment files
//! and the demo's HTML page.

pub mod figure;
pub mod files;
mod heatmap;
pub mod html;
