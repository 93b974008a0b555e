//! The screen of `watch`: a chart of the run's memory over its reported iterations, the
//! breakdown of one iteration and its largest variables, the epochs with their leak
//! verdicts, and a status line. A function of what was read and of the keys pressed.

use std::time::{Duration, SystemTime};

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Borders, Cell, Chart, Dataset, GraphType, Paragraph, Row, Table,
};
use ratatui::Frame;

use super::follow::Watched;
use crate::format::{bytes, signed_bytes};
use crate::runs::SummaryRow;

/// The smallest screen the view is drawn on.
pub(super) const MIN_WIDTH: u16 = 50;
pub(super) const MIN_HEIGHT: u16 = 16;

/// After this long without a row, the status line says the run may have stopped.
pub(super) const QUIET: Duration = Duration::from_secs(30);

/// What the chart shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChartKind {
    /// Peak allocated and reserved (or resident) of each reported iteration.
    Totals,
    /// Each category, side by side.
    Categories,
}

/// The viewer's state: what the keys changed.
#[derive(Clone, Debug)]
pub(super) struct Ui {
    pub paused: bool,
    /// The iteration looked at (an index into the summary rows); `None`: the latest.
    pub cursor: Option<usize>,
    pub chart: ChartKind,
    /// The budget to draw (`--memory`).
    pub budget: Option<u64>,
    /// The last problem reading the files (shown on the status line).
    pub problem: Option<String>,
}

impl Ui {
    pub fn new(budget: Option<u64>) -> Ui {
        Ui {
            paused: false,
            cursor: None,
            chart: ChartKind::Totals,
            budget,
            problem: None,
        }
    }

    /// The summary row looked at.
    pub fn selected<'a>(&self, w: &'a Watched) -> Option<(usize, &'a SummaryRow)> {
        let last = w.summary.len().checked_sub(1)?;
        let i = self.cursor.map_or(last, |c| c.min(last));
        Some((i, &w.summary[i]))
    }
}

/// Draws the whole screen.
pub(super) fn draw(f: &mut Frame, w: &Watched, ui: &Ui, now: SystemTime) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "terminal too small ({}x{}): watch needs {MIN_WIDTH}x{MIN_HEIGHT}; q quits",
            area.width, area.height
        );
        f.render_widget(
            Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }),
            area,
        );
        return;
    }
    let epochs_rows = (w.epochs.len().max(1) as u16 + 3).min(7);
    let [title, body, epochs, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(8),
        Constraint::Length(epochs_rows),
        Constraint::Length(1),
    ])
    .areas(area);
    let narrow = area.width < 100;
    f.render_widget(title_line(w, ui, narrow), title);
    if narrow {
        let [chart, side] =
            Layout::vertical([Constraint::Min(6), Constraint::Length(7)]).areas(body);
        draw_chart(f, chart, w, ui);
        draw_side(f, side, w, ui, narrow);
    } else {
        let [chart, side] =
            Layout::horizontal([Constraint::Min(40), Constraint::Length(46)]).areas(body);
        draw_chart(f, chart, w, ui);
        draw_side(f, side, w, ui, narrow);
    }
    draw_epochs(f, epochs, w, narrow);
    f.render_widget(status_line(w, ui, now, narrow), status);
}

/// The screen before the run's first file: what it waits for, what is there instead
/// (`why`: a mistyped folder waits visibly, not silently), how to quit.
pub(super) fn draw_waiting(f: &mut Frame, waiting: &str, why: Option<&str>) {
    let why = why.map(|w| format!("\n\nnot yet: {w}")).unwrap_or_default();
    let text = format!(
        "{waiting} (a *_summary.csv: the profiler writes one with .csv(true) when it is built){why}\n\nq quits"
    );
    f.render_widget(
        Paragraph::new(text)
            .wrap(ratatui::widgets::Wrap { trim: true })
            .block(Block::bordered().title(" tch-memprof watch ")),
        f.area(),
    );
}

fn title_line(w: &Watched, ui: &Ui, narrow: bool) -> Line<'static> {
    let mut spans = Vec::new();
    if !narrow {
        spans.push(Span::styled(
            "tch-memprof watch ",
            Style::new().add_modifier(Modifier::BOLD),
        ));
    }
    spans.push(Span::raw(format!("{} on {}", w.name(), w.device())));
    if let Some((i, r)) = ui.selected(w) {
        spans.push(Span::raw(if narrow {
            format!(" · epoch {} it {} · step {}", r.epoch, r.iteration, r.step)
        } else {
            format!(
                " · epoch {} iteration {} (step {})",
                r.epoch, r.iteration, r.step
            )
        }));
        if ui.cursor.is_some() && i + 1 < w.summary.len() {
            spans.push(Span::styled(
                format!(" · {} newer", w.summary.len() - 1 - i),
                Style::new().fg(Color::Yellow),
            ));
        }
    }
    Line::from(spans)
}

