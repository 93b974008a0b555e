//! CSV files under the CSV folder, one set per run, named by the run's start time.
//!
//! - `<run>_summary.csv`: one row per reported iteration (fixed columns).
//! - `<run>_parameters.csv`: long form, one row per variable and gradient, the whole set
//!   written at a report where it changed and at an epoch's first report.
//! - `<run>_epochs.csv`: one row per `epoch_end`.
//! - `<run>_leaks.csv`: one row per leak suspect per `epoch_end`, only once there is one.
//! - `<run>_wide.csv` (option): one column per variable and per gradient, as the
//!   original Python tool wrote.
//!
//! Every row is flushed to the operating system before `record_stats` returns, so a
//! process killed at any moment leaves files that parse, with every completed row. A
//! file deleted during the run is recreated with its header: a file written at every
//! report by the first row of a later second (its link count is read once a second),
//! the epochs' and the leaks' files by their next row.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format;
use crate::fs;
use crate::leaks::LeakReport;
use crate::runs::schema::{
    EpochRow, LayerRow, LeakRow, MetaRow, SummaryRow, TimelineRow, IDLE, RESIDENT_COLUMNS,
    STEP_FILES,
};
use crate::stats::{EpochStats, IterationStats, VariableList};
use crate::timeline::{Category, StepFiles, StepKind, StepProfile};

use super::clock::Clock;
use super::parameter_rows::{parameter_header, parameter_tails, Tails};
use super::plot::plot_step;
use super::summary_rows::{fill_summary_row, summary_line};
use super::Report;

/// One CSV file, opened at its first row and reopened if it vanishes.
struct CsvFile {
    path: PathBuf,
    writer: Option<csv::Writer<File>>,
    /// Header names replaced when the file is written (the resident columns of a CPU
    /// run).
    renames: &'static [(&'static str, &'static str)],
    /// The second (of the run's monotonic clock) of the last link count check, or of
    /// the file's creation.
    checked: Option<u64>,
    /// The open file was found unlinked and dropped; the next row's error says so.
    lost: bool,
}

impl CsvFile {
    fn new(path: PathBuf) -> Self {
        CsvFile {
            path,
            writer: None,
            renames: &[],
            checked: None,
            lost: false,
        }
    }

    /// A file whose header names `renames` replaces (`(serde's name, the file's)`).
    fn renaming(mut self, renames: &'static [(&'static str, &'static str)]) -> Self {
        self.renames = renames;
        self
    }

