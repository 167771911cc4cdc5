//! Heatmaps as SVG: one panel per map, side by side, cells shaded from white (0) to
//! dark blue (1), rows and columns labelled (tokens, for attention weights).

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use qkv::experiments::Heatmaps;

/// Pixels of one panel; the figure is as wide as its panels.
const PANEL: (u32, u32) = (360, 400);

/// The colour of a weight in [0, 1].
fn shade(v: f64) -> RGBColor {
    let v = v.clamp(0.0, 1.0);
    let lerp = |from: f64, to: f64| (from + (to - from) * v).round() as u8;
    RGBColor(lerp(255.0, 8.0), lerp(255.0, 48.0), lerp(255.0, 107.0))
}

/// The maps as a standalone SVG document.
pub fn svg(maps: &Heatmaps) -> Result<String> {
    let draw = |e: &dyn std::fmt::Debug| anyhow!("drawing figure `{}`: {e:?}", maps.title);
    let (cols, rows) = (maps.columns.len(), maps.rows.len());
    if maps.panels.is_empty() || cols == 0 || rows == 0 {
        return Err(anyhow!("figure `{}` has no cells", maps.title));
    }
    for p in &maps.panels {
        if p.values.len() != rows || p.values.iter().any(|r| r.len() != cols) {
            return Err(anyhow!(
                "figure `{}`, panel `{}`: values are not {rows}×{cols}",
                maps.title,
                p.label
            ));
        }
        if p.values.iter().flatten().any(|v| !v.is_finite()) {
            return Err(anyhow!(
                "figure `{}`, panel `{}`: a value is not finite",
                maps.title,
                p.label
            ));
        }
    }
    let size = (PANEL.0 * maps.panels.len() as u32, PANEL.1 + 40);
    let label = |names: &[String], v: &SegmentValue<usize>, flip: bool| match v {
        SegmentValue::CenterOf(i) if *i < names.len() => {
            names[if flip { names.len() - 1 - i } else { *i }].clone()
        }
        _ => String::new(),
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        let root = root
            .titled(&maps.title, ("sans-serif", 20))
            .map_err(|e| draw(&e))?;
        let areas = root.split_evenly((1, maps.panels.len()));
        for (panel, area) in maps.panels.iter().zip(&areas) {
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.label, ("sans-serif", 15))
                .margin(10)
                .x_label_area_size(56)
                .y_label_area_size(56)
                // plotters' integer ranges include their end: 0..n − 1 is n segments
                .build_cartesian_2d(
                    (0..cols - 1).into_segmented(),
                    (0..rows - 1).into_segmented(),
                )
                .map_err(|e| draw(&e))?;
            // plotters puts y = 0 at the bottom; row 0 belongs on top
            let x_label = |v: &SegmentValue<usize>| label(&maps.columns, v, false);
            let y_label = |v: &SegmentValue<usize>| label(&maps.rows, v, true);
            chart
                .configure_mesh()
                .disable_mesh()
                .x_labels(cols)
                .y_labels(rows)
                .x_desc(maps.x_label.as_str())
                .y_desc(maps.y_label.as_str())
                .x_label_formatter(&x_label)
                .y_label_formatter(&y_label)
                .label_style(("sans-serif", 11))
                .draw()
                .map_err(|e| draw(&e))?;
            let cells = panel.values.iter().enumerate().flat_map(|(r, row)| {
                let y = rows - 1 - r;
                row.iter().enumerate().map(move |(c, &v)| {
                    Rectangle::new(
                        [
                            (SegmentValue::Exact(c), SegmentValue::Exact(y)),
                            (SegmentValue::Exact(c + 1), SegmentValue::Exact(y + 1)),
                        ],
                        shade(v).filled(),
                    )
                })
            });
            chart.draw_series(cells).map_err(|e| draw(&e))?;
        }
        root.present().map_err(|e| draw(&e))?;
    }
    Ok(out)
}
