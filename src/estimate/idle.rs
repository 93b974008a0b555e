//! What a `drop` would save in the predicted step: the blocks live at the predicted peak
//! whose last read came before it (docs/step-anatomy.md, "idle at the peak"), and the
//! peak the same step would have had with them freed right after their last read, found
//! by replaying the dry run's trace that way through the caching-allocator model.
//!
//! The dry run logs every op's tensor inputs (`META_READ`, backward nodes' kernels
//! included, so a tensor saved for backward is read there). A block is idle at the peak
//! when it is live at the allocation that reaches the predicted peak allocated, is not a
//! gradient (made in a backward pass, alive after it) or optimizer state (made in an
//! optimizer step, alive after it), and the outermost op of its last read (or,
//! never read, the op that made it) returned before that allocation.

use std::collections::HashMap;

use super::replay::replay;
use super::{IdleAtPredictedPeak, IdleGroup, Options};
use crate::error::Result;
use crate::ffi::{self, native, MetaEvent};
use crate::names::MISSING;
use crate::timeline::sites::SiteNames;

/// How many groups are named (each costs one replay); the rest count in the total.
const MAX_GROUPS: usize = 8;

/// What groups idle blocks: the interned op that made them, its module, the op that read
/// them last.
type GroupKey = (i32, i32, i32);

/// One block of the run.
#[derive(Clone, Copy)]
struct Block {
    born: usize,
    bytes: i64,
    /// The site (call stack) of its allocation + 1, 0 when none was kept.
    site: i32,
    /// Interned op and module of the outermost op that made it.
    op: i32,
    layer: i32,
    /// Event index of its free (`run.len()`: it outlived the run).
    freed: usize,
    /// Interned name of the outermost op of its last read, and the event index where that
    /// op returned (`None`: never read, or read by an op still open at the end).
    last_read_op: i32,
    droppable_at: Option<usize>,
    /// Made in a backward pass and alive after it (a gradient; with gradient
    /// accumulation, alive into the next micro-batch), or made in an optimizer step and
    /// alive after it (its state).
    kept_by_design: bool,
}

/// The blocks idle at the allocation `peak_at` of `run` (the event that reached the
/// predicted peak allocated), grouped by the op (and module) that made them and the op
/// that read them last, largest first, each group and all together with the predicted
/// peak had the blocks of the group been freed right after their last read in every
/// step (a `drop` in the loop's code acts in every step).
pub(super) fn idle_at_peak(
    weights: &[MetaEvent],
    run: &[MetaEvent],
    options: &Options,
    peak_at: usize,
    peak_allocated: u64,
) -> Result<IdleAtPredictedPeak> {
    let blocks = blocks(run);
    let idle: Vec<&Block> = blocks
        .values()
        .filter(|b| {
            b.born <= peak_at
                && peak_at < b.freed
                && !b.kept_by_design
                && b.droppable_at.is_some_and(|d| d < peak_at)
        })
        .collect();
    let mut by_group: HashMap<GroupKey, Vec<&Block>> = HashMap::new();
    for b in &idle {
        by_group.entry(b.key()).or_default().push(b);
    }
    let mut groups: Vec<(u64, GroupKey, Vec<&Block>)> = by_group
        .into_iter()
        .map(|(k, bs)| (bs.iter().map(|b| b.bytes.max(0) as u64).sum(), k, bs))
        .collect();
    groups.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let name = |id: i32| -> Result<String> {
        Ok(match id {
            id if id < 0 => MISSING.to_string(),
            id => ffi::name(id)?.unwrap_or_else(|| MISSING.to_string()),
        })
    };
    // A drop is a change to the loop's code, made in every step: each group's blocks are
    // freed after their last read wherever they are made (the same op, module and last
    // reader), in every step, not only those idle at the peak.
    let everywhere = |keys: &[GroupKey]| -> Vec<&Block> {
        blocks
            .values()
            .filter(|b| {
                !b.kept_by_design
                    && keys.contains(&b.key())
                    && b.droppable_at.is_some_and(|d| d < b.freed)
            })
            .collect()
    };
    let replayed = |drop: &[&Block]| -> Result<(u64, u64)> {
        let e = replay(weights, &dropped_early(run, drop), options)?;
        Ok((e.peak_allocated, e.peak_reserved))
    };
    let mut sites = SiteNames::new();
    let mut named = Vec::new();
    for (bytes, (op, layer, read), bs) in groups.iter().take(MAX_GROUPS) {
        // The line of the group's largest block that has one.
        let mut located: Vec<&&Block> = bs.iter().filter(|b| b.site > 0).collect();
        located.sort_by_key(|b| std::cmp::Reverse(b.bytes));
        let site = located.iter().find_map(|b| sites.name_in_model(b.site));
        named.push(IdleGroup {
            site,
            bytes: *bytes,
            blocks: bs.len(),
            op: name(*op)?,
            layer: if *layer < 0 { None } else { ffi::name(*layer)? },
            last_read_op: match read {
                r if *r < 0 => "(never read)".to_string(),
                r => name(*r)?,
            },
            peak_if_dropped: replayed(&everywhere(&[(*op, *layer, *read)]))?.0,
        });
    }
    let (peak_if_dropped, reserved_if_dropped) = if idle.is_empty() {
        (peak_allocated, 0)
    } else {
        let keys: Vec<GroupKey> = groups.iter().map(|(_, k, _)| *k).collect();
        replayed(&everywhere(&keys))?
    };
    Ok(IdleAtPredictedPeak {
        bytes: idle.iter().map(|b| b.bytes.max(0) as u64).sum(),
        blocks: idle.len(),
        peak_if_dropped,
        reserved_if_dropped,
        groups: named,
    })
}