/// A unit for the chart's axis: its divisor and name.
fn unit(max: u64) -> (f64, &'static str) {
    match max {
        m if m >= 1 << 30 => ((1u64 << 30) as f64, "GiB"),
        m if m >= 1 << 20 => ((1u64 << 20) as f64, "MiB"),
        m if m >= 1 << 10 => (1024.0, "KiB"),
        _ => (1.0, "B"),
    }
}

/// A line of the chart: its name, colour and value of a summary row.
type Series = (&'static str, Color, fn(&SummaryRow) -> u64);

/// A line drawn over the chart (an epoch's start, the budget, the iteration looked at):
/// its points, style and name in the legend.
type Marked = (Vec<(f64, f64)>, Style, Option<String>);

fn draw_chart(f: &mut Frame, area: Rect, w: &Watched, ui: &Ui) {
    let reserved = if w.on_cpu() { "resident" } else { "reserved" };
    let series: Vec<Series> = match ui.chart {
        ChartKind::Totals => vec![
            ("peak allocated", Color::Cyan, |r| r.peak_allocated_bytes),
            ("allocated", Color::Blue, |r| r.allocated_bytes),
            (
                if w.on_cpu() { "resident" } else { "reserved" },
                Color::Yellow,
                |r| r.reserved_bytes,
            ),
        ],
        ChartKind::Categories => vec![
            ("weights", Color::Green, |r| {
                r.weights_bytes + r.buffers_bytes
            }),
            ("gradients", Color::Red, |r| r.gradients_bytes),
            ("optimizer", Color::Magenta, |r| r.optimizer_state_bytes),
            ("feature maps", Color::Cyan, |r| r.feature_maps_bytes),
            ("interm. grads", Color::Yellow, |r| {
                r.intermediate_gradients_bytes
            }),
            ("other", Color::Gray, |r| r.other_bytes),
        ],
    };
    let data_max = w
        .summary
        .iter()
        .flat_map(|r| series.iter().map(move |(_, _, v)| v(r)))
        .max()
        .unwrap_or(0);
    let top = data_max.max(ui.budget.unwrap_or(0)).max(1);
    let (div, unit_name) = unit(top);
    let title = match ui.chart {
        ChartKind::Totals => format!(" allocated, {reserved} ({unit_name}) · c: by category "),
        ChartKind::Categories => format!(" by category ({unit_name}) · c: totals "),
    };
    let mut block = Block::default().borders(Borders::ALL).title(title);
    if let Some(p) = w
        .summary
        .iter()
        .max_by_key(|r| (r.peak_allocated_bytes, std::cmp::Reverse(r.step)))
    {
        let share = match ui.budget {
            Some(b) if b > 0 => format!(
                " · {:.0}% of {}",
                100.0 * p.peak_allocated_bytes as f64 / b as f64,
                bytes(b)
            ),
            _ => String::new(),
        };
        block = block.title_bottom(format!(
            " run's peak {} at step {}{share} ",
            bytes(p.peak_allocated_bytes),
            p.step
        ));
    }
    if w.summary.is_empty() {
        f.render_widget(
            Paragraph::new("no iteration reported yet: rows appear as record_stats writes them")
                .block(block),
            area,
        );
        return;
    }
    let y_max = top as f64 / div * 1.05;
    let first = w.summary[0].step as f64;
    let last = w.summary.last().map_or(first, |r| r.step as f64);
    let (x0, x1) = if last > first {
        (first, last)
    } else {
        (first - 1.0, first + 1.0)
    };
    let points: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|(_, _, v)| {
            w.summary
                .iter()
                .map(|r| (r.step as f64, v(r) as f64 / div))
                .collect()
        })
        .collect();
    // Epoch boundaries, the budget and the iteration looked at, as lines.
    let mut lines: Vec<Marked> = Vec::new();
    for pair in w.summary.windows(2) {
        if pair[1].epoch != pair[0].epoch {
            let x = pair[1].step as f64 - 0.5;
            lines.push((
                vec![(x, 0.0), (x, y_max)],
                Style::new().fg(Color::DarkGray),
                None,
            ));
        }
    }
    if let Some(b) = ui.budget {
        let y = b as f64 / div;
        lines.push((
            vec![(x0, y), (x1, y)],
            Style::new().fg(Color::LightRed),
            Some("budget".to_string()),
        ));
    }
    if let (Some(_), Some((_, r))) = (ui.cursor, ui.selected(w)) {
        let x = r.step as f64;
        lines.push((
            vec![(x, 0.0), (x, y_max)],
            Style::new().fg(Color::White),
            None,
        ));
    }
    let mut datasets: Vec<Dataset> = lines
        .iter()
        .map(|(pts, style, name)| {
            let d = Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(*style)
                .data(pts);
            match name {
                Some(n) => d.name(n.clone()),
                None => d,
            }
        })
        .collect();
    for ((name, color, _), pts) in series.iter().zip(&points) {
        datasets.push(
            Dataset::default()
                .name(*name)
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(*color))
                .data(pts),
        );
    }
    let y_labels = vec![
        Span::raw("0"),
        Span::raw(format!("{:.1}", y_max / 2.0)),
        Span::raw(format!("{y_max:.1}")),
    ];
    let x_labels = vec![
        Span::raw(format!("step {}", x0.max(0.0) as u64)),
        Span::raw(format!("{}", x1 as u64)),
    ];
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(Axis::default().bounds([x0, x1]).labels(x_labels))
        .y_axis(Axis::default().bounds([0.0, y_max]).labels(y_labels))
        .hidden_legend_constraints((Constraint::Ratio(1, 2), Constraint::Ratio(1, 1)));
    f.render_widget(chart, area);
}

