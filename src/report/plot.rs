//! The step timeline as a picture (plotters): live bytes stacked by category over the
//! ops of one iteration, the phase boundaries dashed, the peak marked.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::format;
use crate::timeline::{Category, StepProfile};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 800;
const FONT: &str = "sans-serif";

static FONT_ONCE: Once = Once::new();

/// Text is drawn with DejaVu Sans bundled in the crate (assets/fonts), so plots need no
/// system fonts.
fn register_font() {
    FONT_ONCE.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
        if plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_err() {
            log::warn!(
                "tch-memprof: the bundled font could not be loaded; plot text may be missing"
            );
        }
    });
}

fn color(c: Category) -> RGBColor {
    match c {
        Category::Param => RGBColor(31, 119, 180),
        Category::Buffer => RGBColor(158, 202, 225),
        Category::Opt => RGBColor(148, 103, 189),
        Category::Grad => RGBColor(255, 127, 14),
        Category::Other => RGBColor(150, 150, 150),
        Category::Workspace => RGBColor(110, 110, 160),
        Category::Act => RGBColor(44, 160, 44),
        Category::Temp => RGBColor(214, 39, 40),
    }
}

/// The unit the y axis uses for a maximum of `max` bytes.
fn unit(max: u64) -> (f64, &'static str) {
    const KIB: f64 = 1024.0;
    let m = max as f64;
    if m >= KIB * KIB * KIB {
        (KIB * KIB * KIB, "GiB")
    } else if m >= KIB * KIB {
        (KIB * KIB, "MiB")
    } else {
        (KIB, "KiB")
    }
}

impl StepProfile {
    /// Writes the plot: PNG or SVG by the file's extension (`.svg` gives SVG).
    pub fn plot(&self, path: &Path, title: Option<&str>) -> Result<()> {
        plot_timeline(self, path, title)
    }
}

fn plot_timeline(p: &StepProfile, path: &Path, title: Option<&str>) -> Result<()> {
    register_font();
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let outcome = if svg {
        let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, p, title).and_then(|_| root.present().map_err(|e| e.to_string()))
    } else {
        let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, p, title).and_then(|_| root.present().map_err(|e| e.to_string()))
    };
    outcome.map_err(|reason| Error::Plot {
        path: path.to_path_buf(),
        reason,
    })
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    p: &StepProfile,
    title: Option<&str>,
) -> std::result::Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    if p.rows.is_empty() {
        root.draw(&Text::new(
            "no ops were recorded in this iteration",
            (40, 40),
            (FONT, 24).into_font(),
        ))
        .map_err(err)?;
        return Ok(());
    }
    let n = p.rows.len();
    let max = p
        .rows
        .iter()
        .map(|r| r.bytes.total())
        .max()
        .unwrap_or(0)
        .max(p.peak.bytes)
        .max(1);
    let (scale, unit_name) = unit(max);
    let y_max = max as f64 / scale * 1.12;

    let mut chart = ChartBuilder::on(root);
    chart.margin(20).x_label_area_size(50).y_label_area_size(90);
    if let Some(t) = title {
        chart.caption(t, (FONT, 28).into_font());
    }
    let mut chart = chart
        .build_cartesian_2d(0f64..(n.max(2) - 1) as f64, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("op (in the order ops returned)")
        .y_desc(format!("live memory ({unit_name})"))
        .axis_desc_style((FONT, 20).into_font())
        .label_style((FONT, 16).into_font())
        .y_label_formatter(&|v| format!("{v:.1}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(err)?;

    // Stacked areas: draw the top of the stack first, each lower sum over it.
    let mut cumulative: Vec<Vec<f64>> = Vec::new();
    let mut acc = vec![0f64; n];
    for c in Category::ALL {
        for (a, r) in acc.iter_mut().zip(&p.rows) {
            *a += r.bytes.get(c) as f64 / scale;
        }
        cumulative.push(acc.clone());
    }
    for (k, c) in Category::ALL.iter().enumerate().rev() {
        let col = color(*c);
        let top = &cumulative[k];
        let label = format!(
            "{} (max {})",
            c.label(),
            format::bytes(p.category_max.get(*c))
        );
        chart
            .draw_series(AreaSeries::new(
                top.iter().enumerate().map(|(i, v)| (i as f64, *v)),
                0.0,
                col.mix(0.85).filled(),
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], col.filled()));
    }

    // The idle band: the bytes idle at the peak that no op reads again, at the top of the
    // stack; its lower edge is what would have been live had they been freed after their
    // last reads.
    let most_idle = p.rows.iter().map(|r| r.idle_bytes).max().unwrap_or(0);
    if most_idle > 0 {
        let top = &cumulative[cumulative.len() - 1];
        let low = p
            .rows
            .iter()
            .zip(top)
            .map(|(r, t)| t - r.idle_bytes as f64 / scale);
        let outline: Vec<(f64, f64)> = top
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64, *v))
            .chain(low.enumerate().rev().map(|(i, v)| (i as f64, v)))
            .collect();
        let ink = RGBColor(0, 0, 0);
        chart
            .draw_series(std::iter::once(Polygon::new(
                outline,
                ink.mix(0.7).filled(),
            )))
            .map_err(err)?
            .label(format!(
                "idle at the peak, read by no op again (up to {})",
                format::bytes(most_idle)
            ))
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 6), (x + 16, y + 6)], ink.mix(0.7).filled())
            });
    }

    // Phase boundaries.
    let (bwd, opt) = p.phase_boundaries();
    for (at, name) in [(bwd, "backward starts"), (opt, "optimizer starts")] {
        if let Some(i) = at {
            let x = i as f64;
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x, 0.0), (x, y_max)],
                    10,
                    6,
                    BLACK.stroke_width(2),
                ))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    name.to_string(),
                    (x, y_max * 0.98),
                    (FONT, 18).into_font(),
                )))
                .map_err(err)?;
        }
    }

    // The peak.
    let peak_x = p
        .peak
        .op_index
        .and_then(|op| p.rows.iter().position(|r| r.op_index == op))
        .unwrap_or(0) as f64;
    let peak_y = p.peak.bytes as f64 / scale;
    chart
        .draw_series(std::iter::once(Circle::new(
            (peak_x, peak_y),
            7,
            BLACK.filled(),
        )))
        .map_err(err)?;
    let label = format!(
        "peak {} during {}",
        format::bytes(p.peak.bytes),
        p.peak.location()
    );
    // Keep the label inside the plot: left of the marker when it is in the right half.
    let anchor_x = if peak_x > (n as f64) * 0.55 {
        (peak_x - (n as f64) * 0.02 * (label.len() as f64 / 3.0)).max(0.0)
    } else {
        peak_x + (n as f64) * 0.01
    };
    chart
        .draw_series(std::iter::once(Text::new(
            label,
            (anchor_x, peak_y + y_max * 0.03),
            (FONT, 18).into_font(),
        )))
        .map_err(err)?;

    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .margin(15)
        .label_font((FONT, 16).into_font())
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_unit_follows_the_largest_value() {
        assert_eq!(unit(10).1, "KiB");
        assert_eq!(unit(5 << 20).1, "MiB");
        assert_eq!(unit(3 << 30).1, "GiB");
    }
}
