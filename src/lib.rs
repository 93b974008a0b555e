//! # tch-memprof: where the memory of a tch training loop goes
//!
//! Four lines in an existing [tch](https://docs.rs/tch) training loop give, at every
//! reported iteration, the memory split into weights, gradients, feature maps,
//! intermediate gradients, optimizer state and the rest, on the terminal and as CSV.
//! The numbers are measured from the allocator, byte-exact, not estimated from hooks.
//!
//! ```no_run
//! use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let vs = nn::VarStore::new(Device::cuda_if_available());
//! let net = nn::linear(vs.root() / "fc", 784, 10, Default::default());
//! let mut opt = nn::Adam::default().build(&vs, 1e-3)?;
//!
//! let mut profiler = tch_memprof::MemoryProfiler::builder(&vs) // 1
//!     .print_period(5)
//!     .csv(true)
//!     .build()?;
//! for _epoch in 0..3 {
//!     for _ in 0..100 {
//!         let x = Tensor::randn([64, 784], (Kind::Float, vs.device()));
//!         let y = Tensor::zeros([64], (Kind::Int64, vs.device()));
//!         let loss = net.forward(&x).cross_entropy_for_logits(&y);
//!         opt.backward_step(&loss);
//!         profiler.record_stats(); // 2: after the optimizer step
//!     }
//!     profiler.epoch_end(); // 3
//! }
//! # Ok(()) }
//! ```
//!
//! ## What each number means
//!
//! An *iteration* is the span between two `record_stats` calls. Its phases are found
//! without extra calls: **backward** begins when the autograd engine runs its first node
//! and ends when control returns to the training code; the **optimizer** phase follows
//! until `record_stats` (or the next forward pass); everything before backward is
//! **forward**.
//!
//! | number | meaning |
//! |---|---|
//! | allocated | bytes in live tensor allocations. CPU: every live block of libtorch's CPU allocator in the process. CUDA: the caching allocator's allocated bytes. |
//! | peak allocated | the highest `allocated` during the iteration |
//! | reserved (CUDA) | bytes the caching allocator holds from the driver: allocated plus cached |
//! | resident (CPU) | the process's resident memory (RSS); its peak is the process's peak since start (VmHWM). Reserved has no meaning for the CPU allocator. |
//! | weights | storage of every VarStore variable; trainable parameters and buffers (batch-norm statistics) are shown apart |
//! | weight gradients | storage of each variable's defined `.grad` |
//! | optimizer state | bytes allocated during optimizer steps that are still live (Adam: two tensors per parameter) |
//! | other | everything else live: `allocated - weights - gradients - optimizer state` |
//! | feature maps | bytes allocated in the iteration before its backward pass that are still live when backward starts: the input batch and everything the forward pass keeps for backward (and the 4-byte gradient seed `backward()` makes) |
//! | intermediate gradients | the peak, during backward, of live bytes allocated by backward that are not weight gradients: activation gradients, fresh gradients waiting to be accumulated |
//!
//! Weights, gradients, optimizer state and other are taken when `record_stats` runs and
//! add up to allocated. Feature maps and intermediate gradients are measured at their own
//! moment inside the iteration (by then they are freed). Sizes are those of the
//! allocations: on CUDA the caching allocator's blocks (rounded to 512 bytes).
//!
//! ## CSV files
//!
//! With `.csv(true)`, every report also goes to files in `csv_dir` (default
//! `memory_csv_data/`), named by the run's start time `YYYYmmdd-HHMMSS` (plus
//! `-rank<R>` when the `RANK` variable is set, and `-2`, `-3`... rather than overwrite):
//!
//! - `<run>_summary.csv`: one row per reported iteration: `timestamp, epoch,
//!   iteration, device, allocated_bytes, peak_allocated_bytes, reserved_bytes,
//!   peak_reserved_bytes, weights_bytes, buffers_bytes, gradients_bytes,
//!   feature_maps_bytes, intermediate_gradients_bytes, optimizer_state_bytes,
//!   other_bytes, step, backward_passes`;
//! - `<run>_parameters.csv`: `timestamp, epoch, iteration, parameter, kind
//!   (weight|buffer|gradient), dtype, shape, bytes`, one row per variable and gradient,
//!   the whole set written at the first report, at each epoch's first and whenever a
//!   variable or gradient changed (an iteration without rows has the latest set's);
//! - `<run>_epochs.csv`: one row per `epoch_end`;
//! - `<run>_wide.csv` with `.wide_csv(true)`: one column per variable and per gradient.
//!
//! Each row is flushed before `record_stats` returns: a process killed at any moment
//! leaves files that parse, with every row it completed.
//!
//! ## Step anatomy
//!
//! With [`MemoryProfilerBuilder::timeline`] (or [`MemoryProfilerBuilder::timeline_step`])
//! the profiler also records one iteration op by op: live bytes by [`Category`] after
//! every op (they add up to the allocator's live bytes), the [`Peak`] and the op and
//! layer that reached it, per-layer parameters, activations and FLOPs
//! ([`LayerProfile`]), and the ops it could not count FLOPs for. Read it with
//! [`MemoryProfiler::step_profile`] or [`MemoryProfiler::peak_step_profile`]; write it
//! with [`report::write_timeline_csv`], [`report::write_layers_csv`] and
//! [`report::plot_step`] (all of them at once: [`report::write_step_files`]). Layers come from the VarStore paths of the variables an op
//! reads; name other regions with [`scope`]. See docs/step-anatomy.md for the categories, the
//! layer rules and the FLOP formulas.
//!
//! ```no_run
//! # use tch::{nn, nn::ModuleT, Device, Kind, Tensor};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let net = tch::vision::resnet::resnet18(&vs.root(), 1000);
//! let mut profiler = tch_memprof::MemoryProfiler::builder(&vs)
//!     .timeline_step(1)
//!     .build()?;
//! let x = Tensor::randn([2, 3, 224, 224], (Kind::Float, Device::Cpu));
//! net.forward_t(&x, true).sum(Kind::Float).backward();
//! profiler.record_stats();
//! let p = profiler.step_profile().expect("step 1 was profiled");
//! println!("peak {} B during {} ({})", p.peak.bytes, p.peak.op, p.peak.layer);
//! tch_memprof::report::plot_step(p, std::path::Path::new("step1.png"), Some("ResNet-18, one step"))?;
//! # Ok(()) }
//! ```
//!
//! ## Leak hunting and budgets
//!
//! By default each `epoch_end` after the first (the warm-up) groups the blocks still
//! alive that are not variables or gradients by the op, phase and layer that made them,
//! and names the groups that grow ([`LeakReport`], [`MemoryProfiler::last_leaks`],
//! `<run>_leaks.csv`, a `log::warn!`), with what the pattern usually means
//! ([`LeakPattern`]). Tuning: [`MemoryProfilerBuilder::leak_threshold`],
//! [`MemoryProfilerBuilder::leak_warmup_epochs`], [`MemoryProfilerBuilder::leak_check`].
//!
//! [`MemoryProfiler::stats`] gives the run's numbers ([`RunStats`]);
//! [`MemoryProfiler::assert_budget`] checks them against a [`Budget`] in a `#[test]` and
//! fails with the largest consumers by category and layer.
//!
//! ## CUDA allocator, snapshots, out-of-memory reports
//!
//! On CUDA runs each report adds the caching allocator's statistics of every device in
//! use; [`cuda`] has the explicit calls (statistics, `reset_peak_stats`, `empty_cache`).
//! [`MemoryProfiler::start_memory_history`] and [`MemoryProfiler::write_memory_snapshot`]
//! write snapshots that PyTorch's memory viewer opens, on the CPU as on CUDA. When an
//! allocation fails, the profiler writes a report and a snapshot before the error reaches
//! the loop ([`OomReport`], [`MemoryProfiler::last_oom`]).
//!
//! ## Memory optimizations
//!
//! [`optim::Checkpointed`] trains a chain of segments with gradient checkpointing (recomputed
//! in backward; gradients equal to the plain run's) and [`optim::autocast`] runs code in
//! bfloat16/float16 autocast on the CPU or CUDA; `examples/optimizations.rs` measures
//! both with the profiler.
//!
//! ## Guarantees in the training loop
//!
//! - `record_stats` and `epoch_end` never panic and never stop training: a failure is
//!   logged with [`log`] and counted ([`MemoryProfiler::failures`]).
//! - Bad settings fail at `build()` with an [`Error`] naming the value and why.
//! - One profiler at a time per process ([`Error::AlreadyActive`]); it is not `Send`.
//! - The VarStore is not borrowed: `vs.freeze()`, `vs.load()` stay usable.
//! - The profiler never empties caches or keeps tensors alive.
//!
//! ## How it measures
//!
//! A small C++ layer, compiled against libtorch's headers, installs a wrapping CPU
//! allocator when the program loads (before the model is built), registers for the
//! CUDA caching allocator's memory reports, and watches the autograd engine's nodes to
//! find the phases. Every allocation is tagged with the phase it was born in. See
//! `docs/architecture.md` for the data flow, the accounting model and the hot-path rules.
//!
//! ## Setup
//!
//! tch needs libtorch 2.11.0. `scripts/with-libtorch.sh <command>` provisions it once
//! (the PyPI `torch==2.11.0` wheel, in a per-user cache) or uses `LIBTORCH`. Binaries of
//! this package find libtorch through an rpath; a crate that depends on tch-memprof can
//! do the same from its `build.rs` with the folder this crate publishes:
//!
//! ```no_run
//! // build.rs of a crate that depends on tch-memprof
//! if let Ok(lib) = std::env::var("DEP_TCH_MEMPROF_LIBTORCH_LIB") {
//!     println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
//! }
//! ```
#![deny(missing_docs)]
// Every `unsafe` block of the crate is in `ffi`, the one seam to the native layer.
#![deny(unsafe_code)]