/// The iteration looked at: its categories, the run's peak so far, its largest variables.
/// Narrow: the categories in two columns, no variables.
fn draw_side(f: &mut Frame, area: Rect, w: &Watched, ui: &Ui, narrow: bool) {
    let Some((_, r)) = ui.selected(w) else {
        f.render_widget(
            Paragraph::new("waiting for the first row").block(Block::bordered()),
            area,
        );
        return;
    };
    let mut cells = vec![
        ("allocated", r.allocated_bytes),
        ("peak allocated", r.peak_allocated_bytes),
        (
            if w.on_cpu() { "resident" } else { "reserved" },
            r.reserved_bytes,
        ),
        ("weights", r.weights_bytes),
        ("buffers", r.buffers_bytes),
        ("gradients", r.gradients_bytes),
        ("optimizer state", r.optimizer_state_bytes),
        ("other", r.other_bytes),
        ("feature maps", r.feature_maps_bytes),
        ("interm. grads", r.intermediate_gradients_bytes),
    ];
    if r.buffers_bytes == 0 {
        cells.retain(|(name, _)| *name != "buffers");
    }
    let cell =
        |(name, b): &(&'static str, u64)| [Cell::from(*name), Cell::from(right(&bytes(*b), 10))];
    let (table_rows, widths): (Vec<Row>, Vec<Constraint>) = if narrow {
        let half = cells.len().div_ceil(2);
        let rows = (0..half)
            .map(|i| {
                let mut row: Vec<Cell> = cell(&cells[i]).into();
                row.push(Cell::from(" "));
                if let Some(c) = cells.get(half + i) {
                    row.extend(cell(c));
                }
                Row::new(row)
            })
            .collect();
        let widths = vec![
            Constraint::Min(9),
            Constraint::Length(10),
            Constraint::Length(1),
            Constraint::Min(9),
            Constraint::Length(10),
        ];
        (rows, widths)
    } else {
        let rows = cells.iter().map(|c| Row::new(cell(c))).collect();
        (rows, vec![Constraint::Min(20), Constraint::Length(10)])
    };
    let title = if narrow {
        format!(" it {} ", r.iteration)
    } else {
        format!(" epoch {} iteration {} ", r.epoch, r.iteration)
    };
    let n = table_rows.len() as u16 + 2;
    let [top, vars] = if !narrow && area.height > n + 3 {
        Layout::vertical([Constraint::Length(n), Constraint::Min(0)]).areas(area)
    } else {
        [area, Rect::default()]
    };
    f.render_widget(
        Table::new(table_rows, widths)
            .column_spacing(1)
            .block(Block::bordered().title(title)),
        top,
    );
    if vars.height < 3 {
        return;
    }
    let list = w.variables_at(r.epoch, r.iteration);
    let width = vars.width.saturating_sub(2 + 10 + 10 + 2) as usize;
    let var_rows: Vec<Row> = list
        .iter()
        .take(vars.height.saturating_sub(3) as usize)
        .map(|v| {
            let grad = if v.gradient > 0 {
                bytes(v.gradient)
            } else {
                "-".into()
            };
            Row::new(vec![
                Cell::from(shorten(&v.name, width)),
                Cell::from(right(&bytes(v.weight), 10)),
                Cell::from(right(&grad, 10)),
            ])
        })
        .collect();
    let header = Row::new(vec!["variable", "    weight", "  gradient"])
        .style(Style::new().add_modifier(Modifier::BOLD));
    f.render_widget(
        Table::new(
            var_rows,
            [
                Constraint::Min(10),
                Constraint::Length(10),
                Constraint::Length(10),
            ],
        )
        .header(header)
        .block(Block::bordered().title(" largest variables ")),
        vars,
    );
}

/// The epochs, newest last, each with its leak verdict (narrow: without the reserved
/// column, so the verdict shows).
fn draw_epochs(f: &mut Frame, area: Rect, w: &Watched, narrow: bool) {
    let reserved = if w.on_cpu() { "resident" } else { "reserved" };
    let shown = area.height.saturating_sub(3) as usize;
    let from = w.epochs.len().saturating_sub(shown);
    let rows: Vec<Row> = w.epochs[from..]
        .iter()
        .map(|e| {
            let suspects: Vec<_> = w.leaks.iter().filter(|l| l.epoch == e.epoch).collect();
            let verdict = match suspects.as_slice() {
                [] => Span::raw("none named"),
                [one, ..] => Span::styled(
                    format!(
                        "{}{} in {} +{}",
                        match suspects.len() {
                            1 => String::new(),
                            n => format!("{n} suspects, first "),
                        },
                        one.op,
                        one.layer,
                        bytes(one.bytes),
                    ),
                    Style::new().fg(Color::LightRed),
                ),
            };
            let mut cells = vec![
                Cell::from(e.epoch.to_string()),
                Cell::from(right(&bytes(e.peak_allocated_bytes), 10)),
            ];
            if !narrow {
                cells.push(Cell::from(right(&bytes(e.peak_reserved_bytes), 13)));
            }
            cells.push(Cell::from(right(
                &signed_bytes(e.allocated_change_bytes),
                10,
            )));
            cells.push(Cell::from(verdict));
            Row::new(cells)
        })
        .collect();
    let mut header = vec!["epoch".to_string(), "peak alloc".to_string()];
    let mut widths = vec![Constraint::Length(5), Constraint::Length(10)];
    if !narrow {
        header.push(format!("{:>13}", format!("peak {reserved}")));
        widths.push(Constraint::Length(13));
    }
    header.extend(["    change".to_string(), "leak suspects".to_string()]);
    widths.extend([Constraint::Length(10), Constraint::Min(10)]);
    let title = if w.epochs.is_empty() {
        " epochs: none ended yet "
    } else {
        " epochs "
    };
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
            .block(Block::bordered().title(title)),
        area,
    );
}

