//! Step anatomy: live bytes by category after every op of one iteration, the peak and
//! who reached it, per-layer memory and FLOPs. Built by replaying the native step log
//! (every block birth and death, op begin and end, phase change, counted FLOP) once the
//! iteration is over; nothing here runs while the model does.
//!
//! Categories (a byte is in exactly one at any moment):
//! - `PARAM` / `BUFFER`: storage of the VarStore's trainable variables / other
//!   variables (batch-norm running statistics).
//! - `GRAD`: weight gradients: blocks made by the backward pass that outlive it, and
//!   gradients alive when the iteration began.
//! - `ACT`: activations: blocks made in the forward pass that are still alive when the
//!   backward pass starts (the "feature maps" of the iteration report).
//! - `TEMP`: blocks made and freed within one phase: forward temporaries, activation
//!   gradients of the backward pass, optimizer scratch.
//! - `OPT`: optimizer state: blocks made in an optimizer phase that outlive it.
//! - `OTHER`: everything else: user tensors alive when the iteration began that are not
//!   variables, gradients or optimizer state; forward outputs of a pass with no
//!   backward after it.

use std::collections::HashMap;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

use crate::names::MISSING;
use crate::phase::Phase;

/// What a live byte is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// Trainable VarStore variables.
    Param,
    /// Non-trainable VarStore variables (batch-norm running statistics).
    Buffer,
    /// Weight gradients.
    Grad,
    /// Activations kept for the backward pass.
    Act,
    /// Blocks made and freed within one phase.
    Temp,
    /// Optimizer state.
    Opt,
    /// Everything else.
    Other,
    /// CUDA: the cuBLAS and cuBLASLt workspaces PyTorch keeps (a prediction's too).
    Workspace,
}

impl Category {
    /// All categories, in the order of CSV columns and of the plot's stack (bottom up).
    pub const ALL: [Category; CATEGORIES] = [
        Category::Param,
        Category::Buffer,
        Category::Opt,
        Category::Grad,
        Category::Workspace,
        Category::Other,
        Category::Act,
        Category::Temp,
    ];

    /// Upper-case label, as in the CSV header and the plot legend.
    pub fn label(self) -> &'static str {
        match self {
            Category::Param => "PARAM",
            Category::Buffer => "BUFFER",
            Category::Grad => "GRAD",
            Category::Act => "ACT",
            Category::Temp => "TEMP",
            Category::Opt => "OPT",
            Category::Other => "OTHER",
            Category::Workspace => "WORKSPACE",
        }
    }

    /// What the category holds, in a few words (the plot's legend; docs/glossary.md says
    /// it whole).
    pub fn meaning(self) -> &'static str {
        match self {
            Category::Param => "weights: trainable variables",
            Category::Buffer => "non-trainable variables (batch-norm statistics)",
            Category::Grad => "weight gradients",
            Category::Act => "activations kept for backward, the input batch",
            Category::Temp => "made and freed within one phase",
            Category::Opt => "optimizer state",
            Category::Other => "the rest: kept across iterations, taken by other libraries",
            Category::Workspace => "cuBLAS workspaces PyTorch keeps",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// How many categories there are.
pub(crate) const CATEGORIES: usize = 8;

/// Bytes per category at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CategoryBytes([u64; CATEGORIES]);

impl CategoryBytes {
    /// Bytes of one category.
    pub fn get(&self, c: Category) -> u64 {
        self.0[c.index()]
    }

    /// Sum over all categories.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub(crate) fn from_signed(v: &[i64; CATEGORIES]) -> Self {
        let mut out = [0u64; CATEGORIES];
        for (o, x) in out.iter_mut().zip(v) {
            *o = (*x).max(0) as u64;
        }
        CategoryBytes(out)
    }

    pub(crate) fn max_with(&mut self, other: &CategoryBytes) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a = (*a).max(b);
        }
    }
}

/// Live bytes after one op.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepRow {
    /// Position of the op in the iteration (0-based, in the order ops began).
    pub op_index: u32,
    /// Op name: `aten::conv2d`, or the autograd node (`ConvolutionBackward0`).
    pub op: String,
    /// Phase of the op.
    pub phase: Phase,
    /// Layer the op is attributed to (see [`StepProfile`]).
    pub layer: String,
    /// Live bytes by category when the op returned.
    pub bytes: CategoryBytes,
    /// The allocator's own live-bytes counter when the op returned (equals
    /// `bytes.total()`: checked by the tests).
    pub allocated_bytes: u64,
    /// The highest live bytes since the previous row, at allocation granularity: inside
    /// this op (and between the two ops). Its largest value over the rows is the step's
    /// peak ([`Peak::bytes`]), which `bytes` (taken when ops return) can miss.
    pub peak_bytes: u64,
    /// Of `bytes`, those of the blocks idle at the step's peak that no op reads again
    /// once this op returned: `bytes.total() - idle_bytes` is what would have been live
    /// had every one of them been freed right after its last read (0 without the step
    /// detail of [`idle_at_peak`](crate::MemoryProfilerBuilder::idle_at_peak)).
    pub idle_bytes: u64,
}

