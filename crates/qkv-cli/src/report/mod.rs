//! What the CLI draws from the library's measurements: SVG figures, PNG heatmaps,
//! experiment files and the demo's HTML page.

pub mod figure;
pub mod files;
pub mod heatmap;
pub mod html;
pub mod raster;
