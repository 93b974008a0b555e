//! The builder: settings, checked at `build()`.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tch::nn::Variables;
use tch::Device;

use super::recorder::Recorder;
use super::session::Session;
use crate::error::{Error, Result};
use crate::ffi::MAX_DEVICES;
use crate::leaks::LeakHunter;
use crate::oom::OomState;
use crate::report::csv::{run_stem, CsvReport};
use crate::report::html_page::HtmlReport;
use crate::report::terminal::TerminalReport;
use crate::report::Reports;
use crate::vars::{self, ParamSync, VarTable};

use super::measure::device_name;
use super::{MemoryProfiler, Shared};

/// Default number of variables listed by name in the terminal report.
pub(crate) const DEFAULT_TOP_VARIABLES: usize = 10;

/// Builds a [`MemoryProfiler`]; see [`MemoryProfiler::builder`].
#[derive(Debug, Clone)]
#[must_use = "call .build() to start profiling"]
pub struct MemoryProfilerBuilder {
    pub(super) variables: Arc<Mutex<Variables>>,
    pub(super) device: Device,
    print_period: usize,
    print: bool,
    csv: bool,
    csv_dir: PathBuf,
    wide_csv: bool,
    /// The step's files are written by the caller, beside the run's, under their plain
    /// names (`tch-memprof profile`): the CSV sink writes none of its own.
    plain_step_files: bool,
    html: bool,
    top_variables: usize,
    timeline: bool,
    timeline_step: Option<u64>,
    idle_at_peak: bool,
    leak_check: bool,
    leak_threshold: u64,
    leak_warmup_epochs: u64,
    label: Option<String>,
    forget_earlier_cpu_blocks: bool,
}

impl MemoryProfilerBuilder {
    /// For tests of the CUDA accounting on a machine without a GPU: the CPU accounting
    /// sees only what is reported after the session starts, as CUDA's reporter does (the
    /// variables are then known from the tensors themselves, as on CUDA). The mode lasts
    /// for the rest of the process: use it in a test process of its own.
    #[doc(hidden)]
    pub fn cpu_reports_only_after_start(mut self, on: bool) -> Self {
        self.forget_earlier_cpu_blocks = on;
        self
    }

    /// Report every `n`-th `record_stats` call (default 1: every iteration). Must be at
    /// least 1. Every iteration is still measured, so epoch peaks cover all of them.
    pub fn print_period(mut self, n: usize) -> Self {
        self.print_period = n;
        self
    }

    /// Print reports on the terminal (standard output). Default true.
    pub fn print(mut self, on: bool) -> Self {
        self.print = on;
        self
    }

    /// Write CSV files (default false). See the crate docs for their columns.
    pub fn csv(mut self, on: bool) -> Self {
        self.csv = on;
        self
    }