/// The highest live bytes of the iteration, at allocation granularity.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Peak {
    /// Live bytes at the peak.
    pub bytes: u64,
    /// Their split by category.
    pub breakdown: CategoryBytes,
    /// The op during which the peak was reached (`None`: before the first op).
    pub op_index: Option<u32>,
    /// Its name ([`MISSING`](crate::names::MISSING) before the first op).
    pub op: String,
    /// Its phase.
    pub phase: Option<Phase>,
    /// Its layer ([`MISSING`](crate::names::MISSING) before the first op).
    pub layer: String,
}

impl Default for Peak {
    fn default() -> Self {
        Peak {
            bytes: 0,
            breakdown: CategoryBytes::default(),
            op_index: None,
            op: MISSING.into(),
            phase: None,
            layer: MISSING.into(),
        }
    }
}

impl Peak {
    /// Where the peak was reached: `aten::div (optimizer, l1)`; before the first op:
    /// `the iteration start ((none), (none))`.
    pub fn location(&self) -> String {
        let op = if self.op_index.is_none() {
            "the iteration start"
        } else {
            &self.op
        };
        format!(
            "{op} ({}, {})",
            self.phase.map_or(MISSING, |ph| ph.name()),
            self.layer
        )
    }
}

/// Memory and FLOPs of one layer in the profiled iteration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LayerProfile {
    /// Layer name: a VarStore path without its last component (`layer1.0.conv1`), a
    /// scope name, or [`MISSING`](crate::names::MISSING) for ops before any layer.
    pub layer: String,
    /// Storage of the layer's VarStore variables (parameters and buffers).
    pub parameters_bytes: u64,
    /// Activation bytes made by the layer's ops and kept for backward (the largest
    /// over the iteration's backward passes).
    pub activation_bytes: u64,
    /// FLOPs of the layer's ops in the forward phase.
    pub forward_flops: u64,
    /// FLOPs of the backward nodes of the layer's ops.
    pub backward_flops: u64,
}

/// An op the FLOP counter does not know, with how often it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UncountedOp {
    /// Op name (`aten::nll_loss_forward`).
    pub op: String,
    /// Calls in the iteration.
    pub calls: u64,
}

/// Anatomy of one iteration (from one `record_stats` to the next).
///
/// Layers: an op that reads a VarStore variable belongs to the layer named by the
/// variable's path without its last component (`layer1.0.conv1.weight` ->
/// `layer1.0.conv1`); a backward node belongs to the layer of the forward op that made
/// it; any other op belongs to the layer that ran last. Ops inside a [`scope`](crate::scope) belong
/// to the scope.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct StepProfile {
    /// Step number (1-based `record_stats` count) of the iteration.
    pub step: u64,
    /// Epoch of the iteration.
    pub epoch: u64,
    /// Iteration within the epoch.
    pub iteration: u64,
    /// Device profiled (`cpu`, `cuda:0`).
    pub device: String,
    /// Live bytes when the iteration began.
    pub start_bytes: u64,
    /// One row per op, in the order ops returned.
    pub rows: Vec<StepRow>,
    /// The iteration's peak.
    pub peak: Peak,
    /// Each category's own maximum over the iteration.
    pub category_max: CategoryBytes,
    /// Layers in the order they first ran.
    pub layers: Vec<LayerProfile>,
    /// Total forward FLOPs.
    pub forward_flops: u64,
    /// Total backward FLOPs.
    pub backward_flops: u64,
    /// FLOPs of the optimizer phase (not attributed to layers).
    pub optimizer_flops: u64,
    /// Ops whose FLOPs are not counted, most calls first.
    pub uncounted_ops: Vec<UncountedOp>,
    /// False when the step log overflowed and events were dropped: the numbers are then
    /// incomplete.
    pub complete: bool,
    /// False when some of the iteration's ops are not known: it ran between the
    /// iterations the profiler learns its ops from, and its blocks were not those of the
    /// learned one (a batch of another shape, a branch taken, a block freed elsewhere).
    /// Where that showed at one of its allocations, the ops that began after it are
    /// recorded (the rows, layers and FLOPs are theirs); where it showed only once the
    /// iteration was over, none is (the rows, layers, FLOPs and the peak's op are
    /// empty). Either way the peak's bytes, its split and each category's maximum are
    /// exact, and the next iteration learns again.
    pub ops_recorded: bool,
    /// The blocks idle at the peak, with the step detail on
    /// ([`idle_at_peak`](crate::MemoryProfilerBuilder::idle_at_peak)); `None` otherwise.
    pub idle: Option<IdleAtPeak>,
}

