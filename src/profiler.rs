//! The profiler a training loop drives: `record_stats` after each iteration,
//! `epoch_end` after each epoch.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tch::nn::{VarStore, Variables};
use tch::Device;

use crate::accounting::{self, BlockInfo};
use crate::budget::{Budget, BudgetExceeded};
use crate::capture::Capture;
use crate::csv_report::{self, CsvReport};
use crate::error::{Error, Result};
use crate::ffi::{self, LogEvent};
use crate::leaks::{LeakHunter, LeakReport};
use crate::oom::OomReport;
use crate::report::{Report, TerminalReport};
use crate::stats::{EpochStats, IterationStats, RunStats, VariableKind, VariableStats};
use crate::timeline::StepProfile;

/// One profiler per process: the allocator hooks are process-wide.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Default number of variables listed by name in the terminal report.
pub const DEFAULT_TOP_VARIABLES: usize = 10;

/// Builds a [`MemoryProfiler`]; see [`MemoryProfiler::builder`].
#[derive(Debug, Clone)]
#[must_use = "call .build() to start profiling"]
pub struct MemoryProfilerBuilder {
    variables: Arc<Mutex<Variables>>,
    device: Device,
    print_period: usize,
    print: bool,
    csv: bool,
    csv_dir: PathBuf,
    wide_csv: bool,
    top_variables: usize,
    timeline: bool,
    timeline_step: Option<u64>,
    leak_check: bool,
    leak_threshold: u64,
    leak_warmup_epochs: u64,
}

impl MemoryProfilerBuilder {
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