    /// Renames the header the first row wrote, then goes on appending without one.
    fn rename_header(&mut self) -> Result<()> {
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        // The writer is kept until the renamed file is open: a failure on the way leaves
        // it writing to the file as it was (or to the replaced one, whose link count the
        // next check finds at zero).
        if let Some(w) = self.writer.as_mut() {
            w.flush().map_err(io)?;
        }
        let text = std::fs::read_to_string(&self.path).map_err(io)?;
        let (header, rest) = text.split_once('\n').unwrap_or((&text, ""));
        let header: Vec<&str> = header
            .split(',')
            .map(|h| {
                self.renames
                    .iter()
                    .find(|(from, _)| *from == h)
                    .map_or(h, |(_, to)| *to)
            })
            .collect();
        // A process killed here leaves the first row, under one header or the other.
        fs::write_atomic(
            &self.path,
            format!("{}\n{rest}", header.join(",")).as_bytes(),
        )?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io)?;
        self.writer = Some(
            csv::WriterBuilder::new()
                .has_headers(false)
                .from_writer(file),
        );
        Ok(())
    }

    /// Writes one row with `write` and flushes it. If the file vanished (its folder
    /// deleted, say), it is recreated, the row is written, and an error says the earlier
    /// rows are lost. `second` (of the run's monotonic clock): the file is checked once
    /// in that second ([`CsvFile::check_links`]); `None`: checked now.
    fn append(
        &mut self,
        second: Option<u64>,
        write: impl FnOnce(&mut csv::Writer<File>) -> csv::Result<()>,
    ) -> Result<()> {
        self.append_fresh(second, |w, _| write(w))
    }

    /// Drops the open file if it was unlinked (the file or its folder deleted: no links
    /// left to it, as its descriptor tells without walking the path again), read at most
    /// once in each `second` (`None`: read now). A system call at every row cost a few
    /// microseconds of a launch-bound step; rows written to a deleted file within the
    /// second before the check are lost with the file.
    fn check_links(&mut self, second: Option<u64>) {
        use std::os::unix::fs::MetadataExt;
        let Some(w) = self.writer.as_ref() else {
            return;
        };
        if second.is_some() && second == self.checked {
            return;
        }
        self.checked = second;
        if w.get_ref().metadata().is_ok_and(|m| m.nlink() == 0) {
            self.writer = None;
            self.lost = true;
        }
    }

    /// Whether the next row starts the file anew: never opened, or unlinked
    /// ([`CsvFile::check_links`]).
    fn gone(&mut self, second: Option<u64>) -> bool {
        self.check_links(second);
        self.writer.is_none()
    }

    /// [`CsvFile::append`], `write` told whether the file is new (no header written yet).
    fn append_fresh(
        &mut self,
        second: Option<u64>,
        write: impl FnOnce(&mut csv::Writer<File>, bool) -> csv::Result<()>,
    ) -> Result<()> {
        self.check_links(second);
        let mut created = false;
        if self.writer.is_none() {
            if let Some(dir) = self.path.parent() {
                fs::create_dir_all(dir)?;
            }
            let file = fs::create_new(&self.path)?;
            self.writer = Some(csv::Writer::from_writer(file));
            self.checked = second;
            created = true;
        }
        let w = self.writer.as_mut().expect("opened above");
        let csv_err = |source| Error::Csv {
            path: self.path.clone(),
            source,
        };
        write(w, created).map_err(csv_err)?;
        if created && !self.renames.is_empty() {
            self.rename_header()?;
        }
        let w = self.writer.as_mut().expect("opened above");
        w.flush().map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        if std::mem::take(&mut self.lost) {
            return Err(Error::Io {
                path: self.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the file vanished during the run; recreated it, earlier rows are lost",
                ),
            });
        }
        Ok(())
    }
}

/// The CSV sink of one run.
pub(crate) struct CsvReport {
    dir: PathBuf,
    stem: String,
    summary: CsvFile,
    parameters: CsvFile,
    epochs: CsvFile,
    leaks: CsvFile,
    wide: Option<CsvFile>,
    /// Wide layout columns, fixed at its first row.
    wide_columns: Vec<String>,
    /// The parameter rows of the last variable list reported, each encoded from its
    /// `parameter` column on: a list that stays the same (the same shared list, which
    /// the profiler keeps while no variable changes) is not encoded again.
    parameter_tails: Option<(VariableList, Tails)>,
    /// The epoch of the last report that wrote the parameter rows, `None` before the
    /// first or after a failed write (the next report writes them).
    parameters_written_epoch: Option<u64>,
    /// The sink writes the profiled steps' files (`false`: the caller writes them under
    /// their plain names, [`STEP_FILES`]).
    step_files: bool,
    clock: Clock,
    /// The parameter rows of the step being written.
    parameter_block: Vec<u8>,
    /// When the sink was made: the files' link checks go by its seconds.
    started: std::time::Instant,
    /// The summary row being written, as a row and as its line.
    summary_row: SummaryRow,
    summary_line: Vec<u8>,
}

/// The run's file-name stem: `YYYYmmdd-HHMMSS`, `-rank<R>` when RANK is set, and
/// `-2`, `-3`, ... when files of that stem already exist in `dir`.
pub(crate) fn run_stem(dir: &Path, start: chrono::DateTime<chrono::Local>) -> String {
    let mut base = start.format("%Y%m%d-%H%M%S").to_string();
    if let Ok(rank) = std::env::var("RANK") {
        let rank: String = rank.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        if !rank.is_empty() {
            base.push_str(&format!("-rank{rank}"));
        }
    }
    let taken = |stem: &str| {
        let prefix = format!("{stem}_");
        std::fs::read_dir(dir)
            .map(|entries| {
                entries.flatten().any(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|n| n.starts_with(&prefix))
                })
            })
            .unwrap_or(false)
    };
    if !taken(&base) {
        return base;
    }
    (2..)
        .map(|i| format!("{base}-{i}"))
        .find(|s| !taken(s))
        .expect("an unused suffix exists")
}

