//! Heatmaps as SVG (a PNG is this SVG rasterised, [`super::raster`]): one panel per map, side by side, cells shaded from white (0)
//! to dark blue (1), rows and columns labelled (tokens, for attention weights), and a
//! colour scale beside the last panel.

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;
use qkv::experiments::Heatmaps;

/// How large a figure is drawn.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Pixels of one panel.
    pub panel: (u32, u32),
    /// Pixels reserved for each axis's labels.
    pub label_area: u32,
    /// Font size of the labels.
    pub font: u32,
    /// Column labels written vertically (long token lists).
    pub vertical_columns: bool,
}

/// Pixels of the colour scale's strip, with its ticks.
const SCALE_WIDTH: u32 = 70;

impl Layout {
    /// The experiments' figures: panels of a fixed size.
    pub const FIXED: Layout = Layout {
        panel: (360, 400),
        label_area: 56,
        font: 11,
        vertical_columns: false,
    };

    /// An experiment's figure: [`Layout::FIXED`], with the column labels written
    /// vertically when written across they would run into each other.
    pub fn for_figure(maps: &Heatmaps) -> Layout {
        let cell = Layout::FIXED
            .panel
            .0
            .saturating_sub(Layout::FIXED.label_area)
            / maps.columns.len().max(1) as u32;
        let widest = maps
            .columns
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(1) as u32;
        Layout {
            vertical_columns: widest * Layout::FIXED.font * 6 / 10 > cell,
            ..Layout::FIXED
        }
    }

    /// One attention map: cells about 22 px (smaller for long texts), label areas as
    /// wide as the longest label.
    pub fn for_tokens(maps: &Heatmaps) -> Layout {
        let n = maps.rows.len().max(maps.columns.len()).max(1) as u32;
        let cell = (900 / n).clamp(6, 22);
        let font = (cell - 4).clamp(8, 13);
        let longest = maps
            .rows
            .iter()
            .chain(&maps.columns)
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(1) as u32;
        let label_area = (longest * font * 7 / 10 + 24).clamp(40, 180);
        let side = |count: usize| count as u32 * cell + label_area + 40;
        Layout {
            panel: (side(maps.columns.len()), side(maps.rows.len()) + 20),
            label_area,
            font,
            vertical_columns: true,
        }
    }

    fn size(&self, panels: usize) -> (u32, u32) {
        (
            self.panel.0 * panels as u32 + SCALE_WIDTH,
            self.panel.1 + 40,
        )
    }
}

/// The colour of a weight in [0, 1].
fn shade(v: f64) -> RGBColor {
    let v = v.clamp(0.0, 1.0);
    let lerp = |from: f64, to: f64| (from + (to - from) * v).round() as u8;
    RGBColor(lerp(255.0, 8.0), lerp(255.0, 48.0), lerp(255.0, 107.0))
}

/// Checks `maps` holds a finite `rows × columns` grid in each panel.
fn check(maps: &Heatmaps) -> Result<()> {
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
    Ok(())
}

/// The maps as a standalone SVG document.
pub fn svg(maps: &Heatmaps, layout: Layout) -> Result<String> {
    check(maps)?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, layout.size(maps.panels.len()));
        draw(root.into_drawing_area(), maps, layout)?;
    }
    Ok(out)
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    maps: &Heatmaps,
    layout: Layout,
) -> Result<()> {
    let fail = |e: &dyn std::fmt::Debug| anyhow!("drawing figure `{}`: {e:?}", maps.title);
    let (cols, rows) = (maps.columns.len(), maps.rows.len());
    let label = |names: &[String], v: &SegmentValue<usize>, flip: bool| match v {
        SegmentValue::CenterOf(i) if *i < names.len() => {
            names[if flip { names.len() - 1 - i } else { *i }].clone()
        }
        _ => String::new(),
    };
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let whole = root.clone();
    let root = root
        .titled(&maps.title, ("sans-serif", 20))
        .map_err(|e| fail(&e))?;
    let (panels_area, scale_area) = root.split_horizontally(root.dim_in_pixel().0 - SCALE_WIDTH);
    let areas = panels_area.split_evenly((1, maps.panels.len()));
    let font = layout.font as i32;
    // Vertical column labels start just below the axis and read downwards. plotters'
    // mesh centres every label on its tick, so these are drawn here instead.
    let vertical = TextStyle::from(
        ("sans-serif", font)
            .into_font()
            .transform(FontTransform::Rotate90),
    )
    .pos(Pos::new(HPos::Left, VPos::Center));
    for (panel, area) in maps.panels.iter().zip(&areas) {
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.label, ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(layout.label_area)
            .y_label_area_size(layout.label_area)
            // plotters' integer ranges include their end: 0..n − 1 is n segments
            .build_cartesian_2d(
                (0..cols - 1).into_segmented(),
                (0..rows - 1).into_segmented(),
            )
            .map_err(|e| fail(&e))?;
        // plotters puts y = 0 at the bottom; row 0 belongs on top
        let x_label = |v: &SegmentValue<usize>| match layout.vertical_columns {
            true => String::new(),
            false => label(&maps.columns, v, false),
        };
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
            .x_label_style(("sans-serif", font))
            .y_label_style(("sans-serif", font))
            .draw()
            .map_err(|e| fail(&e))?;
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
        chart.draw_series(cells).map_err(|e| fail(&e))?;
        if layout.vertical_columns {
            for (c, name) in maps.columns.iter().enumerate() {
                let (x, y) =
                    chart.backend_coord(&(SegmentValue::CenterOf(c), SegmentValue::Exact(0)));
                whole
                    .draw(&Text::new(name.clone(), (x, y + 8), vertical.clone()))
                    .map_err(|e| fail(&e))?;
            }
        }
    }
    draw_scale(&scale_area, layout).map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// A vertical strip from 1 (top) to 0, ticked at 0, 0.5 and 1.
fn draw_scale<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    layout: Layout,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (top, bottom) = (40i32, layout.panel.1 as i32 - layout.label_area as i32 - 10);
    let steps = 50;
    let height = (bottom - top).max(steps);
    for i in 0..steps {
        let y0 = top + height * i / steps;
        let y1 = top + height * (i + 1) / steps;
        let v = 1.0 - (i as f64 + 0.5) / steps as f64;
        area.draw(&Rectangle::new([(10, y0), (26, y1)], shade(v).filled()))?;
    }
    area.draw(&Rectangle::new([(10, top), (26, top + height)], BLACK))?;
    for (v, y) in [(1.0, top), (0.5, top + height / 2), (0.0, top + height)] {
        area.draw(&Text::new(format!("{v}"), (30, y - 6), ("sans-serif", 12)))?;
    }
    Ok(())
}