    /// Also write `<run>_wide.csv`: one column per variable and one per gradient, the
    /// layout of the original Python tool (default false).
    pub fn wide_csv(mut self, on: bool) -> Self {
        self.wide_csv = on;
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
    /// changed. Off by default: it asks libtorch for every op's inputs and logs every
    /// allocation of the iteration (see the README for its measured cost).
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

    /// Hunts for leaks at each `epoch_end` (default true): live blocks that are not
    /// weights or gradients, grouped by the op, phase and layer that made them, are
    /// compared with the previous epoch end; groups that keep growing are reported
    /// (terminal, `log::warn!`, `<run>_leaks.csv`, [`MemoryProfiler::last_leaks`]).
    /// Costs a registry entry per live block and the op inputs of each outermost op
    /// (see the README for the measured overhead).
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
        if self.leak_warmup_epochs == 0 {
            return Err(Error::InvalidConfig {
                name: "leak_warmup_epochs",
                value: "0".into(),
                reason: "must be at least 1: the first epoch end has nothing to compare with, \
                         and optimizer state appears during the first epoch"
                    .into(),
            });
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
            Device::Cuda(i) if i < ffi::MAX_DEVICES - 1 => 1 + i,
            other => {
                return Err(Error::InvalidConfig {
                    name: "VarStore device",
                    value: format!("{other:?}"),
                    reason: "only the CPU and cuda:0..15 are supported".into(),
                })
            }
        };
        let csv_dir_error = |reason: String| Error::InvalidConfig {
            name: "csv_dir",
            value: self.csv_dir.display().to_string(),
            reason,
        };
        let start = chrono::Local::now();
        let mut stem_for_timeline = None;
        let csv = if self.csv {
            if self.csv_dir.as_os_str().is_empty() {
                return Err(csv_dir_error("is empty".into()));
            }
            crate::fs::create_dir_all(&self.csv_dir)
                .map_err(|e| csv_dir_error(format!("cannot be created: {}", source_of(&e))))?;
            crate::fs::check_writable(&self.csv_dir)
                .map_err(|e| csv_dir_error(format!("is not writable: {}", source_of(&e))))?;
            let stem = csv_report::run_stem(&self.csv_dir, start);
            stem_for_timeline = Some((self.csv_dir.clone(), stem.clone()));
            Some(CsvReport::new(&self.csv_dir, &stem, self.wide_csv))
        } else {
            None
        };

        let oom_stem = match &stem_for_timeline {
            Some((_, stem)) => stem.clone(),
            None => csv_report::run_stem(&self.csv_dir, start),
        };
        if ACTIVE
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::AlreadyActive);
        }
        let timeline = self.timeline || self.timeline_step.is_some();
        if let Err(e) = ffi::start(
            matches!(self.device, Device::Cuda(_)),
            timeline.then_some(slot),
            self.leak_check,
        ) {
            ACTIVE.store(false, Ordering::Release);
            return Err(e);
        }
        let mut params = ParamSync::default();
        if self.leak_check && !timeline {
            // Layers of the first iteration's ops (the timeline capture does it below).
            let vars = match self.variables.lock() {
                Ok(v) => v,
                Err(poisoned) => poisoned.into_inner(),
            };
            let synced = params.sync(&vars);
            drop(vars);
            if let Err(e) = synced {
                let _ = ffi::stop();
                ACTIVE.store(false, Ordering::Release);
                return Err(e);
            }
        }
        let capture = if timeline {
            let mut c = Capture::new(
                slot,
                self.timeline_step,
                self.print,
                self.top_variables.max(1),
                stem_for_timeline,
            );
            let vars = match self.variables.lock() {
                Ok(v) => v,
                Err(poisoned) => poisoned.into_inner(),
            };
            if let Err(e) = c.begin(&vars, &mut params) {
                drop(vars);
                let _ = ffi::stop();
                ACTIVE.store(false, Ordering::Release);
                return Err(e);
            }
            drop(vars);
            Some(c)
        } else {
            None
        };

        crate::oom::install(crate::oom::OomContext {
            slot,
            device: device_name(self.device),
            dir: self.csv_dir.clone(),
            stem: oom_stem,
            print: self.print,
            step: 1,
            weights: HashSet::new(),
            grads: HashSet::new(),
            weights_by_layer: HashMap::new(),
            weight_bytes: 0,
            history_entries: 0,
            count: 0,
            last: None,
            pending_allocator_snapshot: None,
        });

        let mut csv_paths = Vec::new();
        let mut reports: Vec<Box<dyn Report>> = Vec::new();
        if self.print {
            reports.push(Box::new(TerminalReport {
                top_variables: self.top_variables,
            }));
        }
        if let Some(csv) = csv {
            csv_paths = csv.paths();
            reports.push(Box::new(csv));
        }
        let mut profiler = MemoryProfiler {
            variables: self.variables,
            device: self.device,
            slot,
            print_period: self.print_period,
            reports,
            csv_paths,
            epoch: 1,
            iteration: 0,
            step: 0,
            epoch_acc: EpochAcc::default(),
            allocated_at_epoch_start: 0,
            last: None,
            epochs: Vec::new(),
            failures: 0,
            log: Vec::new(),
            capture,
            params,
            hunter: self
                .leak_check
                .then(|| LeakHunter::new(slot, self.leak_threshold, self.leak_warmup_epochs)),
            last_leaks: None,
            run: RunAcc::default(),
            history_entries: 0,
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

/// Peaks gathered over the whole run.
#[derive(Debug, Default, Clone)]
struct RunAcc {
    peak_allocated: u64,
    peak_reserved: u64,
    peak_feature_maps: u64,
    peak_intermediate: u64,
}

/// The native table of model variables (storage -> variable index and layer), replaced
/// when the store's storages change.
#[derive(Debug, Default)]
pub(crate) struct ParamSync {
    ptrs: Vec<u64>,
}

impl ParamSync {
    /// Storage pointers and names of the defined variables, in variable-index order
    /// (sorted names), as the timeline replay numbers them.
    pub(crate) fn table(vars: &Variables) -> Result<(Vec<u64>, Vec<&String>)> {
        let mut ptrs = Vec::new();
        let mut names = Vec::new();
        for name in sorted_names(vars) {
            let w = ffi::tensor_block(&vars.named_variables[name], false)?;
            if w.defined != 0 {
                ptrs.push(w.base);
                names.push(name);
            }
        }
        Ok((ptrs, names))
    }

    pub(crate) fn sync(&mut self, vars: &Variables) -> Result<()> {
        let (ptrs, names) = Self::table(vars)?;
        self.update(ptrs, &names)
    }

    /// Sets the table if `ptrs` changed since the last call.
    pub(crate) fn update(&mut self, ptrs: Vec<u64>, names: &[&String]) -> Result<()> {
        if ptrs == self.ptrs {
            return Ok(());
        }
        let ids: Vec<i32> = (0..ptrs.len() as i32).collect();
        let layers: Vec<i32> = names
            .iter()
            .map(|n| ffi::intern(&crate::timeline::layer_of(n)).unwrap_or(-1))
            .collect();
        ffi::set_params(&ptrs, &ids, &layers)?;
        self.ptrs = ptrs;
        Ok(())
    }
}

/// Peaks gathered over the iterations of the current epoch.
#[derive(Debug, Default, Clone)]
struct EpochAcc {
    iterations: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    peak_feature_maps: u64,
    peak_intermediate: u64,
}

/// Measures where a tch training loop's memory goes, from the allocator.
///
/// One profiler may be alive per process (see [`Error::AlreadyActive`]); it measures
/// the VarStore's device. It is not `Send`: build, drive and drop it on the training
/// thread. `record_stats` and `epoch_end` never panic and never return errors: a failure
/// is logged with `log` and counted in [`failures`](Self::failures).
///
/// ```no_run
/// # use tch::{nn, Device};
/// # let vs = nn::VarStore::new(Device::Cpu);
/// let mut profiler = tch_memprof::MemoryProfiler::builder(&vs)
///     .print_period(5)
///     .csv(true)
///     .build()?;
/// // in the loop, after the optimizer step:
/// profiler.record_stats();
/// // at the end of each epoch:
/// profiler.epoch_end();
/// # Ok::<(), tch_memprof::Error>(())
/// ```
pub struct MemoryProfiler {
    variables: Arc<Mutex<Variables>>,
    device: Device,
    slot: usize,
    print_period: usize,
    reports: Vec<Box<dyn Report>>,
    csv_paths: Vec<PathBuf>,
    epoch: u64,
    iteration: u64,
    step: u64,
    epoch_acc: EpochAcc,
    allocated_at_epoch_start: u64,
    last: Option<IterationStats>,
    epochs: Vec<EpochStats>,
    failures: u64,
    log: Vec<LogEvent>,
    capture: Option<Capture>,
    params: ParamSync,
    hunter: Option<LeakHunter>,
    last_leaks: Option<LeakReport>,
    run: RunAcc,
    history_entries: usize,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for MemoryProfiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryProfiler")
            .field("device", &self.device)
            .field("epoch", &self.epoch)
            .field("step", &self.step)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl MemoryProfiler {
    /// A builder over the model's VarStore. The profiler keeps a handle to the store's
    /// variables, not a borrow of the store: `vs.freeze()`, `vs.load()` and the rest
    /// stay usable, and variables added later are seen.
    pub fn builder(vs: &VarStore) -> MemoryProfilerBuilder {
        MemoryProfilerBuilder {
            variables: Arc::clone(&vs.variables_),
            device: vs.device(),
            print_period: 1,
            print: true,
            csv: false,
            csv_dir: PathBuf::from("memory_csv_data"),
            wide_csv: false,
            top_variables: DEFAULT_TOP_VARIABLES,
            timeline: false,
            timeline_step: None,
            leak_check: true,
            leak_threshold: crate::leaks::DEFAULT_LEAK_THRESHOLD,
            leak_warmup_epochs: crate::leaks::DEFAULT_WARMUP_EPOCHS,
        }
    }

    /// A profiler with the default settings: report every iteration on the terminal,
    /// no CSV.
    pub fn new(vs: &VarStore) -> Result<Self> {
        Self::builder(vs).build()
    }

    /// Ends the current iteration: measures it, reports it if it is a reporting
    /// iteration, and starts the next one. Call it once per iteration, after the
    /// optimizer step.
    pub fn record_stats(&mut self) {
        self.write_owed_oom_snapshot();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.try_record_stats()));
        self.absorb("record_stats", outcome);
        // Whatever happened, the next iteration starts here.
        if let Err(e) = ffi::begin_iteration() {
            self.fail("record_stats", &e);
        }
        if self.capture.is_some() {
            let outcome = catch_unwind(AssertUnwindSafe(|| self.begin_capture()));
            self.absorb("record_stats (timeline)", outcome);
        }
    }

    fn begin_capture(&mut self) -> Result<()> {
        let vars = match self.variables.lock() {
            Ok(v) => v,
            Err(poisoned) => poisoned.into_inner(),
        };
        match &mut self.capture {
            Some(c) => c.begin(&vars, &mut self.params),
            None => Ok(()),
        }
    }

    /// The step asked for with [`MemoryProfilerBuilder::timeline_step`], once it ran.
    pub fn step_profile(&self) -> Option<&StepProfile> {
        self.capture.as_ref().and_then(|c| c.requested.as_ref())
    }

    /// The step with the run's highest peak so far (with the timeline on).
    pub fn peak_step_profile(&self) -> Option<&StepProfile> {
        self.capture.as_ref().and_then(|c| c.peak.as_ref())
    }

    /// Where the peak step's timeline CSV, layers CSV and plots go (with the timeline
    /// and CSV on): `<run>_timeline.csv`, `<run>_layers.csv`, `<run>_timeline.png`,
    /// `<run>_timeline.svg`, written at `epoch_end` and when the profiler drops.
    pub fn peak_step_files(&self) -> Option<[PathBuf; 4]> {
        self.capture
            .as_ref()
            .and_then(|c| c.peak_files())
            .map(|f| [f.timeline_csv, f.layers_csv, f.png, f.svg])
    }

    /// Ends the current epoch: prints its summary (peaks, change of live bytes since the
    /// previous epoch's end) and writes it to `<run>_epochs.csv`.
    pub fn epoch_end(&mut self) {
        self.write_owed_oom_snapshot();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.try_epoch_end()));
        self.absorb("epoch_end", outcome);
    }

    /// The numbers of the last `record_stats` call (reported or not).
    pub fn last_stats(&self) -> Option<&IterationStats> {
        self.last.as_ref()
    }

    /// Summaries of the epochs ended so far.
    pub fn epochs(&self) -> &[EpochStats] {
        &self.epochs
    }

    /// Failures absorbed so far (each was logged with `log::warn!`).
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// The CSV files of this run (created at their first row), empty without `csv`.
    pub fn csv_paths(&self) -> &[PathBuf] {
        &self.csv_paths
    }

    fn absorb(&mut self, what: &str, outcome: std::thread::Result<Result<()>>) {
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(what, &e),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("panic");
                self.fail(what, &Error::Native(format!("caught a panic: {msg}")));
            }
        }
    }

    fn fail(&mut self, what: &str, e: &Error) {
        self.failures += 1;
        log::warn!("tch-memprof: {what} failed (training goes on): {e}");
    }

    fn try_record_stats(&mut self) -> Result<()> {
        self.step += 1;
        self.iteration += 1;
        let stats = self.measure()?;
        let acc = &mut self.epoch_acc;
        acc.iterations += 1;
        acc.peak_allocated = acc.peak_allocated.max(stats.peak_allocated_bytes);
        acc.peak_reserved = acc.peak_reserved.max(stats.peak_reserved_bytes);
        acc.peak_feature_maps = acc.peak_feature_maps.max(stats.feature_maps_bytes);
        acc.peak_intermediate = acc
            .peak_intermediate
            .max(stats.intermediate_gradients_bytes);
        let run = &mut self.run;
        run.peak_allocated = run.peak_allocated.max(stats.peak_allocated_bytes);
        run.peak_reserved = run.peak_reserved.max(stats.peak_reserved_bytes);
        run.peak_feature_maps = run.peak_feature_maps.max(stats.feature_maps_bytes);
        run.peak_intermediate = run
            .peak_intermediate
            .max(stats.intermediate_gradients_bytes);
        if self.step % self.print_period as u64 == 0 {
            let mut errors = Vec::new();
            for r in &mut self.reports {
                if let Err(e) = r.iteration(&stats) {
                    errors.push((r.name(), e));
                }
            }
            for (name, e) in errors {
                self.fail(&format!("record_stats ({name} report)"), &e);
            }
        }
        let timeline = match &mut self.capture {
            Some(c) => c.finish(self.step, self.epoch, self.iteration, &stats.device),
            None => Ok(()),
        };
        self.last = Some(stats);
        timeline
    }

    fn try_epoch_end(&mut self) -> Result<()> {
        if let Some(c) = &mut self.capture {
            if let Err(e) = c.flush_peak(true) {
                self.fail("epoch_end (step timeline)", &e);
            }
        }
        let allocated = self.allocated_now()?;
        let acc = std::mem::take(&mut self.epoch_acc);
        let peak_reserved = match self.device {
            Device::Cpu => acc.peak_reserved.max(process_memory().1),
            _ => acc.peak_reserved,
        };
        let e = EpochStats {
            epoch: self.epoch,
            iterations: acc.iterations,
            peak_allocated_bytes: acc.peak_allocated.max(allocated),
            peak_reserved_bytes: peak_reserved,
            peak_feature_maps_bytes: acc.peak_feature_maps,
            peak_intermediate_gradients_bytes: acc.peak_intermediate,
            allocated_bytes: allocated,
            allocated_change_bytes: allocated as i64 - self.allocated_at_epoch_start as i64,
        };
        self.allocated_at_epoch_start = allocated;
        self.epoch += 1;
        self.iteration = 0;
        let mut errors = Vec::new();
        for r in &mut self.reports {
            if let Err(err) = r.epoch(&e) {
                errors.push((r.name(), err));
            }
        }
        self.epochs.push(e);
        for (name, err) in errors {
            self.fail(&format!("epoch_end ({name} report)"), &err);
        }
        self.hunt_leaks(self.epoch - 1)
    }

    /// The leak hunt at the end of `epoch`.
    fn hunt_leaks(&mut self, epoch: u64) -> Result<()> {
        if self.hunter.is_none() {
            return Ok(());
        }
        let mut exclude = HashSet::new();
        {
            let vars = match self.variables.lock() {
                Ok(v) => v,
                Err(poisoned) => poisoned.into_inner(),
            };
            for t in vars.named_variables.values() {
                for grad in [false, true] {
                    let b = ffi::tensor_block(t, grad)?;
                    if b.defined != 0 {
                        exclude.insert(b.base);
                    }
                }
            }
        }
        let cuda = match self.device {
            Device::Cuda(i) => ffi::cuda_stats(i)
                .ok()
                .map(|c| (c.allocated_current, c.reserved_current)),
            _ => None,
        };
        let Some(hunter) = self.hunter.as_mut() else {
            return Ok(());
        };
        self.last_leaks = hunter.epoch_end(epoch, &exclude, cuda);
        let Some(report) = self.last_leaks.as_ref() else {
            return Ok(());
        };
        log::warn!("tch-memprof: leak suspects: {}", report.summary());
        let mut errors = Vec::new();
        for r in &mut self.reports {
            if let Err(err) = r.leaks(report) {
                errors.push((r.name(), err));
            }
        }
        for (name, err) in errors {
            self.fail(&format!("epoch_end (leaks, {name} report)"), &err);
        }
        Ok(())
    }

    /// Starts recording the memory history of every device: each block's birth and
    /// death with the op and layer that caused it, in a ring of the last `max_entries`
    /// events (at most 16,777,216; 32 bytes each, touched only as they are written).
    /// Restarting clears it. On CUDA the caching allocator's own history is started too
    /// (see [`write_cuda_allocator_snapshot`](Self::write_cuda_allocator_snapshot)).
    pub fn start_memory_history(&mut self, max_entries: usize) -> Result<()> {
        if max_entries == 0 || max_entries > 1 << 24 {
            return Err(Error::InvalidConfig {
                name: "max_entries",
                value: max_entries.to_string(),
                reason: "must be between 1 and 16777216".into(),
            });
        }
        ffi::history(true, max_entries as u64)?;
        self.history_entries = max_entries;
        crate::oom::update(|c| c.history_entries = max_entries);
        if let Device::Cuda(_) = self.device {
            ffi::cuda_history(true, max_entries as u64)?;
        }
        Ok(())
    }

    /// Stops the memory history (what was recorded stays readable for snapshots).
    pub fn stop_memory_history(&mut self) -> Result<()> {
        ffi::history(false, 0)?;
        if let Device::Cuda(_) = self.device {
            ffi::cuda_history(false, 0)?;
        }
        Ok(())
    }

    /// Writes a snapshot that PyTorch's memory viewer opens (`torch.cuda._memory_viz`,
    /// or drag the file onto <https://pytorch.org/memory_viz>), for the profiled device,
    /// the CPU included: every live block the profiler registered (with leak hunting
    /// on, the default, or since `start_memory_history`), each with a frame naming the
    /// op, layer, phase and iteration that made it, and the memory history as the
    /// device trace. Written atomically.
    pub fn write_memory_snapshot(&self, path: impl AsRef<Path>) -> Result<()> {
        let mut blocks = Vec::new();
        ffi::live_blocks(self.slot, &mut blocks);
        let mut history = Vec::new();
        ffi::read_history(&mut history, self.history_entries);
        let index = self.slot.saturating_sub(1);
        crate::snapshot::write(
            path.as_ref(),
            index,
            &blocks,
            &history,
            self.slot as u8,
            &mut crate::timeline::Names::default(),
        )
    }

    /// CUDA: writes the caching allocator's own snapshot (`_memory_snapshot_pickled`:
    /// its segments, free blocks, and its history since `start_memory_history`). Fails
    /// with a reason on the CPU or without CUDA.
    pub fn write_cuda_allocator_snapshot(&self, path: impl AsRef<Path>) -> Result<()> {
        match self.device {
            Device::Cuda(_) => ffi::cuda_snapshot(path.as_ref()),
            other => Err(Error::InvalidConfig {
                name: "device",
                value: format!("{other:?}"),
                reason: "the CUDA allocator snapshot needs a CUDA VarStore".into(),
            }),
        }
    }

    /// CUDA: after an out-of-memory error, the caching allocator's own snapshot, which
    /// cannot be taken inside its OOM path.
    fn write_owed_oom_snapshot(&mut self) {
        if let Some(path) = crate::oom::take_pending_allocator_snapshot() {
            if let Err(e) = ffi::cuda_snapshot(&path) {
                self.fail(
                    "the CUDA allocator snapshot after an out-of-memory error",
                    &e,
                );
            }
        }
    }

    /// The report of the last out-of-memory error in this session (also printed,
    /// logged and written as `<run>_oom<N>.txt` with a snapshot `<run>_oom<N>.pickle`
    /// in the CSV folder, when it happened).
    pub fn last_oom(&self) -> Option<OomReport> {
        crate::oom::last()
    }

    /// What the leak hunt found at the last `epoch_end`: None when it found no suspect
    /// (or leak hunting is off, or the warm-up is not over).
    pub fn last_leaks(&self) -> Option<&LeakReport> {
        self.last_leaks.as_ref()
    }

    /// The run's numbers so far: the last report and the run's peaks, for tests and
    /// dashboards (see also [`check_budget`](Self::check_budget)).
    pub fn stats(&self) -> RunStats {
        RunStats {
            last: self.last.clone(),
            steps: self.step,
            epochs_ended: self.epochs.len() as u64,
            peak_allocated_bytes: self.run.peak_allocated,
            peak_reserved_bytes: self.run.peak_reserved,
            peak_feature_maps_bytes: self.run.peak_feature_maps,
            peak_intermediate_gradients_bytes: self.run.peak_intermediate,
            leaks: self.last_leaks.clone(),
            profiler_memory_bytes: self.own_memory_bytes(),
        }
    }

    /// Checks the run's numbers against `budget`; the error lists what went over and
    /// the largest consumers by category and by layer.
    pub fn check_budget(&self, budget: &Budget) -> std::result::Result<(), BudgetExceeded> {
        let peak_layers = self.peak_step_profile().map(|p| p.layers.as_slice());
        budget.check(&self.stats(), peak_layers)
    }

    /// Like [`check_budget`](Self::check_budget), but panics with the readable
    /// message: for `#[test]`s that guard a model's memory.
    #[track_caller]
    pub fn assert_budget(&self, budget: &Budget) {
        if let Err(e) = self.check_budget(budget) {
            panic!("{e}");
        }
    }

    /// Bytes the profiler itself holds: its buffers and the native registry and logs
    /// it has touched (reserved address space not yet used is not counted). The epoch
    /// summaries kept for [`epochs`](Self::epochs) (one small record per `epoch_end`)
    /// are not included.
    fn own_memory_bytes(&self) -> u64 {
        let reg = ffi::registry();
        let st = ffi::state();
        let log_touched = st.log_len.min(st.log_capacity) * std::mem::size_of::<LogEvent>() as u64;
        reg.high_water * reg.entry_bytes
            + log_touched
            + (self.log.capacity() * std::mem::size_of::<LogEvent>()) as u64
            + self.hunter.as_ref().map_or(0, |h| h.own_bytes())
    }

    /// Allocated bytes on the profiled device now.
    fn allocated_now(&self) -> Result<u64> {
        let ds = ffi::device_stats(self.slot)?;
        let cuda = match self.device {
            Device::Cuda(i) => ffi::cuda_stats(i).ok(),
            _ => None,
        };
        Ok(allocated_bytes(self.device, &ds, cuda.as_ref()))
    }

    fn measure(&mut self) -> Result<IterationStats> {
        let ds = ffi::device_stats(self.slot)?;
        let state = ffi::state();
        let overflow = ffi::read_log(&mut self.log);

        // Variables, classified by the storage they point to.
        let vars = match self.variables.lock() {
            Ok(v) => v,
            Err(poisoned) => poisoned.into_inner(),
        };
        let trainable = trainable_storages(&vars);
        let names = sorted_names(&vars);
        let mut variables = Vec::with_capacity(names.len());
        let mut weight_blocks = Vec::new();
        let mut table_names = Vec::new();
        let mut buffer_blocks = Vec::new();
        let mut grad_blocks = Vec::new();
        let info = |b: &ffi::Block| BlockInfo {
            base: b.base,
            bytes: b.bytes.max(0) as u64,
            born_in_optimizer: b.tracked != 0 && b.phase == ffi::PHASE_OPTIMIZER,
        };
        for name in names {
            let t = &vars.named_variables[name];
            let w = ffi::tensor_block(t, false)?;
            if w.defined == 0 {
                continue;
            }
            let g = ffi::tensor_block(t, true)?;
            let kind = if trainable.contains(&w.base) {
                VariableKind::Weight
            } else {
                VariableKind::Buffer
            };
            weight_blocks.push(info(&w));
            table_names.push(name);
            if kind == VariableKind::Buffer {
                buffer_blocks.push(info(&w));
            }
            if g.defined != 0 {
                grad_blocks.push(info(&g));
            }
            variables.push(VariableStats {
                name: name.clone(),
                kind,
                dtype: t
                    .f_kind()
                    .map(|k| format!("{k:?}"))
                    .unwrap_or_else(|_| "?".into()),
                shape: t.size(),
                bytes: w.bytes.max(0) as u64,
                grad_bytes: (g.defined != 0).then_some(g.bytes.max(0) as u64),
            });
        }
        if self.hunter.is_some() && self.capture.is_none() {
            // Keeps the layers of leak origins right when variables change.
            let ptrs = weight_blocks.iter().map(|b| b.base).collect();
            self.params.update(ptrs, &table_names)?;
        }
        drop(vars);

        let next_step = self.step + 1;
        crate::oom::update(|c| {
            c.step = next_step;
            c.weights = weight_blocks.iter().map(|b| b.base).collect();
            c.grads = grad_blocks.iter().map(|b| b.base).collect();
            c.weight_bytes = accounting::distinct_bytes(&weight_blocks);
            c.weights_by_layer.clear();
            for v in &variables {
                *c.weights_by_layer
                    .entry(crate::timeline::layer_of(&v.name))
                    .or_default() += v.bytes;
            }
        });

        let weights = accounting::distinct_bytes(&weight_blocks);
        let buffers = accounting::distinct_bytes(&buffer_blocks);
        let gradients = accounting::distinct_bytes(&grad_blocks);
        let claimed: Vec<BlockInfo> = weight_blocks.iter().chain(&grad_blocks).copied().collect();
        let optimizer_state = accounting::optimizer_state(ds.optimizer_born_live, &claimed);
        let grad_bases: HashSet<u64> = grad_blocks.iter().map(|b| b.base).collect();
        let intermediate = accounting::intermediate_peak(&self.log, self.slot as u32, &grad_bases);

        let (allocated, peak_allocated, reserved, peak_reserved, cuda) = match self.device {
            Device::Cuda(i) => {
                let cuda = ffi::cuda_stats(i).ok();
                let allocated = allocated_bytes(self.device, &ds, cuda.as_ref());
                let reserved = cuda
                    .map(|c| c.reserved_current)
                    .unwrap_or(ds.reported_reserved)
                    .max(0) as u64;
                (
                    allocated,
                    allocated.max(ds.reported_peak_allocated_iter.max(0) as u64),
                    reserved,
                    reserved.max(ds.reported_peak_reserved_iter.max(0) as u64),
                    cuda,
                )
            }
            _ => {
                let (rss, hwm) = process_memory();
                (
                    allocated_bytes(self.device, &ds, None),
                    ds.peak_iter.max(ds.live).max(0) as u64,
                    rss,
                    hwm,
                    None,
                )
            }
        };
        let other = allocated
            .saturating_sub(weights)
            .saturating_sub(gradients)
            .saturating_sub(optimizer_state);

        Ok(IterationStats {
            epoch: self.epoch,
            iteration: self.iteration,
            step: self.step,
            device: device_name(self.device),
            allocated_bytes: allocated,
            peak_allocated_bytes: peak_allocated,
            reserved_bytes: reserved,
            peak_reserved_bytes: peak_reserved,
            weights_bytes: weights,
            buffers_bytes: buffers,
            gradients_bytes: gradients,
            feature_maps_bytes: ds.feature_maps.max(0) as u64,
            intermediate_gradients_bytes: intermediate,
            intermediate_gradients_exact: !overflow,
            optimizer_state_bytes: optimizer_state,
            other_bytes: other,
            backward_passes: state.backward_passes.max(0) as u64,
            variables,
            cuda,
            cuda_devices: match self.device {
                Device::Cuda(_) => crate::cuda::devices_in_use(),
                _ => Vec::new(),
            },
        })
    }
}

