//! Out-of-memory forensics: when an allocation fails, before the error reaches the
//! training code, what was live is written down.
//!
//! The native layer calls the session's OOM hook from the failing allocation: on the
//! CPU from the tracking allocator, on CUDA from the caching allocator's OOM path
//! (holding its lock, so nothing here touches CUDA memory). [`build`] makes the report
//! from the live-block registry (by category, by layer, the largest blocks); the
//! report sinks write and print it. On CUDA the caching allocator's own snapshot
//! (segments, free blocks: the fragmentation) is written at the next `record_stats` or
//! `epoch_end`, outside the allocator's lock.
//!
//! The process may itself be out of memory: [`build`] first checks that it can have
//! what the report needs (the live-block list, the history it includes, the text and
//! the snapshot), and gives up otherwise rather than abort the process.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use rustc_hash::FxHashSet;

use crate::ffi::{self, HistoryEvent, OomEvent, RegisteredBlock};
use crate::names::Names;
use crate::phase::Phase;

/// What a live byte was when an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum OomCategory {
    /// VarStore variables.
    Weights,
    /// Their gradients.
    Gradients,
    /// Made in a forward phase: activations, the batch, forward temporaries.
    Forward,
    /// Made in a backward phase of the iteration that failed, or one before it and
    /// not a weight gradient: temporaries, and the gradients made since the last
    /// `record_stats` (which cannot be told from them before it reads them).
    Backward,
    /// Made after backward: optimizer state and the like.
    AfterBackward,
    /// Made before the profiler started, or not registered.
    Unseen,
}

impl OomCategory {
    /// The category in words, as in the report.
    pub fn label(self) -> &'static str {
        match self {
            OomCategory::Weights => "weights",
            OomCategory::Gradients => "gradients",
            OomCategory::Forward => "forward: activations, batch, temporaries",
            OomCategory::Backward => "backward: temporaries, new gradients",
            OomCategory::AfterBackward => "after backward: optimizer state and the like",
            OomCategory::Unseen => "other, made before the profiler started",
        }
    }

    /// One word, for the list of largest blocks.
    pub fn short(self) -> &'static str {
        match self {
            OomCategory::Weights => "weights",
            OomCategory::Gradients => "gradients",
            OomCategory::Forward => "forward",
            OomCategory::Backward => "backward",
            OomCategory::AfterBackward => "after backward",
            OomCategory::Unseen => "other",
        }
    }
}

impl fmt::Display for OomCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A live block at the moment of the failure.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OomBlock {
    /// The op that allocated it (`(none)` outside any op).
    pub op: String,
    /// The phase it was born in.
    pub phase: Phase,
    /// Its layer, `(none)` if unknown.
    pub layer: String,
    /// The iteration (step, from 1) that made it.
    pub iteration: u64,
    /// Its bytes.
    pub bytes: u64,
    /// Its category.
    pub category: OomCategory,
}

/// What was live when an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Live bytes by category, largest first; they add up to `allocated_bytes`.
    pub by_category: Vec<(OomCategory, u64)>,
    /// Live bytes by layer (weights and registered blocks), largest first, top 10.
    pub by_layer: Vec<(String, u64)>,
    /// The largest live blocks, top 10.
    pub largest_blocks: Vec<OomBlock>,
    /// The report's text file.
    pub report_path: Option<PathBuf>,
    /// The memory snapshot written with it (PyTorch's viewer opens it).
    pub snapshot_path: Option<PathBuf>,
}

/// What the OOM writer knows of the run, kept up to date by the profiler at each
/// `record_stats`.
pub(crate) struct OomState {
    pub slot: usize,
    pub device: String,
    pub step: u64,
    pub weights: FxHashSet<u64>,
    /// The gradients' block addresses (a list: copied at every iteration whose
    /// gradients moved, searched only when a report is written).
    pub grads: Vec<u64>,
    pub weights_by_layer: HashMap<String, u64>,
    pub weight_bytes: u64,
    /// Events of the memory history included in the snapshot (0: none).
    pub history_entries: usize,
    /// Reports written so far.
    pub count: u32,
    pub last: Option<OomReport>,
    /// A report made since the profiler last looked (to log it outside the hook).
    pub unlogged: bool,
    /// CUDA: the allocator snapshot owed since the last OOM.
    pub pending_allocator_snapshot: Option<PathBuf>,
}

