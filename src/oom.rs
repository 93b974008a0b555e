//! Out-of-memory forensics: when an allocation fails, before the error reaches the
//! training code, what was live is written down.
//!
//! The native layer calls [`on_oom`] from the failing allocation: on the CPU from the
//! tracking allocator, on CUDA from the caching allocator's OOM path (holding its lock,
//! so nothing here touches CUDA memory). The report is built from the live-block
//! registry (by category, by layer, the largest blocks), printed, logged, and written
//! with a memory snapshot beside the run's CSV files. On CUDA the caching allocator's
//! own snapshot (segments, free blocks: the fragmentation) is written at the next
//! `record_stats` or `epoch_end`, outside the allocator's lock.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

use crate::ffi::{self, LiveBlock};
use crate::format;
use crate::timeline::{Names, Phase};

/// A live block at the moment of the failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomBlock {
    /// The op that allocated it (`(no op)` outside any op).
    pub op: String,
    /// The phase it was born in.
    pub phase: Phase,
    /// Its layer, `(none)` if unknown.
    pub layer: String,
    /// The iteration (step, from 1) that made it.
    pub iteration: u64,
    /// Its bytes.
    pub bytes: u64,
    /// Its category (see [`OomReport::by_category`]).
    pub category: String,
}

/// What was live when an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomReport {
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// The step (from 1) that was running.
    pub step: u64,
    /// Bytes the failed allocation asked for (CUDA: the rounded block size).
    pub requested_bytes: u64,
    /// Bytes allocated to tensors when it failed (CUDA: the caching allocator's count).
    pub allocated_bytes: u64,
    /// CUDA: bytes reserved by the caching allocator; `reserved - allocated` were
    /// cached but free, and the request fit in none of those blocks (fragmentation).
    pub reserved_bytes: Option<u64>,
    /// Live bytes by category, largest first; they add up to `allocated_bytes`:
    /// weights, gradients, forward (activations, the batch, forward temporaries),
    /// backward temporaries, after the backward pass (optimizer state and the like),
    /// and what was made before the profiler started or went unregistered.
    pub by_category: Vec<(String, u64)>,
    /// Live bytes by layer (weights and registered blocks), largest first, top 10.
    pub by_layer: Vec<(String, u64)>,
    /// The largest live blocks, top 10.
    pub largest_blocks: Vec<OomBlock>,
    /// The report's text file.
    pub report_path: Option<PathBuf>,
    /// The memory snapshot written with it (PyTorch's viewer opens it).
    pub snapshot_path: Option<PathBuf>,
}

impl OomReport {
    /// The report as terminal text.
    pub fn render(&self) -> String {
        let mut out = format!(
            "OUT OF MEMORY on {} during step {}: an allocation of {} failed with {} \
             allocated\n",
            self.device,
            self.step,
            format::bytes(self.requested_bytes),
            format::bytes(self.allocated_bytes)
        );
        if let Some(r) = self.reserved_bytes {
            out.push_str(&format!(
                "  reserved {}: {} of it cached but free, in blocks the request did not fit \
                 (fragmentation)\n",
                format::bytes(r),
                format::bytes(r.saturating_sub(self.allocated_bytes))
            ));
        }
        out.push_str("  live bytes by category:\n");
        for (c, b) in &self.by_category {
            out.push_str(&format!("    {c:<48} {:>12}\n", format::bytes(*b)));
        }
        out.push_str("  largest layers:\n");
        for (l, b) in &self.by_layer {
            out.push_str(&format!("    {l:<48} {:>12}\n", format::bytes(*b)));
        }
        out.push_str("  largest blocks: [category] op (phase, layer, iteration)\n");
        for b in &self.largest_blocks {
            out.push_str(&format!(
                "    {:>12}  [{}] {} ({}, {}, iteration {})\n",
                format::bytes(b.bytes),
                b.category.split(':').next().unwrap_or(""),
                b.op,
                b.phase.name(),
                b.layer,
                b.iteration
            ));
        }
        for (what, p) in [
            ("report", &self.report_path),
            ("snapshot", &self.snapshot_path),
        ] {
            if let Some(p) = p {
                out.push_str(&format!("  {what}: {}\n", p.display()));
            }
        }
        out
    }
}

/// What the OOM writer needs, kept up to date by the profiler.
pub(crate) struct OomContext {
    pub slot: usize,
    pub device: String,
    pub dir: PathBuf,
    pub stem: String,
    pub print: bool,
    pub step: u64,
    pub weights: HashSet<u64>,
    pub grads: HashSet<u64>,
    pub weights_by_layer: HashMap<String, u64>,
    pub weight_bytes: u64,
    pub history_entries: usize,
    pub count: u32,
    pub last: Option<OomReport>,
    pub pending_allocator_snapshot: Option<PathBuf>,
}

static OOM: Mutex<Option<OomContext>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Option<OomContext>) -> T) -> T {
    let mut g = OOM.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut g)
}

/// Installs the writer for a profiling session.
pub(crate) fn install(ctx: OomContext) {
    with(|c| *c = Some(ctx));
    ffi::set_oom_callback(Some(on_oom));
}

/// Removes it (the profiler drops).
pub(crate) fn uninstall() {
    ffi::set_oom_callback(None);
    with(|c| *c = None);
}

/// Updates what the writer knows (at each `record_stats`).
pub(crate) fn update(f: impl FnOnce(&mut OomContext)) {
    with(|c| {
        if let Some(c) = c.as_mut() {
            f(c)
        }
    });
}

/// The last report of this session.
pub(crate) fn last() -> Option<OomReport> {
    with(|c| c.as_ref().and_then(|c| c.last.clone()))
}