mod cli;
pub mod cuda;
mod error;
pub mod estimate;
mod events;
mod ffi; // the one `#![allow(unsafe_code)]`
mod format;
mod fs;
mod leaks;
pub mod models;
mod names;
mod oom;
mod optim;
mod phase;
mod profiler;
mod program;
mod replay;
pub mod report;
pub mod runs;
mod stats;
mod timeline;
mod vars;
mod workload;

/// The `tch-memprof` command's entry (`src/bin/tch-memprof.rs` calls it); not library API.
#[doc(hidden)]
pub use cli::main as __cli_main;
pub use error::{Error, Result};
pub use leaks::{LeakGroup, LeakPattern, LeakReport};
pub use names::MISSING;
pub use oom::{OomBlock, OomCategory, OomReport};
pub use optim::{autocast, clip_grad_norm, Checkpointed};
pub use phase::Phase;
pub use profiler::{profile_file, MemoryProfiler, MemoryProfilerBuilder, ProfiledStep};
pub use profiler::{Budget, BudgetExceeded, LayerUse, Overrun};
pub use stats::{EpochStats, IterationStats, RunStats, VariableKind, VariableList, VariableStats};
pub use timeline::{
    scope, Category, CategoryBytes, IdleAtPeak, IdleBlock, IdleGroup, IdleSite, LayerProfile, Peak,
    Scope, StepFiles, StepProfile, StepRow, UncountedOp, UNKNOWN_SITE,
};