impl Drop for MemoryProfiler {
    fn drop(&mut self) {
        if let Some(c) = &mut self.capture {
            let outcome = catch_unwind(AssertUnwindSafe(|| c.flush_peak(false)));
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => log::warn!("tch-memprof: writing the peak step timeline failed: {e}"),
                Err(_) => log::warn!("tch-memprof: writing the peak step timeline panicked"),
            }
        }
        crate::oom::uninstall();
        if let Err(e) = ffi::stop() {
            log::warn!("tch-memprof: stopping the profiler failed: {e}");
        }
        ACTIVE.store(false, Ordering::Release);
    }
}

/// Storage pointers of the trainable variables (the VarStore lists them without names;
/// a named variable is trainable when its storage is among these).
pub(crate) fn trainable_storages(vars: &Variables) -> HashSet<u64> {
    vars.trainable_variables
        .iter()
        .filter_map(|v| ffi::tensor_block(&v.tensor, false).ok())
        .filter(|b| b.defined != 0)
        .map(|b| b.base)
        .collect()
}

/// Variable names in a stable order.
pub(crate) fn sorted_names(vars: &Variables) -> Vec<&String> {
    let mut names: Vec<&String> = vars.named_variables.keys().collect();
    names.sort();
    names
}

/// Allocated bytes on `device`: on CUDA the caching allocator's own counter (or, if its
/// statistics cannot be read, the total it passed with its last report); on the CPU the
/// live bytes of the tracking allocator.
fn allocated_bytes(device: Device, ds: &ffi::DeviceStats, cuda: Option<&ffi::CudaStats>) -> u64 {
    let bytes = match device {
        Device::Cuda(_) => cuda.map_or(ds.reported_allocated, |c| c.allocated_current),
        _ => ds.live,
    };
    bytes.max(0) as u64
}

/// `cpu` or `cuda:N`.
pub(crate) fn device_name(d: Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// The process's resident memory and its peak (VmRSS, VmHWM), in bytes; zeros where
/// /proc is unavailable.
pub(crate) fn process_memory() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Whether CUDA is usable by the profiler, and if not, why (no driver, a CPU-only
/// libtorch, no CUDA tensor allocated yet, ...).
pub fn cuda_status() -> std::result::Result<(), String> {
    match ffi::cuda_stats(0) {
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}