impl CsvReport {
    /// `cpu`: the run is on the CPU, whose reserved columns hold the process's resident
    /// memory and are named for it ([`RESIDENT_COLUMNS`]).
    pub(crate) fn new(dir: &Path, stem: &str, wide: bool, cpu: bool) -> Self {
        let file = |suffix: &str| CsvFile::new(dir.join(format!("{stem}_{suffix}.csv")));
        let renames: &'static [(&'static str, &'static str)] =
            if cpu { &RESIDENT_COLUMNS } else { &[] };
        CsvReport {
            dir: dir.to_path_buf(),
            stem: stem.to_string(),
            summary: file("summary").renaming(renames),
            parameters: file("parameters"),
            epochs: file("epochs").renaming(renames),
            leaks: file("leaks"),
            wide: wide.then(|| file("wide")),
            wide_columns: Vec::new(),
            parameter_tails: None,
            parameters_written_epoch: None,
            step_files: true,
            clock: Clock::default(),
            parameter_block: Vec::new(),
            started: std::time::Instant::now(),
            summary_row: SummaryRow::default(),
            summary_line: Vec::new(),
        }
    }

    /// Whether the sink writes the profiled steps' files.
    pub(crate) fn with_step_files(mut self, on: bool) -> Self {
        self.step_files = on;
        self
    }

    /// Paths of the files this run writes (some may not exist yet; the leaks file
    /// exists only once a suspect was found).
    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        let mut v = vec![
            self.summary.path.clone(),
            self.parameters.path.clone(),
            self.epochs.path.clone(),
            self.leaks.path.clone(),
        ];
        if let Some(w) = &self.wide {
            v.push(w.path.clone());
        }
        v
    }
}

/// What `<run>_run.csv` records beyond the versions.
pub(crate) struct RunMeta<'a> {
    pub device: &'a str,
    pub started: &'a str,
    pub label: Option<&'a str>,
    pub print_period: usize,
    /// The step asked for with `timeline_step`.
    pub timeline_step: Option<u64>,
    /// The step's files are the caller's, under their plain names ([`STEP_FILES`]).
    pub plain_step_files: bool,
}

/// Writes `<run>_run.csv` (what made the run: versions, device, start, the user's label,
/// the report period, the step asked for with `timeline_step`), once, at build.
pub(crate) fn write_meta(path: &Path, m: &RunMeta<'_>) -> Result<()> {
    let mut rows = vec![
        MetaRow::new("tch_memprof", env!("CARGO_PKG_VERSION")),
        MetaRow::new("libtorch", crate::LIBTORCH_VERSION),
        MetaRow::new("device", m.device),
        MetaRow::new("started", m.started),
        MetaRow::new("print_period", m.print_period.to_string()),
    ];
    if let Some(label) = m.label {
        rows.push(MetaRow::new("label", label));
    }
    if let Some(step) = m.timeline_step {
        rows.push(MetaRow::new("timeline_step", step.to_string()));
    }
    if m.plain_step_files {
        rows.push(MetaRow::new(STEP_FILES.0, STEP_FILES.1));
    }
    write_atomically(path, |w| rows.iter().try_for_each(|r| w.serialize(r)))
}