/// The libtorch version (`major.minor.patch`) the native layer was compiled against, read
/// from libtorch's own version header at build time: 2.11.x under tch 0.24, 2.13.x under
/// tch 0.26.
pub const LIBTORCH_VERSION: &str = env!("TCH_MEMPROF_LIBTORCH_VERSION");

/// Raw measurements, for this crate's own tests and benches. Not a stable API.
#[doc(hidden)]
pub mod __private {
    /// Live bytes of the CPU allocator now (every tracked block in the process).
    pub fn cpu_live_bytes() -> i64 {
        crate::ffi::device_stats(0).map(|s| s.live).unwrap_or(-1)
    }
    /// Allocations the CPU allocator has counted (every tracked block in the process).
    pub fn cpu_allocations() -> i64 {
        crate::ffi::device_stats(0).map(|s| s.allocs).unwrap_or(-1)
    }
    /// Whether libtorch runs op callbacks for every op now (what its dispatcher asks
    /// before it builds an op's record), not only for autograd nodes.
    pub fn records_every_op() -> bool {
        crate::ffi::state().is_ok_and(|s| s.op_records)
    }
    /// Whether the hooks read the autograd engine's graph task of a thread from libtorch's
    /// thread-local itself (found once in libtorch's code), not by a call each time.
    pub fn graph_task_read_direct() -> bool {
        crate::ffi::state().is_ok_and(|s| s.graph_task_direct)
    }
    /// Whether the tracking CPU allocator is installed.
    pub fn cpu_tracking_installed() -> bool {
        crate::ffi::state().is_ok_and(|s| s.cpu_installed)
    }
    /// Live-block registry: (entries in use, entries ever used, births not registered).
    pub fn registry() -> (i64, u64, i64) {
        let r = crate::ffi::registry().unwrap_or_default();
        (r.live, r.high_water, r.dropped)
    }
    /// Ops of this session that took their layer, variable or FLOPs from the ones learned
    /// in an earlier iteration, not from their inputs; with leak hunting alone, the
    /// blocks that took their origin from the learned ones.
    pub fn looked_up_ops() -> u64 {
        crate::ffi::registry().map_or(0, |r| r.looked_up_ops)
    }
    /// Live registered blocks of the CPU in this session: (bytes, count).
    pub fn registered_cpu_blocks() -> (i64, usize) {
        let mut v = Vec::new();
        if crate::ffi::live_blocks(0, &mut v).is_err() {
            return (-1, 0);
        }
        (v.iter().map(|b| b.bytes as i64).sum(), v.len())
    }
    /// Times an allocation hook was entered while one was running on the same thread
    /// (a hook that allocated through the allocator it watches); must stay 0.
    pub fn hook_reentries() -> i64 {
        crate::ffi::state().map_or(-1, |s| s.hook_reentries)
    }
    /// CUDA births the native block table had no room for, and frees whose birth tag
    /// could not be read.
    pub fn untracked() -> (i64, i64) {
        crate::ffi::state().map_or((-1, -1), |s| (s.cuda_untracked, s.untagged_frees))
    }
    /// Re-enters the CPU allocation hook on purpose: the negative control of
    /// [`hook_reentries`].
    pub fn reenter_hook_on_purpose() -> Result<(), String> {
        crate::ffi::selftest_reenter().map_err(|e| e.to_string())
    }
    /// The CUDA accounting path (the caching allocator's reporter, the CUDA block table,
    /// the live-block registry and history when a session has them on) driven without a
    /// GPU: `n` fake cuda:0 blocks reported born, then dead; the time of the `2 n`
    /// reports, on this thread or on a thread of its own (as CUDA's backward reports).
    pub fn cuda_report_cost(n: u64, other_thread: bool) -> Result<std::time::Duration, String> {
        crate::ffi::cuda_report_cost(n, other_thread).map_err(|e| e.to_string())
    }
    /// Inserts, finds and removes `n` fake CUDA blocks per writer in a small native block
    /// table with two concurrent writers; the mismatches (0 when the table is right).
    pub fn block_table_selftest(n: u64) -> Result<u64, String> {
        crate::ffi::selftest_block_table(n).map_err(|e| e.to_string())
    }
}