/// A block live at the step's peak that no op read after it: made during the step, not
/// a weight gradient or optimizer state, and its last read (the last op that took it
/// as an input, backward nodes included) returned before the allocation that reached
/// the peak (a block never read: the op that made it returned before it). A row of
/// `<run>_idle.csv`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IdleBlock {
    /// Its size.
    pub bytes: u64,
    /// The op that made it.
    pub op: String,
    /// That op's layer.
    pub layer: String,
    /// The phase it was made in.
    pub phase: Phase,
    /// The last op that read it ([`MISSING`](crate::names::MISSING): none did).
    pub last_read_op: String,
    /// The op during which it was freed ([`MISSING`](crate::names::MISSING): it outlived
    /// the step).
    pub freed_at_op: String,
    /// The source line that allocated it, `file:line`: the first frame of its call stack
    /// in Rust source that is not the standard library, tch-memprof, torch-sys or tch's
    /// tensor and layer code (tch's own models, `tch::vision`, count as the model's
    /// code); [`UNKNOWN_SITE`] when no frame is.
    pub site: String,
    /// The step's peak had it been freed right after its last read.
    pub peak_if_dropped: u64,
}

/// The site of a block whose call stack has no frame of the model's code.
pub const UNKNOWN_SITE: &str = "(unknown)";

/// The idle blocks of one source line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct IdleSite {
    /// `file:line`, as in [`IdleBlock::site`].
    pub site: String,
    /// Bytes of its idle blocks.
    pub bytes: u64,
    /// How many idle blocks it holds.
    pub blocks: usize,
    /// The step's peak had all of them been freed right after their last reads.
    pub peak_if_dropped: u64,
}

/// Idle blocks made by one op at one source line and last read by one op: what one
/// `drop` in the loop's code frees (a line that runs in every layer of a model makes
/// one group across them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct IdleGroup {
    /// Bytes of its blocks.
    pub bytes: u64,
    /// How many.
    pub blocks: usize,
    /// The op that made them.
    pub op: String,
    /// The layer of the largest of them.
    pub layer: String,
    /// How many layers they were made in.
    pub layers: usize,
    /// The op that read them last ([`MISSING`](crate::names::MISSING): none did).
    pub last_read_op: String,
    /// The source line that made them (as [`IdleBlock::site`]; [`UNKNOWN_SITE`]: no
    /// frame of the model's code).
    pub site: String,
    /// The step's peak had these been freed right after their last read.
    pub peak_if_dropped: u64,
}

/// What is idle at the peak of a step with the step detail on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct IdleAtPeak {
    /// The step's peak (as [`Peak::bytes`]).
    pub peak: u64,
    /// Bytes of all idle blocks.
    pub bytes: u64,
    /// The step's peak had all of them been freed right after their last reads: the peak
    /// is found again by replaying the step that way, so it may move to another moment
    /// and fall by less than `bytes`.
    pub peak_if_dropped: u64,
    /// The idle blocks, largest first.
    pub blocks: Vec<IdleBlock>,
    /// The same grouped by source line, most bytes first.
    pub sites: Vec<IdleSite>,
    #[serde(skip)]
    pub(crate) replay: IdleReplay,
}

impl IdleAtPeak {
    /// The idle blocks by the op that made them, the source line that made them and the
    /// op that read them last, most bytes first.
    pub fn groups(&self) -> Vec<IdleGroup> {
        type Key<'a> = (&'a str, &'a str, &'a str);
        let key = |b: &'_ IdleBlock| -> (String, String, String) {
            (b.op.clone(), b.site.clone(), b.last_read_op.clone())
        };
        let mut by_key: Vec<(Key<'_>, Vec<&IdleBlock>)> = Vec::new();
        let mut index: HashMap<Key<'_>, usize> = HashMap::new();
        for b in &self.blocks {
            let k = (b.op.as_str(), b.site.as_str(), b.last_read_op.as_str());
            let i = *index.entry(k).or_insert_with(|| {
                by_key.push((k, Vec::new()));
                by_key.len() - 1
            });
            by_key[i].1.push(b);
        }
        let mut groups: Vec<IdleGroup> = by_key
            .into_iter()
            .map(|((op, site, read), blocks)| {
                let mut layers: Vec<&str> = blocks.iter().map(|b| b.layer.as_str()).collect();
                layers.sort_unstable();
                layers.dedup();
                let wanted = (op.to_string(), site.to_string(), read.to_string());
                IdleGroup {
                    bytes: blocks.iter().map(|b| b.bytes).sum(),
                    blocks: blocks.len(),
                    op: op.to_string(),
                    // `blocks` are largest first.
                    layer: blocks[0].layer.clone(),
                    layers: layers.len(),
                    last_read_op: read.to_string(),
                    site: site.to_string(),
                    peak_if_dropped: self.peak_if_dropped_where(|b| key(b) == wanted),
                }
            })
            .collect();
        groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.op.cmp(&b.op)));
        groups
    }

    /// The step's peak had the blocks `pick` chooses been freed right after their last
    /// reads (found again by replaying the step that way).
    pub fn peak_if_dropped_where(&self, mut pick: impl FnMut(&IdleBlock) -> bool) -> u64 {
        let drops: Vec<_> = self
            .blocks
            .iter()
            .zip(&self.replay.drops)
            .filter(|(b, _)| pick(b))
            .map(|(_, d)| *d)
            .collect();
        self.replay.curve.peak_with(&drops)
    }
}