impl CsvReport {
    /// The iteration's rows: `now` (after the Unix epoch) their timestamp, `second` (of
    /// the run's monotonic clock, [`CsvReport::started`]) the second whose first row
    /// checks the files' links; a wall clock set back, frozen or before 1970 would not
    /// move on to a new second.
    fn iteration_at(
        &mut self,
        s: &IterationStats,
        now: std::time::Duration,
        second: u64,
    ) -> Result<()> {
        let second = Some(second);
        // The row kept from the last report, its fields replaced (its strings' room
        // reused): nothing allocated, nothing formatted through fmt at a steady row.
        let row = &mut self.summary_row;
        self.clock.write(now, &mut row.timestamp);
        fill_summary_row(row, s);
        // The file's first row through serde, which writes the header from the row type;
        // the others as one line of bytes (summary_line), straight to the file.
        let line = &mut self.summary_line;
        let mut first_error = self
            .summary
            .append_fresh(second, |w, fresh| {
                if fresh || !summary_line(line, row) {
                    return w.serialize(&*row);
                }
                w.flush()?;
                let mut file: &File = w.get_ref();
                std::io::Write::write_all(&mut file, line)?;
                Ok(())
            })
            .err();
        let ts = &self.summary_row.timestamp;

        // The parameter rows: the whole set when it differs from the set last written
        // (a variable or gradient appeared, went, or changed its dtype, shape or
        // bytes), at an epoch's first report, and when the file is new or vanished;
        // an iteration without rows has those of the latest set before it. Rows that
        // would repeat the last set at every step made the file grow by every variable
        // a step, and writing them was most of what the CSV cost a step.
        let same_list = matches!(&self.parameter_tails,
            Some((list, _)) if list.same_list(&s.variables));
        let mut changed = false;
        if !same_list {
            let tails = parameter_tails(s).map_err(|source| Error::Csv {
                path: self.parameters.path.clone(),
                source,
            })?;
            // A new list of the same rows (a gradient that went and came back as it
            // was) changes nothing in the file.
            changed = self
                .parameter_tails
                .as_ref()
                .map_or(true, |(_, old)| old.bytes != tails.bytes);
            self.parameter_tails = Some((s.variables.clone(), tails));
        }
        let due = changed
            || self.parameters_written_epoch != Some(s.epoch)
            || self.parameters.gone(second);
        if due {
            let tails = &self.parameter_tails.as_ref().expect("set above").1;
            // The rows' bytes, in a buffer kept from one set to the next: a block of this
            // size allocated each time made glibc consolidate the step's freed chunks.
            let block = &mut self.parameter_block;
            let mut wrote = false;
            let result = self.parameters.append_fresh(second, |w, fresh| {
                if fresh {
                    // A new file: its header, from the row type.
                    w.write_record(&parameter_header()?)?;
                }
                // Each row: its timestamp, epoch and iteration, then its encoded tail
                // (the timestamp's format and the numbers need no quoting).
                block.clear();
                let lead = format!("{ts},{},{},", s.epoch, s.iteration);
                for line in tails.lines() {
                    block.extend_from_slice(lead.as_bytes());
                    block.extend_from_slice(line);
                }
                // The writer's own buffer first, then the block, straight to the file.
                w.flush()?;
                let mut file: &File = w.get_ref();
                std::io::Write::write_all(&mut file, block)?;
                wrote = true;
                Ok(())
            });
            // In the file (a vanished file's too, recreated, whose error says the
            // earlier rows are lost): the next report need not write them again. A
            // failed write is tried again at the next report.
            self.parameters_written_epoch = wrote.then_some(s.epoch);
            first_error = first_error.or(result.err());
        }

        if let Some(wide) = self.wide.as_mut() {
            if self.wide_columns.is_empty() {
                self.wide_columns = s.variables.iter().map(|v| v.name.clone()).collect();
            }
            let columns = &self.wide_columns;
            let result = wide.append_fresh(second, |w, fresh| {
                // A new file, the first or one recreated after it was deleted.
                if fresh {
                    let mut header =
                        vec!["timestamp".to_string(), "epoch".into(), "iteration".into()];
                    header.extend(columns.iter().cloned());
                    header.extend(columns.iter().map(|c| format!("{c} grad")));
                    w.write_record(&header)?;
                }
                let find = |name: &str| s.variables.iter().find(|v| v.name == name);
                let mut record = vec![ts.clone(), s.epoch.to_string(), s.iteration.to_string()];
                record.extend(
                    columns
                        .iter()
                        .map(|c| find(c).map(|v| v.bytes.to_string()).unwrap_or_default()),
                );
                record.extend(columns.iter().map(|c| {
                    find(c)
                        .and_then(|v| v.grad_bytes)
                        .map(|g| g.to_string())
                        .unwrap_or_default()
                }));
                w.write_record(&record)
            });
            first_error = first_error.or(result.err());
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Report for CsvReport {
    fn iteration(&mut self, s: &IterationStats) -> Result<()> {
        let second = self.started.elapsed().as_secs();
        self.iteration_at(s, Clock::since_epoch(), second)
    }

    fn epoch(&mut self, e: &EpochStats) -> Result<()> {
        let ts = self.clock.now();
        self.epochs.append(None, |w| {
            w.serialize(EpochRow {
                timestamp: ts,
                epoch: e.epoch,
                iterations: e.iterations,
                peak_allocated_bytes: e.peak_allocated_bytes,
                peak_reserved_bytes: e.peak_reserved_bytes,
                peak_feature_maps_bytes: e.peak_feature_maps_bytes,
                peak_intermediate_gradients_bytes: e.peak_intermediate_gradients_bytes,
                allocated_bytes: e.allocated_bytes,
                allocated_change_bytes: e.allocated_change_bytes,
            })
        })
    }

    fn leaks(&mut self, r: &LeakReport) -> Result<()> {
        if r.suspects.is_empty() {
            return Ok(()); // no file, not even a header, without a suspect
        }
        self.leaks.append(None, |w| {
            for g in &r.suspects {
                w.serialize(LeakRow {
                    epoch: r.epoch,
                    op: g.op.clone(),
                    phase: g.phase,
                    layer: g.layer.clone(),
                    first_iteration: g.first_iteration,
                    last_iteration: g.last_iteration,
                    count: g.count,
                    bytes: g.bytes,
                })?;
            }
            Ok(())
        })
    }

    fn step_profile(&mut self, p: &StepProfile, kind: StepKind) -> Result<()> {
        if !self.step_files {
            return Ok(());
        }
        let files = match kind {
            StepKind::Requested(step) => {
                StepFiles::beside(&self.dir, &format!("{}_step{step}", self.stem))
            }
            StepKind::Peak | StepKind::PeakAtExit => StepFiles::beside(&self.dir, &self.stem),
        };
        write_timeline_csv(p, &files.timeline_csv)?;
        write_layers_csv(p, &files.layers_csv)?;
        if let (StepKind::Requested(_), Some(_)) = (kind, &p.idle) {
            write_idle_csv(p, &self.dir.join(format!("{}{IDLE}", self.stem)))?;
        }
        let title = format!(
            "Live memory by category, step {} ({}), peak {}",
            p.step,
            p.device,
            format::bytes(p.peak.bytes)
        );
        plot_step(p, &files.png, Some(&title))?;
        plot_step(p, &files.svg, Some(&title))
    }

    fn name(&self) -> &'static str {
        "csv"
    }
}

/// Writes the timeline as CSV: `op_index, op, phase, layer`, one `<category>_bytes`
/// column per category, `total_bytes`, `peak_bytes` and `idle_bytes`. Replaces the file atomically.
pub fn write_timeline_csv(p: &StepProfile, path: &Path) -> Result<()> {
    write_atomically(path, |w| {
        for r in &p.rows {
            let b = &r.bytes;
            w.serialize(TimelineRow {
                op_index: r.op_index,
                op: r.op.clone(),
                phase: r.phase,
                layer: r.layer.clone(),
                param_bytes: b.get(Category::Param),
                buffer_bytes: b.get(Category::Buffer),
                grad_bytes: b.get(Category::Grad),
                act_bytes: b.get(Category::Act),
                temp_bytes: b.get(Category::Temp),
                opt_bytes: b.get(Category::Opt),
                workspace_bytes: b.get(Category::Workspace),
                other_bytes: b.get(Category::Other),
                total_bytes: b.total(),
                peak_bytes: r.peak_bytes,
                idle_bytes: r.idle_bytes,
            })?;
        }
        Ok(())
    })
}

/// Writes the files of one step into `dir` (made if missing), as
/// `tch-memprof profile` and `tch-memprof estimate --output-dir` write them:
/// `step.png` and `step.svg` (the plot, titled `title`), `timeline.csv`, `layers.csv`,
/// `idle.csv` and `summary.txt`. Returns their paths in that order.
pub fn write_step_files(p: &StepProfile, dir: &Path, title: &str) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let file = |name: &str| dir.join(name);
    plot_step(p, &file("step.png"), Some(title))?;
    plot_step(p, &file("step.svg"), Some(title))?;
    write_timeline_csv(p, &file("timeline.csv"))?;
    write_layers_csv(p, &file("layers.csv"))?;
    write_idle_csv(p, &file("idle.csv"))?;
    let summary = file("summary.txt");
    write_summary(&summary, p).map_err(|source| Error::Io {
        path: summary.clone(),
        source,
    })?;
    Ok([
        "step.png",
        "step.svg",
        "timeline.csv",
        "layers.csv",
        "idle.csv",
        "summary.txt",
    ]
    .iter()
    .map(|n| file(n))
    .collect())
}

/// Writes the blocks idle at the peak as CSV (nothing without the step detail):
/// `bytes, op, layer, phase, last_read_op, freed_at_op, site, peak_if_dropped`,
/// largest first. Replaces the file atomically.
pub fn write_idle_csv(p: &StepProfile, path: &Path) -> Result<()> {
    write_atomically(path, |w| {
        for b in p.idle.iter().flat_map(|i| &i.blocks) {
            w.serialize(b)?;
        }
        Ok(())
    })
}

/// Writes the layers as CSV: `layer, parameters_bytes, activation_bytes,
/// forward_flops, backward_flops`. Replaces the file atomically.
pub fn write_layers_csv(p: &StepProfile, path: &Path) -> Result<()> {
    write_atomically(path, |w| {
        for l in &p.layers {
            w.serialize(LayerRow {
                layer: l.layer.clone(),
                parameters_bytes: l.parameters_bytes,
                activation_bytes: l.activation_bytes,
                forward_flops: l.forward_flops,
                backward_flops: l.backward_flops,
            })?;
        }
        Ok(())
    })
}

fn write_atomically(
    path: &Path,
    body: impl FnOnce(&mut csv::Writer<Vec<u8>>) -> std::result::Result<(), csv::Error>,
) -> Result<()> {
    let csv_err = |source| Error::Csv {
        path: path.to_path_buf(),
        source,
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    body(&mut w).map_err(csv_err)?;
    let bytes = w
        .into_inner()
        .map_err(|e| csv_err(csv::Error::from(e.into_error())))?;
    crate::fs::write_atomic(path, &bytes)
}

/// The step's summary: device, peak, each category's maximum, FLOPs, idle bytes.
fn write_summary(path: &Path, p: &StepProfile) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(File::create(path)?);
    let c = &p.category_max;
    writeln!(f, "device: {}", p.device)?;
    writeln!(
        f,
        "peak: {} during {}",
        format::bytes(p.peak.bytes),
        p.peak.location()
    )?;
    for cat in [
        Category::Param,
        Category::Buffer,
        Category::Grad,
        Category::Act,
        Category::Temp,
        Category::Opt,
        Category::Workspace,
        Category::Other,
    ] {
        writeln!(f, "max {}: {}", cat.label(), format::bytes(c.get(cat)))?;
    }
    writeln!(
        f,
        "FLOPs: forward {}, backward {}",
        p.forward_flops, p.backward_flops
    )?;
    if let Some(idle) = &p.idle {
        writeln!(
            f,
            "idle at the peak: {} in {} blocks; freed after their last reads: peak {} -> {}",
            format::bytes(idle.bytes),
            idle.blocks.len(),
            format::bytes(idle.peak),
            format::bytes(idle.peak_if_dropped)
        )?;
    }
    f.flush()
}

#[cfg(test)]
#[path = "csv_tests.rs"]
mod tests;