impl OomState {
    pub(crate) fn new(slot: usize, device: String) -> Self {
        OomState {
            slot,
            device,
            step: 1,
            weights: FxHashSet::default(),
            grads: Default::default(),
            weights_by_layer: HashMap::new(),
            weight_bytes: 0,
            history_entries: 0,
            count: 0,
            last: None,
            unlogged: false,
            pending_allocator_snapshot: None,
        }
    }
}

/// The live blocks and history a report was built from (for its snapshot).
pub(crate) struct Forensics {
    pub blocks: Vec<RegisteredBlock>,
    pub history: Vec<HistoryEvent>,
    pub names: Names,
}

/// Bytes of memory a report may use beyond its lists: text, maps, file buffers.
const SLACK: usize = 4 << 20;
/// Bytes per listed block or history event while the snapshot is built (the native
/// record read and its decoded value, its frame and its pickled form).
const PER_ENTRY: usize = 512;

/// Builds the report of a failed allocation, or None when the process cannot have
/// the memory that building it needs.
pub(crate) fn build(st: &mut OomState, e: OomEvent) -> Option<(OomReport, Forensics)> {
    let live = ffi::registry().ok()?.live.max(0) as usize;
    let (total, ring) = ffi::history_len().ok()?;
    let history = (total.min(ring) as usize).min(st.history_entries);
    let need = (live + live / 4 + 64 + history).saturating_mul(PER_ENTRY) + SLACK;
    // Checked, then given back: the lists below take their part of it.
    if Vec::<u8>::new().try_reserve_exact(need).is_err() {
        return None;
    }
    let mut blocks = Vec::new();
    ffi::live_blocks(st.slot, &mut blocks).ok()?;
    let mut hist = Vec::new();
    if history > 0 {
        ffi::read_history(&mut hist, history).ok()?;
    }
    st.count += 1;
    let mut names = Names::default();
    let report = summarize(st, e, &blocks, &mut names);
    Some((
        report,
        Forensics {
            blocks,
            history: hist,
            names,
        },
    ))
}

