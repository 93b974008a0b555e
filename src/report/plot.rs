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

/// Writes the plot: PNG or SVG by the file's extension (`.svg` gives SVG).
pub fn plot_step(p: &StepProfile, path: &Path, title: Option<&str>) -> Result<()> {
    plot_timeline(p, path, title)
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
    // The in-op peaks: each row's highest live bytes since the previous row (inside the
    // op), which the bytes taken as ops return can miss; the step's peak is their highest.
    let max = p
        .rows
        .iter()
        .map(|r| r.bytes.total().max(r.peak_bytes))
        .max()
        .unwrap_or(0)
        .max(p.peak.bytes)
        .max(1);
    let (scale, unit_name) = unit(max);
    let y_max = max as f64 / scale * 1.12;

    // The title over both; the chart on the left, the legend beside it (never over the
    // curve), with what each category holds.
    let body = match title {
        Some(t) => root.titled(t, (FONT, 28).into_font()).map_err(err)?,
        None => root.clone(),
    };
    let (plot_area, legend_area) = body.split_horizontally(WIDTH - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
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
    let mut legend: Vec<Entry> = Vec::new();
    for (k, c) in Category::ALL.iter().enumerate().rev() {
        let col = color(*c);
        let top = &cumulative[k];
        chart
            .draw_series(AreaSeries::new(
                top.iter().enumerate().map(|(i, v)| (i as f64, *v)),
                0.0,
                col.mix(0.85).filled(),
            ))
            .map_err(err)?;
        legend.push(Entry {
            mark: Mark::Box(col.mix(0.85)),
            name: format!(
                "{} (max {})",
                c.label(),
                format::bytes(p.category_max.get(*c))
            ),
            meaning: c.meaning().to_string(),
        });
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
        let ink = RGBColor(0, 0, 0).mix(0.7);
        chart
            .draw_series(std::iter::once(Polygon::new(outline, ink.filled())))
            .map_err(err)?;
        legend.push(Entry {
            mark: Mark::Box(ink),
            name: format!("idle at the peak (up to {})", format::bytes(most_idle)),
            meaning: "live at the peak, read by no op again".to_string(),
        });
    }

    // The in-op peaks, a line over the stack where they rise above it: the peak's dot
    // sits on it.
    let in_op = RGBColor(0, 0, 0);
    chart
        .draw_series(LineSeries::new(
            p.rows
                .iter()
                .enumerate()
                .map(|(i, r)| (i as f64, r.peak_bytes.max(r.bytes.total()) as f64 / scale)),
            in_op.stroke_width(1),
        ))
        .map_err(err)?;
    legend.push(Entry {
        mark: Mark::Line(in_op),
        name: "the most live inside each op".to_string(),
        meaning: "the stack is taken as each op returns".to_string(),
    });

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
    // Keep the label inside the plot: its width measured in the font it is drawn with,
    // right-aligned to the marker where it would pass the right edge.
    let font: TextStyle = (FONT, 18).into_font().into();
    let (label_w, _) = plot_area.estimate_text_size(&label, &font).map_err(err)?;
    let (px, _) = chart.backend_coord(&(peak_x, peak_y));
    let (right, _) = chart.backend_coord(&((n.max(2) - 1) as f64, 0.0));
    let (left, _) = chart.backend_coord(&(0.0, 0.0));
    let x0 = if px + 10 + label_w as i32 > right {
        (px - 10 - label_w as i32).max(left)
    } else {
        px + 10
    };
    let (_, py) = chart.backend_coord(&(peak_x, peak_y + y_max * 0.05));
    plot_area
        .draw(&Text::new(label, (x0, py - 9), font))
        .map_err(err)?;

    draw_legend(&legend_area, &legend).map_err(err)?;
    Ok(())
}

/// The legend panel's width, beside the chart.
const LEGEND_WIDTH: u32 = 400;

/// A legend line: its mark, its name and what it means.
struct Entry {
    mark: Mark,
    name: String,
    meaning: String,
}

enum Mark {
    Box(RGBAColor),
    Line(RGBColor),
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[Entry],
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (x, mut y) = (10, 40);
    let name_font = (FONT, 17).into_font();
    let meaning_font = (FONT, 14).into_font().color(&RGBColor(90, 90, 90));
    for e in entries {
        match e.mark {
            Mark::Box(c) => area.draw(&Rectangle::new([(x, y), (x + 18, y + 14)], c.filled()))?,
            Mark::Line(c) => area.draw(&PathElement::new(
                vec![(x, y + 7), (x + 18, y + 7)],
                c.stroke_width(2),
            ))?,
        }
        area.draw(&Text::new(
            e.name.as_str(),
            (x + 28, y - 1),
            name_font.clone(),
        ))?;
        area.draw(&Text::new(
            e.meaning.as_str(),
            (x + 28, y + 19),
            meaning_font.clone(),
        ))?;
        y += 50;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::phase::Phase;
    use crate::timeline::{CategoryBytes, Peak, StepRow};

    /// A step whose peak is inside its last op (a temporary freed before the op
    /// returned): 3 MiB of weights, an op that takes 9 MiB inside and returns with 4 MiB.
    fn in_op_peak() -> StepProfile {
        const MIB: i64 = 1 << 20;
        let row = |i: u32, act: i64, peak: u64| {
            let mut v = [0i64; crate::timeline::CATEGORIES];
            v[Category::Param.index()] = 3 * MIB;
            v[Category::Act.index()] = act;
            StepRow {
                op_index: i,
                op: format!("aten::op{i}"),
                phase: Phase::Forward,
                layer: "layer".into(),
                bytes: CategoryBytes::from_signed(&v),
                allocated_bytes: (3 * MIB + act) as u64,
                peak_bytes: peak,
                idle_bytes: 0,
            }
        };
        StepProfile {
            rows: vec![
                row(0, MIB, 4 << 20),
                row(1, MIB, 4 << 20),
                row(2, MIB, 12 << 20),
            ],
            peak: Peak {
                bytes: 12 << 20,
                op_index: Some(2),
                op: "aten::op2_with_a_long_name_that_would_pass_the_edge".into(),
                phase: Some(Phase::Forward),
                layer: "layer".into(),
                ..Peak::default()
            },
            complete: true,
            ops_recorded: true,
            ..StepProfile::default()
        }
    }

    /// The plot as SVG: the legend beside the chart with what each category holds, the
    /// in-op peaks drawn so the peak's dot is on a curve, the peak's label inside the
    /// chart though the peak is at its right edge.
    #[test]
    fn the_plot_draws_the_in_op_peak_and_keeps_its_words_inside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("step.svg");
        plot_step(&in_op_peak(), &path, Some("test")).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for c in Category::ALL {
            assert!(svg.contains(c.meaning()), "{} not in the legend", c.label());
        }
        assert!(svg.contains("the most live inside each op"));
        // Every text starts left of the legend panel, or inside it.
        let chart_right = (WIDTH - LEGEND_WIDTH) as f64;
        let label = svg
            .split("<text")
            .find(|t| t.contains("peak 12.00 MiB during"))
            .expect("the peak's label");
        let x: f64 = label
            .split("x=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .and_then(|v| v.parse().ok())
            .expect("its x");
        // Right-aligned to the marker at the right edge: it starts well inside the chart
        // (its 18-pixel font makes it ~600 pixels wide).
        assert!(x < chart_right - 400.0, "the label starts at x={x}");
        // A polyline reaches the peak's height: the in-op line (the stack tops out at
        // 4 MiB, a third of the way up).
        let dot = svg.split("<circle").nth(1).expect("the peak's dot");
        let cy: f64 = dot
            .split("cy=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        let on_line = svg.split("<polyline").skip(1).any(|l| {
            l.split("points=\"").nth(1).is_some_and(|pts| {
                pts.split('"').next().unwrap().split(' ').any(|pt| {
                    pt.split(',')
                        .nth(1)
                        .and_then(|y| y.parse::<f64>().ok())
                        .is_some_and(|y| (y - cy).abs() <= 1.0)
                })
            })
        });
        assert!(on_line, "no line through the peak's dot at y={cy}");
    }

    #[test]
    fn axis_unit_follows_the_largest_value() {
        assert_eq!(unit(10).1, "KiB");
        assert_eq!(unit(5 << 20).1, "MiB");
        assert_eq!(unit(3 << 30).1, "GiB");
    }
}
