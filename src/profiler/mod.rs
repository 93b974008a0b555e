//! The profiler a training loop drives: `record_stats` after each iteration,
//! `epoch_end` after each epoch.
//!
//! - `builder`: settings, checked at `build()`;
//! - `measure`: one iteration's numbers from the allocator and the VarStore;
//! - `peaks`: peaks over an epoch and over the run.
//!
//! The profiler computes; its [`Reports`] print and write. The process-wide native
//! state belongs to its [`Session`].

mod accounting;
mod budget;
mod builder;
mod measure;
mod peaks;
mod recorder;
mod session;
mod template;
mod torchscript;

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use tch::nn::Variables;
use tch::Device;

use crate::error::{Error, Result};
use crate::ffi::{self, OomEvent};
use crate::format;
use crate::leaks::{LeakHunter, LeakReport};
use crate::names::Names;
use crate::oom::{OomReport, OomState};
use crate::report::{Report, Reports};
use crate::stats::{EpochStats, IterationStats, RunStats};
use crate::timeline::{StepFiles, StepKind, StepProfile};
use crate::vars::{self, ParamSync, VarTable};
use recorder::Recorder;
use session::Session;

pub use budget::{Budget, BudgetExceeded, LayerUse, Overrun};
pub use builder::MemoryProfilerBuilder;
use peaks::Peaks;
pub use torchscript::{profile_file, ProfiledStep};

/// What the profiler shares with its out-of-memory hook, which runs on whichever
/// thread ran out of memory (and only takes it when it is free).
pub(crate) struct Shared {
    reports: Reports,
    oom: OomState,
    oom_dir: PathBuf,
    oom_stem: String,
}