fn status_line(w: &Watched, ui: &Ui, now: SystemTime, narrow: bool) -> Line<'static> {
    let age = w
        .written
        .and_then(|t| now.duration_since(t).ok())
        .unwrap_or_default();
    let mut spans = Vec::new();
    if let Some(p) = &ui.problem {
        spans.push(Span::styled(
            format!("{p} · "),
            Style::new().fg(Color::LightRed),
        ));
    }
    if ui.paused {
        spans.push(Span::styled(
            "paused (p resumes) · ",
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ));
    }
    let fresh = match w.written {
        None => "no row written yet".to_string(),
        Some(_) if age >= QUIET => format!(
            "no row for {}: the run stopped writing, or reports seldom",
            ago(age)
        ),
        Some(_) => format!("last row {} ago", ago(age)),
    };
    let style = if age >= QUIET {
        Style::new().fg(Color::Yellow)
    } else {
        Style::new()
    };
    spans.push(Span::styled(fresh, style));
    spans.push(Span::styled(
        if narrow {
            " · q quit p pause ←→ c chart"
        } else {
            " · q quit · p pause · ←/→ iteration · end: latest · c chart"
        },
        Style::new().fg(Color::DarkGray),
    ));
    Line::from(spans)
}

/// A duration in words: `4 s`, `3 min`, `2 h`.
fn ago(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

fn right(s: &str, width: usize) -> String {
    format!("{s:>width$}")
}

/// A name cut to `width` characters, its end kept (`…ayer4.1.conv2.weight`).
fn shorten(name: &str, width: usize) -> String {
    let n = name.chars().count();
    if n <= width || width < 2 {
        return name.to_string();
    }
    let tail: String = name.chars().skip(n - (width - 1)).collect();
    format!("…{tail}")
}
