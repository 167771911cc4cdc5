//! Figures as SVG, drawn with `plotters` from an experiment's [`Figure`] data: line
//! plots here, heatmaps in [`super::heatmap`].
//!
//! Logarithmic axes are drawn as linear axes over log₂ x or log₁₀ y, labelled with
//! the values themselves, so every figure uses one chart type.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use qkv::experiments::{Figure, Lines};

/// Line colours: the Okabe–Ito set, told apart with colour-blindness too, without its
/// yellow (faint on white).
const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];

/// Pixels of every line figure.
const SIZE: (u32, u32) = (720, 440);

/// The figure as a standalone SVG document.
pub fn svg(fig: &Figure) -> Result<String> {
    match fig {
        Figure::Lines(lines) => lines_svg(lines),
        Figure::Heatmaps(maps) => {
            super::heatmap::svg(maps, super::heatmap::Layout::for_figure(maps))
        }
    }
}

fn lines_svg(fig: &Lines) -> Result<String> {
    let fx = |x: f64| if fig.log_x { x.log2() } else { x };
    let fy = |y: f64| if fig.log_y { y.log10() } else { y };
    let points: Vec<Vec<(f64, f64)>> = fig
        .series
        .iter()
        .map(|s| s.points.iter().map(|&(x, y)| (fx(x), fy(y))).collect())
        .collect();
    let all = points.iter().flatten();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        if !(x.is_finite() && y.is_finite()) {
            return Err(anyhow!("figure `{}`: a point is not finite", fig.title));
        }
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        return Err(anyhow!("figure `{}` has no points", fig.title));
    }
    // room around the data; a flat series still gets a visible range
    let pad = |lo: f64, hi: f64| {
        let r = (hi - lo).max(1e-9);
        (lo - 0.05 * r, hi + 0.05 * r)
    };
    let ((x0, x1), (y0, y1)) = (pad(x0, x1), pad(y0, y1));
    let draw = |e: &dyn std::fmt::Debug| anyhow!("drawing figure `{}`: {e:?}", fig.title);

    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&fig.title, ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| draw(&e))?;
        // on a log₂ axis only whole powers of two are labelled
        let x_label = |v: &f64| {
            if !fig.log_x {
                format!("{v}")
            } else if (v - v.round()).abs() < 1e-6 {
                format!("{}", 2f64.powf(v.round()))
            } else {
                String::new()
            }
        };
        // a log₁₀ axis is labelled with the values, to two significant digits
        let y_label = |v: &f64| {
            if fig.log_y {
                format!("{:.1e}", 10f64.powf(*v))
            } else {
                format!("{v:.2}")
            }
        };
        chart
            .configure_mesh()
            .x_desc(fig.x_label.as_str())
            .y_desc(fig.y_label.as_str())
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .draw()
            .map_err(|e| draw(&e))?;
        for (i, (series, pts)) in fig.series.iter().zip(&points).enumerate() {
            let color = if series.label == "chance" {
                RGBColor(150, 150, 150)
            } else {
                PALETTE[i % PALETTE.len()]
            };
            let style = color.stroke_width(2);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), style))
                .map_err(|e| draw(&e))?
                .label(series.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            if pts.len() <= 32 {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| draw(&e))?;
            }
        }
        chart
            .configure_series_labels()
            .position(emptiest_corner(&points, (x0, x1), (y0, y1)))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| draw(&e))?;
        root.present().map_err(|e| draw(&e))?;
    }
    Ok(out)
}

/// The corner of the plot with the fewest data points, for the legend.
fn emptiest_corner(
    series: &[Vec<(f64, f64)>],
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
) -> SeriesLabelPosition {
    // a corner region: 45% of the width, 35% of the height
    let count = |right: bool, top: bool| {
        series
            .iter()
            .flatten()
            .filter(|&&(x, y)| {
                let (u, v) = ((x - x0) / (x1 - x0), (y - y0) / (y1 - y0));
                (if right { u > 0.55 } else { u < 0.45 }) && (if top { v > 0.65 } else { v < 0.35 })
            })
            .count()
    };
    [
        (SeriesLabelPosition::UpperRight, count(true, true)),
        (SeriesLabelPosition::LowerRight, count(true, false)),
        (SeriesLabelPosition::LowerLeft, count(false, false)),
        (SeriesLabelPosition::UpperLeft, count(false, true)),
    ]
    .into_iter()
    .min_by_key(|&(_, n)| n)
    .map(|(corner, _)| corner)
    .expect("four corners")
}