impl Block {
    fn key(&self) -> GroupKey {
        (self.op, self.layer, self.last_read_op)
    }
}

/// Every block of the run by id, with its birth, reads, free and phase facts.
fn blocks(run: &[MetaEvent]) -> HashMap<u64, Block> {
    let mut blocks: HashMap<u64, Block> = HashMap::new();
    // Blocks read by the op now open (outermost), to settle when it returns.
    let mut read_now: Vec<u64> = Vec::new();
    let (mut op, mut layer) = (-1, -1);
    let mut phase = native::MARK_FORWARD;
    // Made in the current backward pass / optimizer step.
    let mut born_in_phase: Vec<u64> = Vec::new();
    for (i, e) in run.iter().enumerate() {
        match e.kind {
            native::META_ALLOC => {
                blocks.insert(
                    e.id,
                    Block {
                        born: i,
                        bytes: e.bytes,
                        site: e.name.max(0),
                        op,
                        layer,
                        freed: run.len(),
                        last_read_op: -1,
                        droppable_at: None,
                        kept_by_design: false,
                    },
                );
                if phase == native::MARK_BACKWARD || phase == native::MARK_OPTIMIZER {
                    born_in_phase.push(e.id);
                }
                // Never read: droppable once the op that made it returns.
                read_now.push(e.id);
            }
            native::META_FREE => {
                if let Some(b) = blocks.get_mut(&e.id) {
                    b.freed = i;
                }
            }
            native::META_READ => {
                if let Some(b) = blocks.get_mut(&e.id) {
                    b.last_read_op = op;
                    b.droppable_at = None;
                    read_now.push(e.id);
                }
            }
            native::META_OP => {
                op = e.name;
                layer = e.layer;
            }
            native::META_OP_END => {
                for id in read_now.drain(..) {
                    if let Some(b) = blocks.get_mut(&id) {
                        b.droppable_at = Some(i);
                    }
                }
                op = -1;
                layer = -1;
            }
            native::META_MARK => {
                let ending = phase;
                if e.mark == native::MARK_FORWARD
                    || e.mark == native::MARK_BACKWARD
                    || e.mark == native::MARK_OPTIMIZER
                {
                    // Gradients: made in backward, alive when the optimizer step begins;
                    // optimizer state: made in the step, alive when the next phase does.
                    let keeps = ending == native::MARK_BACKWARD || ending == native::MARK_OPTIMIZER;
                    for id in born_in_phase.drain(..) {
                        if let Some(b) = blocks.get_mut(&id) {
                            if keeps && b.freed == run.len() {
                                b.kept_by_design = true;
                            }
                        }
                    }
                    phase = e.mark;
                }
            }
            _ => {}
        }
    }
    // Still made in the last optimizer step at the end: its state.
    if phase == native::MARK_OPTIMIZER {
        for id in born_in_phase {
            if let Some(b) = blocks.get_mut(&id) {
                if b.freed == run.len() {
                    b.kept_by_design = true;
                }
            }
        }
    }
    blocks
}

/// The run with each block of `drop` freed right after the op of its last read returned
/// (its own free left out).
fn dropped_early(run: &[MetaEvent], drop: &[&Block]) -> Vec<MetaEvent> {
    let mut at: HashMap<usize, Vec<&Block>> = HashMap::new();
    let mut frees: std::collections::HashSet<usize> = Default::default();
    for b in drop {
        if let Some(d) = b.droppable_at {
            at.entry(d).or_default().push(b);
            frees.insert(b.freed);
        }
    }
    let mut out = Vec::with_capacity(run.len());
    for (i, e) in run.iter().enumerate() {
        if e.kind == native::META_FREE && frees.contains(&i) {
            continue;
        }
        out.push(*e);
        if let Some(bs) = at.get(&i) {
            for b in bs {
                out.push(MetaEvent {
                    id: run[b.born].id,
                    bytes: b.bytes,
                    kind: native::META_FREE,
                    name: -1,
                    mark: native::MARK_NONE,
                    layer: -1,
                });
            }
        }
    }
    out
}
