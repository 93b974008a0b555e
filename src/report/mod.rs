//! Presentation: what is printed or written to a file. The profiler hands each result
//! to every sink of its reports (terminal, CSV); a sink's failure is logged and counted
//! by the profiler, never raised in the loop. Data modules (stats, timeline, leaks,
//! oom, estimate) only compute. The public part is a profiled or predicted step's files:
//! [`write_step_files`] (all of them), [`plot_step`], [`write_timeline_csv`],
//! [`write_layers_csv`] and [`write_idle_csv`]; reports print through `Display`.
//!
//! - `terminal`: tables on standard output, and the `Display` of leak and OOM reports;
//! - `fit_text`: the `Display` of [`Fit`](crate::estimate::Fit);
//! - `csv`: the run's CSV files, and a profiled step's timeline, layers and idle CSV;
//! - `idle_text`: the terminal section of the blocks idle at a step's peak;
//! - `html_page`: the run's HTML report, rebuilt from its CSV files, and the page of
//!   several runs (`tch-memprof report`), written whole or not at all;
//! - `plot`: a profiled step's plot (PNG or SVG);
//! - `snapshot`: memory snapshots in the pickle format of PyTorch's memory viewer;
//! - `oom_files`: the report and snapshot files of an out-of-memory error.

mod clock;
pub(crate) mod csv;
mod fit_text;
pub(crate) mod html_page;
mod idle_text;
pub(crate) mod oom_files;
mod parameter_rows;
pub(crate) mod plot;
pub(crate) mod snapshot;
mod summary_rows;
pub(crate) mod terminal;

pub use csv::{write_idle_csv, write_layers_csv, write_step_files, write_timeline_csv};
pub use plot::plot_step;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};

use crate::error::{Error, Result};
use crate::leaks::LeakReport;
use crate::oom::OomReport;
use crate::stats::{EpochStats, IterationStats};
use crate::timeline::{StepKind, StepProfile};

/// A destination for reports. Every hook does nothing by default.
pub(crate) trait Report: Send {
    /// At every reported iteration.
    fn iteration(&mut self, _stats: &IterationStats) -> Result<()> {
        Ok(())
    }
    /// At every `epoch_end`.
    fn epoch(&mut self, _stats: &EpochStats) -> Result<()> {
        Ok(())
    }
    /// When a step profile is ready: the requested step, or a new peak step.
    fn step_profile(&mut self, _profile: &StepProfile, _kind: StepKind) -> Result<()> {
        Ok(())
    }
    /// At an `epoch_end` whose leak hunt found suspects.
    fn leaks(&mut self, _report: &LeakReport) -> Result<()> {
        Ok(())
    }
    /// From the failing allocation, when an allocation ran out of memory: no lock that
    /// another thread may hold, and nothing that allocates much.
    fn oom(&mut self, _report: &OomReport) -> Result<()> {
        Ok(())
    }
    /// When the profiler drops (after the last step profile).
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
    /// Short name for log messages.
    fn name(&self) -> &'static str;
}

/// The sinks of one profiler, as one [`Report`]: each hook goes to every sink in turn,
/// and a sink that fails neither stops the others nor fails the hook. Its failure is
/// kept, with the sink's name, until the profiler takes it ([`Reports::take_failures`])
/// to log and count it.
#[derive(Default)]
pub(crate) struct Reports {
    sinks: Vec<Box<dyn Report>>,
    failures: Vec<(&'static str, Error)>,
}

impl Reports {
    pub(crate) fn push(&mut self, sink: Box<dyn Report>) {
        self.sinks.push(sink);
    }

    /// The sinks' failures since the last call, each with its sink's name.
    pub(crate) fn take_failures(&mut self) -> Vec<(&'static str, Error)> {
        std::mem::take(&mut self.failures)
    }

    /// Calls `hook` on every sink, keeping the failures.
    fn each(&mut self, mut hook: impl FnMut(&mut dyn Report) -> Result<()>) -> Result<()> {
        for s in &mut self.sinks {
            if let Err(e) = hook(s.as_mut()) {
                self.failures.push((s.name(), e));
            }
        }
        Ok(())
    }
}

impl Report for Reports {
    fn iteration(&mut self, s: &IterationStats) -> Result<()> {
        self.each(|r| r.iteration(s))
    }
    fn epoch(&mut self, s: &EpochStats) -> Result<()> {
        self.each(|r| r.epoch(s))
    }
    fn step_profile(&mut self, p: &StepProfile, kind: StepKind) -> Result<()> {
        self.each(|r| r.step_profile(p, kind))
    }
    fn leaks(&mut self, l: &LeakReport) -> Result<()> {
        self.each(|r| r.leaks(l))
    }
    fn oom(&mut self, o: &OomReport) -> Result<()> {
        self.each(|r| r.oom(o))
    }
    fn finish(&mut self) -> Result<()> {
        self.each(|r| r.finish())
    }
    fn name(&self) -> &'static str {
        "reports"
    }
}

/// A terminal table in the reports' style: condensed borders, wrapped to the terminal.
pub(crate) fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic);
    t
}

/// Keeps every word of a table whole on a narrow terminal: each column at least as wide
/// as its longest word (header and cells), so cells wrap between words (`peak` over
/// `allocated`, never `alloca` over `ted`, nor a setting a user copies split), and a
/// table wider than the terminal runs past its edge rather than break a word. Where
/// standard output is not a terminal, `COLUMNS` (when set) is the width to wrap to.
pub(crate) fn keep_words(t: &mut Table) {
    use comfy_table::{ColumnConstraint, Width};
    use std::io::IsTerminal;
    let mut widest: Vec<usize> = Vec::new();
    let rows = t.header().into_iter().chain(t.row_iter());
    for row in rows {
        for (i, cell) in row.cell_iter().enumerate() {
            let w = cell
                .content()
                .split_whitespace()
                .map(|word| word.chars().count())
                .max()
                .unwrap_or(0);
            if widest.len() <= i {
                widest.resize(i + 1, 0);
            }
            widest[i] = widest[i].max(w);
        }
    }
    for (i, w) in widest.into_iter().enumerate() {
        if let Some(col) = t.column_mut(i) {
            // The width counts the cell's padding, one space each side.
            let w = u16::try_from(w + 2).unwrap_or(u16::MAX);
            col.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(w)));
        }
    }
    if !std::io::stdout().is_terminal() {
        if let Some(cols) = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<u16>().ok())
            .filter(|&c| c >= 20)
        {
            t.set_width(cols);
        }
    }
}

/// A right-aligned cell (numbers).
pub(crate) fn right(text: String) -> Cell {
    Cell::new(text).set_alignment(CellAlignment::Right)
}