fn summarize(
    st: &OomState,
    e: OomEvent,
    blocks: &[RegisteredBlock],
    names: &mut Names,
) -> OomReport {
    let allocated = e.allocated.max(0) as u64;
    let grads: FxHashSet<u64> = st.grads.iter().copied().collect();
    let category = |b: &RegisteredBlock| -> OomCategory {
        if st.weights.contains(&b.ptr) {
            OomCategory::Weights
        } else if u64::from(b.iteration) < st.step && grads.contains(&b.ptr) {
            // The gradients as the last record_stats read them. A block born since
            // cannot be one of those: after a zero_grad that sets gradients to none,
            // an activation at one of their addresses (reused at once by CUDA's
            // caching allocator) is an activation.
            OomCategory::Gradients
        } else {
            match b.phase {
                Phase::Forward => OomCategory::Forward,
                Phase::Backward => OomCategory::Backward,
                Phase::Optimizer => OomCategory::AfterBackward,
            }
        }
    };
    let mut by_cat: HashMap<OomCategory, u64> = HashMap::new();
    let mut by_layer: HashMap<String, u64> = st.weights_by_layer.clone();
    let mut registered = 0u64;
    let mut registered_weights = 0u64;
    for b in blocks {
        let bytes = b.bytes;
        registered += bytes;
        let c = category(b);
        *by_cat.entry(c).or_default() += bytes;
        if c == OomCategory::Weights {
            registered_weights += bytes; // counted in weights_by_layer already
        } else {
            *by_layer.entry(names.get(b.layer)).or_default() += bytes;
        }
    }
    // What the registry did not see: born before the profiler started (the weights,
    // typically) or unregistered.
    let unseen = allocated.saturating_sub(registered);
    let unseen_weights = st
        .weight_bytes
        .saturating_sub(registered_weights)
        .min(unseen);
    *by_cat.entry(OomCategory::Weights).or_default() += unseen_weights;
    if unseen > unseen_weights {
        *by_cat.entry(OomCategory::Unseen).or_default() += unseen - unseen_weights;
    }
    let mut by_category: Vec<(OomCategory, u64)> =
        by_cat.into_iter().filter(|(_, b)| *b > 0).collect();
    by_category.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut by_layer: Vec<(String, u64)> = by_layer.into_iter().filter(|(_, b)| *b > 0).collect();
    by_layer.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    by_layer.truncate(10);

    let mut largest: Vec<&RegisteredBlock> = blocks.iter().collect();
    largest.sort_by_key(|b| std::cmp::Reverse(b.bytes));
    let largest_blocks = largest
        .iter()
        .take(10)
        .map(|b| OomBlock {
            op: names.get(b.op),
            phase: b.phase,
            layer: names.get(b.layer),
            iteration: b.iteration as u64,
            bytes: b.bytes,
            category: category(b),
        })
        .collect();

    OomReport {
        device: st.device.clone(),
        step: st.step,
        requested_bytes: e.requested.max(0) as u64,
        allocated_bytes: allocated,
        reserved_bytes: (e.slot > 0).then_some(e.reserved.max(0) as u64),
        by_category,
        by_layer,
        largest_blocks,
        report_path: None,
        snapshot_path: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Phase;

    fn block(ptr: u64, bytes: u64, iteration: u32, phase: Phase) -> RegisteredBlock {
        RegisteredBlock {
            ptr,
            bytes,
            op: -1,
            layer: -1,
            iteration,
            phase,
        }
    }

    /// The gradients the last `record_stats` read are gradients while they live; a block
    /// born since at one of their addresses (a `zero_grad` that sets gradients to none
    /// freed them, the allocator reused the address) is what its phase says.
    #[test]
    fn blocks_born_since_the_gradients_were_read_are_not_gradients() {
        let mut st = OomState::new(0, "cpu".into());
        st.step = 5; // the failing iteration; record_stats ended the 4th
        st.weights.insert(0x100);
        st.grads = vec![0x200, 0x300, 0x400];
        let blocks = [
            block(0x100, 1, 1, Phase::Forward),        // a weight
            block(0x200, 10, 1, Phase::Backward),      // a gradient kept since the 1st
            block(0x300, 100, 5, Phase::Forward),      // an activation at a freed gradient's place
            block(0x400, 1_000, 5, Phase::Backward),   // a new gradient, or a temporary
            block(0x500, 10_000, 4, Phase::Optimizer), // optimizer state
        ];
        let e = OomEvent {
            slot: 0,
            requested: 1 << 40,
            allocated: 11_111,
            reserved: 0,
        };
        let r = summarize(&st, e, &blocks, &mut Names::default());
        let cat = |c: OomCategory| {
            r.by_category
                .iter()
                .find(|(k, _)| *k == c)
                .map_or(0, |(_, b)| *b)
        };
        assert_eq!(cat(OomCategory::Weights), 1);
        assert_eq!(cat(OomCategory::Gradients), 10);
        assert_eq!(cat(OomCategory::Forward), 100);
        assert_eq!(cat(OomCategory::Backward), 1_000);
        assert_eq!(cat(OomCategory::AfterBackward), 10_000);
        let listed: Vec<(u64, OomCategory)> = r
            .largest_blocks
            .iter()
            .map(|b| (b.bytes, b.category))
            .collect();
        assert!(listed.contains(&(100, OomCategory::Forward)), "{listed:?}");
    }
}