/// What [`IdleAtPeak::peak_if_dropped_where`] replays: the step's live bytes, and each
/// idle block's (from event, to event, bytes), in the order of `blocks`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IdleReplay {
    pub curve: LiveCurve,
    pub drops: Vec<(usize, usize, i64)>,
}

/// The step's live bytes after each allocation and free of the profiled device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LiveCurve {
    pub start: i64,
    /// (event index, live bytes after it, whether it is an allocation)
    pub points: Vec<(usize, i64, bool)>,
}

impl LiveCurve {
    /// The highest live bytes of the step (the start included) with each block of
    /// `drops` (from event, to event, bytes) gone between those two events.
    pub fn peak_with(&self, drops: &[(usize, usize, i64)]) -> u64 {
        let n = self.points.len();
        let mut diff = vec![0i64; n + 1];
        for &(from, to, bytes) in drops {
            let lo = self.points.partition_point(|p| p.0 <= from);
            let hi = self.points.partition_point(|p| p.0 < to);
            if lo < hi {
                diff[lo] += bytes;
                diff[hi] -= bytes;
            }
        }
        let mut best = self.start;
        let mut gone = 0i64;
        for (k, &(_, live, alloc)) in self.points.iter().enumerate() {
            gone += diff[k];
            if alloc {
                best = best.max(live - gone);
            }
        }
        best.max(0) as u64
    }
}

/// A VarStore variable as the replay needs it.
#[derive(Debug, Clone)]
pub(crate) struct VarEntry {
    pub layer: String,
    pub bytes: u64,
}

/// What was live when an iteration began, classified.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepStart {
    pub generation: u32,
    pub live: i64,
    pub param: FxHashMap<u64, i64>,
    pub buffer: FxHashMap<u64, i64>,
    pub grad: FxHashMap<u64, i64>,
    pub opt: i64,
    /// Blocks the device takes for itself, the cuBLAS and cuBLASLt workspaces (a
    /// prediction's, or those PyTorch holds at the step's end): WORKSPACE whenever they
    /// are made.
    pub device_owned: FxHashSet<u64>,
    /// Those of them alive when the step began, with their bytes.
    pub workspace: FxHashMap<u64, i64>,
}

/// Where the profile of a step goes, beside the run's CSV files.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepFiles {
    /// `<stem>_timeline.csv`: live bytes by category after every op.
    pub timeline_csv: std::path::PathBuf,
    /// `<stem>_layers.csv`: parameters, activations and FLOPs per layer.
    pub layers_csv: std::path::PathBuf,
    /// `<stem>_timeline.png`.
    pub png: std::path::PathBuf,
    /// `<stem>_timeline.svg`.
    pub svg: std::path::PathBuf,
}

impl StepFiles {
    /// The four files, in the order of the fields.
    pub fn paths(&self) -> [&std::path::Path; 4] {
        [&self.timeline_csv, &self.layers_csv, &self.png, &self.svg]
    }

    pub(crate) fn beside(dir: &std::path::Path, stem: &str) -> Self {
        StepFiles {
            timeline_csv: dir.join(format!("{stem}_timeline.csv")),
            layers_csv: dir.join(format!("{stem}_layers.csv")),
            png: dir.join(format!("{stem}_timeline.png")),
            svg: dir.join(format!("{stem}_timeline.svg")),
        }
    }
}

impl StepProfile {
    /// Forward phase ops' index range boundaries: the index (in `rows`) of the first
    /// backward row and of the first optimizer row after it, if any.
    pub fn phase_boundaries(&self) -> (Option<usize>, Option<usize>) {
        let bwd = self.rows.iter().position(|r| r.phase == Phase::Backward);
        let opt = bwd.and_then(|b| {
            self.rows[b..]
                .iter()
                .position(|r| r.phase == Phase::Optimizer)
                .map(|i| i + b)
        });
        (bwd, opt)
    }
}

/// Why a profile is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepKind {
    /// The step asked for with `timeline_step`.
    Requested(u64),
    /// The step with the run's highest peak so far, at an `epoch_end`.
    Peak,
    /// The same, when the profiler drops (written, not printed).
    PeakAtExit,
}