    /// Folder of the CSV files (default `memory_csv_data`), created if missing.
    pub fn csv_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.csv_dir = dir.as_ref().to_path_buf();
        self
    }

    /// Also write `<run>_report.html` (default off): the run's self-contained HTML report
    /// (memory over steps by category, epochs, parameters, the profiled step, leaks,
    /// out-of-memory reports), rebuilt from the run's CSV files at each `epoch_end` and
    /// when the profiler drops. Turns `csv` on: the report is made from those files.
    pub fn html(mut self, on: bool) -> Self {
        self.html = on;
        if on {
            self.csv = true;
        }
        self
    }

    /// Also write `<run>_wide.csv`: one column per variable and one per gradient, the
    /// layout of the original Python tool (default false).
    pub fn wide_csv(mut self, on: bool) -> Self {
        self.wide_csv = on;
        self
    }

    /// The step's files are the caller's, under their plain names beside the run's
    /// (`timeline.csv`, `layers.csv`, `idle.csv`, `step.png`: what `tch-memprof profile`
    /// writes): the CSV sink writes no `<run>_timeline.*`, `<run>_step<n>_*` or
    /// `<run>_idle.csv`, and `<run>_run.csv` says where the step is, for the readers of
    /// runs.
    pub(crate) fn plain_step_files(mut self, on: bool) -> Self {
        self.plain_step_files = on;
        self
    }

    /// Variables listed by name in the terminal report, largest first; the rest are
    /// summed in one row (default 10; 0 hides the table).
    pub fn top_variables(mut self, n: usize) -> Self {
        self.top_variables = n;
        self
    }

    /// Records the anatomy of iterations: live bytes by category (PARAM, BUFFER, GRAD,
    /// ACT, TEMP, OPT, OTHER) after every op, per-layer memory and FLOPs. The profile of
    /// the step with the run's highest peak is kept ([`MemoryProfiler::peak_step_profile`]),
    /// printed and written (CSV and plots, with `csv` on) at each `epoch_end` where it
    /// changed. Off by default: it logs every allocation of the iteration, and records
    /// every op (with its inputs) in the iterations that learn them, the others taking
    /// their op events from the last one that learned (docs/step-anatomy.md; its
    /// measured cost in docs/in-a-training-run.md).
    pub fn timeline(mut self, on: bool) -> Self {
        self.timeline = on;
        self
    }

    /// Profiles step `n` (the iteration that the n-th `record_stats` call ends,
    /// counting from 1) and reports it when it ends, to the terminal and to
    /// `<run>_step<n>_timeline.csv`, `_layers.csv`, `.png`, `.svg`. Turns the timeline
    /// on. `n = 0` is refused at `build`.
    pub fn timeline_step(mut self, n: u64) -> Self {
        self.timeline_step = Some(n);
        self
    }

    /// Finds, in the step asked for with [`timeline_step`](Self::timeline_step), the
    /// blocks idle at its peak: made in the step, live at the peak, but read by no op
    /// after it ([`StepProfile::idle`](crate::StepProfile::idle)): their bytes, the op
    /// that made each, its last reader, the source line that allocated it, and the
    /// step's peak had each (and all) been freed right after its last read. Off by
    /// default: that step logs every op's inputs and the call stack of every allocation
    /// (see docs/step-anatomy.md for its cost). Needs `timeline_step`; refused at
    /// `build` without it.
    pub fn idle_at_peak(mut self, on: bool) -> Self {
        self.idle_at_peak = on;
        self
    }

    /// Hunts for leaks at each `epoch_end` (default true): live blocks that are not
    /// weights or gradients, grouped by the op, phase and layer that made them, are
    /// compared with the previous epoch end; groups that keep growing are reported
    /// (terminal, `log::warn!`, `<run>_leaks.csv`, [`MemoryProfiler::last_leaks`]).
    /// Costs a registry entry per live block and the op inputs of each outermost op
    /// (see docs/in-a-training-run.md for the measured overhead).
    pub fn leak_check(mut self, on: bool) -> Self {
        self.leak_check = on;
        self
    }

    /// Growth of live bytes (outside weights and gradients) between two epoch ends
    /// that names the growing groups at once (default 1 MiB). Smaller growth is named
    /// when the same group grows at two epoch ends in a row.
    pub fn leak_threshold(mut self, bytes: u64) -> Self {
        self.leak_threshold = bytes;
        self
    }

    /// Epochs that only set the leak hunt's baseline (default 1): optimizer state and
    /// caches are created in the first epoch and are not leaks. At least 1.
    pub fn leak_warmup_epochs(mut self, n: u64) -> Self {
        self.leak_warmup_epochs = n;
        self
    }

    /// What to call the run where runs are shown together (`tch-memprof report`,
    /// `diff`): the setting that tells it from the others, say `"batch 16"` or
    /// `"resnet50 bf16"`. Written to `<run>_run.csv` (the `label` row). Without one, a
    /// run is called by its folder. One line of at most 200 characters, no control
    /// characters; checked at `build`.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Starts profiling. Fails when a setting is invalid (naming it and why), when
    /// another profiler is alive in the process, or when the native layer cannot start.
    pub fn build(self) -> Result<MemoryProfiler> {
        if self.timeline_step == Some(0) {
            return Err(Error::InvalidConfig {
                name: "timeline_step",
                value: "0".into(),
                reason: "steps are counted from 1 (the first record_stats call ends step 1)".into(),
            });
        }
        if self.idle_at_peak && self.timeline_step.is_none() {
            return Err(Error::InvalidConfig {
                name: "idle_at_peak",
                value: "true".into(),
                reason: "needs timeline_step(n): the step whose peak is examined".into(),
            });
        }
        if self.leak_warmup_epochs == 0 {
            return Err(Error::InvalidConfig {
                name: "leak_warmup_epochs",
                value: "0".into(),
                reason: "must be at least 1: the first epoch end has nothing to compare with, \
                         and optimizer state appears during the first epoch"
                    .into(),
            });
        }
        if let Some(label) = &self.label {
            crate::runs::check_label(label).map_err(|reason| Error::InvalidConfig {
                name: "label",
                value: label.clone(),
                reason,
            })?;
        }
        if self.print_period == 0 {
            return Err(Error::InvalidConfig {
                name: "print_period",
                value: "0".into(),
                reason: "must be at least 1 (report every n-th record_stats call)".into(),
            });
        }
        let slot = match self.device {
            Device::Cpu => 0,
            Device::Cuda(i) if i < MAX_DEVICES - 1 => 1 + i,
            other => {
                return Err(Error::InvalidConfig {
                    name: "VarStore device",
                    value: format!("{other:?}"),
                    reason: "only the CPU and cuda:0..15 are supported".into(),
                })
            }
        };
        let start = chrono::Local::now();
        let csv = if self.csv {
            let csv_dir_error = |reason: String| Error::InvalidConfig {
                name: "csv_dir",
                value: self.csv_dir.display().to_string(),
                reason,
            };
            if self.csv_dir.as_os_str().is_empty() {
                return Err(csv_dir_error("is empty".into()));
            }
            crate::fs::create_dir_all(&self.csv_dir)
                .map_err(|e| csv_dir_error(format!("cannot be created: {}", source_of(&e))))?;
            crate::fs::check_writable(&self.csv_dir)
                .map_err(|e| csv_dir_error(format!("is not writable: {}", source_of(&e))))?;
            Some(run_stem(&self.csv_dir, start))
        } else {
            None
        };
        let stem = csv
            .clone()
            .unwrap_or_else(|| run_stem(&self.csv_dir, start));

        let timeline = self.timeline || self.timeline_step.is_some();
        if self.forget_earlier_cpu_blocks && self.device == Device::Cpu {
            crate::ffi::forget_cpu_blocks()?;
        }
        let mut session = Session::start(
            matches!(self.device, Device::Cuda(_)),
            timeline.then_some(slot),
            self.leak_check,
        )?;
        // Blocks born before the session that the counters never saw (on CUDA: the
        // model moved to the GPU before the profiler was built) are known from the
        // variables themselves: counted from now on, their frees seen.
        {
            let vars = vars::lock(&self.variables);
            let tensors: Vec<&tch::Tensor> = vars.named_variables.values().collect();
            crate::ffi::adopt_blocks(&tensors)?;
        }
        let mut params = ParamSync::default();
        let mut table = VarTable::default();
        let mut recorder =
            timeline.then(|| Recorder::new(slot, self.timeline_step, self.idle_at_peak));
        if self.leak_check || timeline {
            // Layers of the first iteration's ops, and what is live when it begins.
            table.refresh(&vars::lock(&self.variables))?;
            params.sync(&table)?;
            if let Some(r) = recorder.as_mut() {
                r.begin(&table, 1)?;
            }
        }

        let mut reports = Reports::default();
        if self.print {
            reports.push(Box::new(TerminalReport {
                top_variables: self.top_variables,
                top_layers: self.top_variables.max(1),
            }));
        }
        let mut csv_paths = Vec::new();
        let mut html_path = None;
        if let Some(stem) = &csv {
            let cpu = !matches!(self.device, Device::Cuda(_));
            let sink = CsvReport::new(&self.csv_dir, stem, self.wide_csv, cpu)
                .with_step_files(!self.plain_step_files);
            csv_paths = sink.paths();
            // What made the run, for comparing runs later (tch-memprof diff): written
            // once, now.
            let meta = self.csv_dir.join(format!("{stem}_run.csv"));
            crate::report::csv::write_meta(
                &meta,
                &crate::report::csv::RunMeta {
                    device: &device_name(self.device),
                    started: &start.format("%Y-%m-%dT%H:%M:%S%:z").to_string(),
                    label: self.label.as_deref(),
                    print_period: self.print_period,
                    timeline_step: self.timeline_step,
                    plain_step_files: self.plain_step_files,
                },
            )?;
            csv_paths.push(meta);
            reports.push(Box::new(sink));
            if self.html {
                // After the CSV sink: it reads what that one just wrote.
                let sink = HtmlReport::new(self.csv_dir.join(stem));
                html_path = Some(sink.path());
                reports.push(Box::new(sink));
            }
        }
        let shared = Arc::new(Mutex::new(Shared {
            reports,
            oom: OomState::new(slot, device_name(self.device)),
            oom_dir: self.csv_dir.clone(),
            oom_stem: stem.clone(),
        }));
        let hook = Arc::clone(&shared);
        session.on_oom(move |event| super::on_oom(&hook, event))?;

        let mut profiler = MemoryProfiler {
            variables: self.variables,
            device: self.device,
            slot,
            print_period: self.print_period as u64,
            shared,
            csv_paths,
            html_path,
            step_files_stem: csv.map(|stem| (self.csv_dir, stem)),
            epoch: 1,
            iteration: 0,
            step: 0,
            epoch_peaks: Default::default(),
            run_peaks: Default::default(),
            allocated_at_epoch_start: 0,
            last: None,
            epochs: Vec::new(),
            failures: 0,
            log_reader: crate::ffi::LogReader::default(),
            recorder,
            params,
            table,
            sums: Default::default(),
            device_memory: Default::default(),
            hunter: self
                .leak_check
                .then(|| LeakHunter::new(slot, self.leak_threshold, self.leak_warmup_epochs)),
            last_leaks: None,
            history_entries: 0,
            _session: session,
            _not_send: PhantomData,
        };
        profiler.allocated_at_epoch_start = profiler.allocated_now().unwrap_or(0);
        Ok(profiler)
    }
}

fn source_of(e: &Error) -> String {
    match e {
        Error::Io { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

impl MemoryProfiler {
    /// A builder over the model's VarStore. The profiler keeps a handle to the store's
    /// variables, not a borrow of the store: `vs.freeze()`, `vs.load()` and the rest
    /// stay usable, and variables added later are seen.
    pub fn builder(vs: &tch::nn::VarStore) -> MemoryProfilerBuilder {
        MemoryProfilerBuilder {
            variables: Arc::clone(&vs.variables_),
            device: vs.device(),
            print_period: 1,
            print: true,
            csv: false,
            csv_dir: PathBuf::from("memory_csv_data"),
            wide_csv: false,
            plain_step_files: false,
            html: false,
            top_variables: DEFAULT_TOP_VARIABLES,
            timeline: false,
            timeline_step: None,
            idle_at_peak: false,
            leak_check: true,
            leak_threshold: crate::leaks::DEFAULT_LEAK_THRESHOLD,
            leak_warmup_epochs: crate::leaks::DEFAULT_WARMUP_EPOCHS,
            label: None,
            forget_earlier_cpu_blocks: false,
        }
    }
}