/// The CUDA allocator snapshot owed since the last OOM, if any.
pub(crate) fn take_pending_allocator_snapshot() -> Option<PathBuf> {
    with(|c| c.as_mut().and_then(|c| c.pending_allocator_snapshot.take()))
}

/// Called by the native layer when an allocation fails (see the module docs).
pub(crate) extern "C" fn on_oom(slot: i32, requested: i64, allocated: i64, reserved: i64) {
    let _ = std::panic::catch_unwind(|| {
        // Never wait here: the training thread may hold the lock, and on CUDA we run
        // inside the allocator.
        let Ok(mut guard) = OOM.try_lock() else {
            return;
        };
        let Some(ctx) = guard.as_mut() else {
            return;
        };
        if slot < 0 || slot as usize != ctx.slot {
            return;
        }
        // When the process itself is out of memory, writing the report needs memory
        // too: go on only if what it needs (the live-block list and some text) can be
        // had, rather than abort the process on a failed allocation.
        let live = ffi::registry().live.max(0) as usize;
        let need = live * std::mem::size_of::<LiveBlock>() * 2 + (4 << 20);
        if Vec::<u8>::new().try_reserve(need).is_err() {
            return;
        }
        let report = build(ctx, requested, allocated, (slot > 0).then_some(reserved));
        log::error!(
            "tch-memprof: out of memory on {} ({} requested, {} allocated); report: {}",
            report.device,
            format::bytes(report.requested_bytes),
            format::bytes(report.allocated_bytes),
            report
                .report_path
                .as_ref()
                .map_or("not written".into(), |p| p.display().to_string())
        );
        if ctx.print {
            let _ = crate::report::write_stdout(&report.render());
        }
        ctx.last = Some(report);
    });
}

fn build(ctx: &mut OomContext, requested: i64, allocated: i64, reserved: Option<i64>) -> OomReport {
    ctx.count += 1;
    let mut names = Names::default();
    let mut blocks: Vec<LiveBlock> = Vec::new();
    ffi::live_blocks(ctx.slot, &mut blocks);
    let allocated = allocated.max(0) as u64;

    let category = |b: &LiveBlock| -> &'static str {
        if ctx.weights.contains(&b.ptr) {
            "weights"
        } else if ctx.grads.contains(&b.ptr) {
            "gradients"
        } else {
            match b.phase {
                0 => "forward: activations, batch, temporaries",
                1 => "backward temporaries",
                2 => "after backward: optimizer state and the like",
                _ => "other",
            }
        }
    };
    let mut by_cat: HashMap<&'static str, u64> = HashMap::new();
    let mut by_layer: HashMap<String, u64> = ctx.weights_by_layer.clone();
    let mut registered = 0u64;
    let mut registered_weights = 0u64;
    for b in &blocks {
        let bytes = b.size.max(0) as u64;
        registered += bytes;
        let c = category(b);
        *by_cat.entry(c).or_default() += bytes;
        if c == "weights" {
            registered_weights += bytes; // counted in weights_by_layer already
        } else {
            let layer = names.layer(b.layer);
            *by_layer.entry(layer).or_default() += bytes;
        }
    }
    // What the registry did not see: born before the profiler started (the weights,
    // typically) or unregistered.
    let unseen = allocated.saturating_sub(registered);
    let unseen_weights = ctx
        .weight_bytes
        .saturating_sub(registered_weights)
        .min(unseen);
    *by_cat.entry("weights").or_default() += unseen_weights;
    if unseen > unseen_weights {
        *by_cat
            .entry("other, made before the profiler started")
            .or_default() += unseen - unseen_weights;
    }
    let mut by_category: Vec<(String, u64)> = by_cat
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .map(|(c, b)| (c.to_string(), b))
        .collect();
    by_category.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut by_layer: Vec<(String, u64)> = by_layer.into_iter().filter(|(_, b)| *b > 0).collect();
    by_layer.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    by_layer.truncate(10);

    let mut largest: Vec<&LiveBlock> = blocks.iter().collect();
    largest.sort_by_key(|b| std::cmp::Reverse(b.size));
    let largest_blocks = largest
        .iter()
        .take(10)
        .map(|b| OomBlock {
            op: names.op(b.op),
            phase: Phase::from_native(b.phase),
            layer: names.layer(b.layer),
            iteration: b.iter as u64,
            bytes: b.size.max(0) as u64,
            category: category(b).to_string(),
        })
        .collect();

    let mut report = OomReport {
        device: ctx.device.clone(),
        step: ctx.step,
        requested_bytes: requested.max(0) as u64,
        allocated_bytes: allocated,
        reserved_bytes: reserved.map(|r| r.max(0) as u64),
        by_category,
        by_layer,
        largest_blocks,
        report_path: None,
        snapshot_path: None,
    };
    let base = ctx.dir.join(format!("{}_oom{}", ctx.stem, ctx.count));
    if crate::fs::create_dir_all(&ctx.dir).is_ok() {
        let snapshot = base.with_extension("pickle");
        let mut history = Vec::new();
        ffi::read_history(&mut history, ctx.history_entries);
        let index = ctx.slot.saturating_sub(1);
        if crate::snapshot::write(
            &snapshot,
            index,
            &blocks,
            &history,
            ctx.slot as u8,
            &mut names,
        )
        .is_ok()
        {
            report.snapshot_path = Some(snapshot);
        }
        let text = base.with_extension("txt");
        report.report_path = Some(text.clone());
        if crate::fs::write_atomic(&text, report.render().as_bytes()).is_err() {
            report.report_path = None;
        }
        if ctx.slot > 0 {
            ctx.pending_allocator_snapshot = Some(
                ctx.dir
                    .join(format!("{}_oom{}_allocator.pickle", ctx.stem, ctx.count)),
            );
        }
    }
    report
}