/// The out-of-memory hook: builds the report, writes its files, hands it to the
/// reports. Never waits: if the training thread holds the shared state (it is
/// reporting), this OOM goes unreported.
fn on_oom(shared: &Mutex<Shared>, event: OomEvent) {
    let mut guard = match shared.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return,
    };
    let sh = &mut *guard;
    if event.slot != sh.oom.slot {
        return;
    }
    let Some((mut report, mut forensics)) = crate::oom::build(&mut sh.oom, event) else {
        return;
    };
    let count = sh.oom.count;
    crate::report::oom_files::write(
        &sh.oom_dir,
        &sh.oom_stem,
        count,
        sh.oom.slot,
        &mut report,
        &mut forensics,
    );
    if sh.oom.slot > 0 {
        sh.oom.pending_allocator_snapshot = Some(
            sh.oom_dir
                .join(format!("{}_oom{count}_allocator.pickle", sh.oom_stem)),
        );
    }
    // Never fails; a sink's failure is kept and logged at the next report (logging may
    // take locks); the files say what was written.
    let _ = sh.reports.oom(&report);
    sh.oom.last = Some(report);
    sh.oom.unlogged = true;
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
    print_period: u64,
    shared: Arc<Mutex<Shared>>,
    csv_paths: Vec<PathBuf>,
    html_path: Option<PathBuf>,
    /// `(dir, stem)` of the run's CSV files: where the peak step's files go.
    step_files_stem: Option<(PathBuf, String)>,
    epoch: u64,
    iteration: u64,
    step: u64,
    epoch_peaks: Peaks,
    run_peaks: Peaks,
    allocated_at_epoch_start: u64,
    last: Option<IterationStats>,
    epochs: Vec<EpochStats>,
    failures: u64,
    /// The backward log's reader (read in place).
    log_reader: ffi::LogReader,
    recorder: Option<Recorder>,
    params: ParamSync,
    /// The variables, kept between calls, and the sums over their blocks.
    table: VarTable,
    sums: measure::Sums,
    /// The CUDA devices' statistics as each report reads them (the driver's free memory
    /// asked for only when it may have moved).
    device_memory: crate::cuda::DeviceMemory,
    hunter: Option<LeakHunter>,
    last_leaks: Option<LeakReport>,
    history_entries: usize,
    /// Dropped after the fields above: stops the native session.
    _session: Session,
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
    /// A profiler with the default settings: report every iteration on the terminal,
    /// no CSV.
    pub fn new(vs: &tch::nn::VarStore) -> Result<Self> {
        Self::builder(vs).build()
    }

    fn lock_shared(&self) -> MutexGuard<'_, Shared> {
        match self.shared.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn with_shared<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
        f(&mut self.lock_shared())
    }

    /// Hands a result to the reports; their failures are logged and counted (with those
    /// an out-of-memory report left).
    fn report(&mut self, what: &str, emit: impl FnOnce(&mut Reports) -> Result<()>) {
        let errors = {
            let mut shared = self.lock_shared();
            // Never fails: the sinks' failures are kept for the next line.
            let _ = emit(&mut shared.reports);
            shared.reports.take_failures()
        };
        for (name, e) in errors {
            self.fail(&format!("{what} ({name} report)"), &e);
        }
    }

    /// Ends the current iteration: measures it, reports it if it is a reporting
    /// iteration, and starts the next one. Call it once per iteration, after the
    /// optimizer step.
    pub fn record_stats(&mut self) {
        self.after_oom();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.try_record_stats()));
        self.absorb("record_stats", outcome);
        // Whatever happened, the next iteration starts here.
        if let Err(e) = ffi::begin_iteration() {
            self.fail("record_stats", &e);
        }
        if self.recorder.is_some() {
            let outcome = catch_unwind(AssertUnwindSafe(|| self.begin_step()));
            self.absorb("record_stats (timeline)", outcome);
        }
    }

    fn begin_step(&mut self) -> Result<()> {
        self.table.refresh(&vars::lock(&self.variables))?;
        self.params.sync(&self.table)?;
        match &mut self.recorder {
            Some(r) => r.begin(&self.table, self.step + 1),
            None => Ok(()),
        }
    }

    /// The step asked for with [`MemoryProfilerBuilder::timeline_step`], once it ran.
    pub fn step_profile(&self) -> Option<&StepProfile> {
        self.recorder.as_ref().and_then(|r| r.requested())
    }

    /// The step with the run's highest peak so far (with the timeline on).
    pub fn peak_step_profile(&self) -> Option<&StepProfile> {
        self.recorder.as_ref().and_then(|r| r.peak())
    }

    /// Where the peak step's timeline CSV, layers CSV and plots go (with the timeline
    /// and CSV on): `<run>_timeline.csv`, `<run>_layers.csv`, `<run>_timeline.png`,
    /// `<run>_timeline.svg`, written at `epoch_end` and when the profiler drops.
    pub fn peak_step_files(&self) -> Option<StepFiles> {
        self.recorder.as_ref()?;
        self.step_files_stem
            .as_ref()
            .map(|(dir, stem)| StepFiles::beside(dir, stem))
    }

    /// Ends the current epoch: prints its summary (peaks, change of live bytes since the
    /// previous epoch's end) and writes it to `<run>_epochs.csv`.
    pub fn epoch_end(&mut self) {
        self.after_oom();
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

    /// `<run>_report.html`, with [`html`](MemoryProfilerBuilder::html) on (written at the
    /// first `epoch_end` or when the profiler drops).
    pub fn html_path(&self) -> Option<&Path> {
        self.html_path.as_deref()
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
                let msg = crate::error::panic_message(panic.as_ref());
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
        self.epoch_peaks.add(&stats);
        self.run_peaks.add(&stats);
        if self.step % self.print_period == 0 {
            self.report("record_stats", |r| r.iteration(&stats));
        }
        let (step, epoch, iteration) = (self.step, self.epoch, self.iteration);
        let requested = match &mut self.recorder {
            Some(r) => r.finish(step, epoch, iteration, &stats.device)?.cloned(),
            None => None,
        };
        if let Some(p) = requested {
            self.report("record_stats (step profile)", |r| {
                r.step_profile(&p, StepKind::Requested(step))
            });
        }
        self.last = Some(stats);
        Ok(())
    }

    /// Hands the peak step's profile to the reports if it changed since last time.
    fn report_new_peak(&mut self, kind: StepKind) {
        let Some(p) = self
            .recorder
            .as_mut()
            .and_then(|r| r.take_new_peak())
            .cloned()
        else {
            return;
        };
        self.report("epoch_end (step timeline)", |r| r.step_profile(&p, kind));
    }

    fn try_epoch_end(&mut self) -> Result<()> {
        self.report_new_peak(StepKind::Peak);
        let allocated = self.allocated_now()?;
        let peaks = std::mem::take(&mut self.epoch_peaks);
        let peak_reserved = match self.device {
            Device::Cpu => peaks.reserved.max(measure::process_memory().1),
            _ => peaks.reserved,
        };
        let e = EpochStats {
            epoch: self.epoch,
            iterations: peaks.iterations,
            peak_allocated_bytes: peaks.allocated.max(allocated),
            peak_reserved_bytes: peak_reserved,
            peak_feature_maps_bytes: peaks.feature_maps,
            peak_intermediate_gradients_bytes: peaks.intermediate,
            allocated_bytes: allocated,
            allocated_change_bytes: allocated as i64 - self.allocated_at_epoch_start as i64,
        };
        self.allocated_at_epoch_start = allocated;
        self.epoch += 1;
        self.iteration = 0;
        self.report("epoch_end", |r| r.epoch(&e));
        self.epochs.push(e);
        self.hunt_leaks(self.epoch - 1)
    }

    /// The leak hunt at the end of `epoch`.
    fn hunt_leaks(&mut self, epoch: u64) -> Result<()> {
        if self.hunter.is_none() {
            return Ok(());
        }
        self.table.refresh(&vars::lock(&self.variables))?;
        let exclude = self
            .table
            .rows()
            .flat_map(|(_, b, g)| [b, g])
            .filter(|b| b.defined)
            .map(|b| b.base)
            .collect();
        let cuda = match self.device {
            Device::Cuda(i) => crate::cuda::allocator_stats(i)
                .ok()
                .map(|c| (c.allocated_current, c.reserved_current)),
            _ => None,
        };
        let Some(hunter) = self.hunter.as_mut() else {
            return Ok(());
        };
        self.last_leaks = hunter.epoch_end(epoch, &exclude, cuda)?;
        let Some(report) = self.last_leaks.clone() else {
            return Ok(());
        };
        log::warn!("tch-memprof: leak suspects: {}", report.summary());
        self.report("epoch_end (leaks)", |r| r.leaks(&report));
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
        self.with_shared(|sh| sh.oom.history_entries = max_entries);
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
        ffi::live_blocks(self.slot, &mut blocks)?;
        let mut history = Vec::new();
        ffi::read_history(&mut history, self.history_entries)?;
        let index = self.slot.saturating_sub(1);
        crate::report::snapshot::write(
            path.as_ref(),
            index,
            &blocks,
            &history,
            self.slot as u8,
            &mut Names::default(),
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

    /// After an out-of-memory error: its log line, and on CUDA the caching allocator's
    /// own snapshot, which cannot be taken inside its OOM path.
    fn after_oom(&mut self) {
        let (unlogged, owed) = self.with_shared(|sh| {
            let unlogged = std::mem::take(&mut sh.oom.unlogged)
                .then(|| sh.oom.last.clone())
                .flatten();
            (unlogged, sh.oom.pending_allocator_snapshot.take())
        });
        if let Some(r) = unlogged {
            log::error!(
                "tch-memprof: out of memory on {} ({} requested, {} allocated); report: {}",
                r.device,
                format::bytes(r.requested_bytes),
                format::bytes(r.allocated_bytes),
                r.report_path
                    .as_ref()
                    .map_or("not written".into(), |p| p.display().to_string())
            );
        }
        if let Some(path) = owed {
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
        self.with_shared(|sh| sh.oom.last.clone())
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
            peak_allocated_bytes: self.run_peaks.allocated,
            peak_reserved_bytes: self.run_peaks.reserved,
            peak_feature_maps_bytes: self.run_peaks.feature_maps,
            peak_intermediate_gradients_bytes: self.run_peaks.intermediate,
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
        let reg = ffi::registry().unwrap_or_default();
        let st = ffi::state().unwrap_or_default();
        reg.bytes + st.log_bytes + self.hunter.as_ref().map_or(0, |h| h.own_bytes())
    }
}

impl Drop for MemoryProfiler {
    fn drop(&mut self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            self.report_new_peak(StepKind::PeakAtExit)
        }));
        if outcome.is_err() {
            log::warn!("tch-memprof: writing the peak step timeline panicked");
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| self.report("drop", |r| r.finish())));
        if outcome.is_err() {
            log::warn!("tch-memprof: finishing the reports panicked");
        }
        // The session (a field) stops the native layer after this.
    }
}
