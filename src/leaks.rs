//! Leak hunting across epochs.
//!
//! With leak hunting on (the default), the native layer keeps a registry of live
//! blocks with their origin: the op that allocated them, the phase, the layer and the
//! iteration. At each `epoch_end` the live blocks that are not VarStore variables or
//! their gradients are grouped by origin `(op, phase, layer)` and compared with the
//! previous epoch end. After the warm-up epoch (optimizer state and caches appear once
//! and are not leaks), a group whose bytes grew is a suspect when
//!
//! - the live bytes outside weights and gradients grew by more than the threshold since
//!   the previous epoch end (a fast leak, named at the first epoch after the warm-up), or
//! - the same group also grew at the previous epoch end (a slow leak, named at the
//!   second epoch after the warm-up, whatever its size).
//!
//! A clean loop holds the same blocks at every epoch end, so no group grows.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::error::Result;
use crate::ffi::{self, RegisteredBlock};
use crate::format;
use crate::names::Names;
use crate::phase::Phase;

/// Default growth (bytes, between two epoch ends) that names suspects at once.
pub(crate) const DEFAULT_LEAK_THRESHOLD: u64 = 1 << 20;

/// Epochs that only set the baseline (default 1).
pub(crate) const DEFAULT_WARMUP_EPOCHS: u64 = 1;

/// Live blocks of one origin that survived into an epoch end and grew since the last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LeakGroup {
    /// The op that allocated the blocks: the outermost op on its thread (`aten::linear`)
    /// or the backward node (`AddmmBackward0`); `(none)` outside any op.
    pub op: String,
    /// The phase the blocks were born in.
    pub phase: Phase,
    /// The layer of that op (as in the step timeline), `(none)` if unknown.
    pub layer: String,
    /// The earliest iteration (step since the profiler was built, from 1) that made a
    /// block of the group that is still alive.
    pub first_iteration: u64,
    /// The latest such iteration.
    pub last_iteration: u64,
    /// Blocks alive.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Change of `bytes` since the previous epoch end.
    pub growth_bytes: i64,
    /// Change of `count` since the previous epoch end.
    pub growth_count: i64,
}

/// What a set of suspects usually means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeakPattern {
    /// Blocks of several forward ops of past iterations are alive: a tensor that still
    /// has its autograd graph is kept, and the graph keeps every activation it saved.
    GraphHeld,
    /// One forward op's output per iteration is kept: a collection that grows.
    GrowingCollection,
    /// Blocks made during backward are kept across iterations.
    KeptGradients,
    /// Blocks made after backward (optimizer step, code after it) are kept.
    KeptAfterStep,
    /// CUDA: reserved memory grows while allocated memory does not.
    ReservedGrowth,
}

impl LeakPattern {
    /// The pattern in plain words, with what usually causes it.
    pub fn explanation(self) -> &'static str {
        match self {
            LeakPattern::GraphHeld => {
                "activations of past iterations are still alive: a tensor that still has \
                 its autograd graph is being kept, and the graph keeps every activation \
                 it saved for backward (a graph held by a tensor). Usually a metric or \
                 validation loss computed outside tch::no_grad and summed across \
                 iterations (that pass never runs backward, so nothing frees its graph), \
                 or outputs stored without .detach(). Run evaluation inside \
                 tch::no_grad(|| ...) and accumulate plain numbers (f64::try_from(&loss)) \
                 or detached tensors."
            }
            LeakPattern::GrowingCollection => {
                "one tensor per iteration from the same op is kept: a collection that only \
                 grows (outputs pushed into a Vec, a cache that is never evicted, a \
                 tensor concatenated onto every iteration). Keep numbers instead of \
                 tensors, bound the collection, or evict the cache."
            }
            LeakPattern::KeptGradients => {
                "tensors made during backward are kept across iterations: gradients \
                 cloned or collected into a list, or a graph kept for a second backward \
                 (keep_graph) and never released."
            }
            LeakPattern::KeptAfterStep => {
                "tensors made after backward (in the optimizer step or in code run under \
                 no_grad after it) are kept across iterations: optimizer state created \
                 for parameters that only now get gradients, or results collected after \
                 the step."
            }
            LeakPattern::ReservedGrowth => {
                "the CUDA caching allocator reserves more memory each epoch while the \
                 allocated bytes stay flat: its pool fragments (tensor shapes that vary \
                 between iterations). Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, \
                 or keep shapes fixed (pad the last batch)."
            }
        }
    }
}

/// What the leak hunt found at one epoch end.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LeakReport {
    /// The epoch that just ended.
    pub epoch: u64,
    /// Change since the previous epoch end of live bytes outside weights and gradients.
    pub growth_bytes: i64,
    /// CUDA: change of reserved bytes since the previous epoch end.
    pub reserved_growth_bytes: Option<i64>,
    /// The suspect groups, largest growth first.
    pub suspects: Vec<LeakGroup>,
    /// What the suspects look like, if recognised.
    pub pattern: Option<LeakPattern>,
    /// False when some blocks could not be registered (more than two million blocks
    /// live at once): the groups are then incomplete.
    pub complete: bool,
}

impl LeakReport {
    /// One line for the log.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "epoch {}: memory outside weights and gradients grew by {} since the previous \
             epoch end",
            self.epoch,
            format::signed_bytes(self.growth_bytes)
        );
        if let Some(top) = self.suspects.first() {
            s.push_str(&format!(
                "; largest suspect: {} ({}, layer {}) with {} in {} blocks from iterations \
                 {}..={}",
                top.op,
                top.phase.name(),
                top.layer,
                format::bytes(top.bytes),
                top.count,
                top.first_iteration,
                top.last_iteration
            ));
        }
        if let Some(p) = self.pattern {
            s.push_str(&format!("; {}", p.explanation()));
        }
        s
    }
}

/// A group's origin: (op name id, birth phase, layer name id).
type Key = (i32, Phase, i32);

#[derive(Debug, Clone, Copy, Default)]
struct Agg {
    count: u64,
    bytes: u64,
    first: u32,
    last: u32,
}

/// Groups live blocks by origin, leaving out the blocks in `exclude`.
fn group(blocks: &[RegisteredBlock], exclude: &HashSet<u64>) -> HashMap<Key, Agg> {
    let mut groups: HashMap<Key, Agg> = HashMap::new();
    for b in blocks.iter().filter(|b| !exclude.contains(&b.ptr)) {
        let a = groups.entry((b.op, b.phase, b.layer)).or_insert(Agg {
            first: u32::MAX,
            ..Agg::default()
        });
        a.count += 1;
        a.bytes += b.bytes;
        a.first = a.first.min(b.iteration);
        a.last = a.last.max(b.iteration);
    }
    groups
}

/// Which groups are suspects, given the groups at this and the previous epoch end and
/// the groups that grew at the previous one. Returns (suspect keys by growth, growing
/// keys, total growth).
fn judge(
    now: &HashMap<Key, Agg>,
    prev: &HashMap<Key, Agg>,
    grew_before: &HashSet<Key>,
    threshold: u64,
) -> (Vec<Key>, HashSet<Key>, i64) {
    let total = |m: &HashMap<Key, Agg>| m.values().map(|a| a.bytes as i64).sum::<i64>();
    let growth = total(now) - total(prev);
    let delta = |k: &Key, a: &Agg| a.bytes as i64 - prev.get(k).map_or(0, |p| p.bytes as i64);
    let growing: HashSet<Key> = now
        .iter()
        .filter(|(k, a)| delta(k, a) > 0)
        .map(|(k, _)| *k)
        .collect();
    let fast = growth > threshold as i64;
    let mut suspects: Vec<Key> = growing
        .iter()
        .filter(|k| fast || grew_before.contains(k))
        .copied()
        .collect();
    suspects.sort_by_key(|k| (std::cmp::Reverse(delta(k, &now[k])), *k));
    (suspects, growing, growth)
}

/// Names the pattern of a set of suspects.
fn pattern_of(suspects: &[LeakGroup], reserved_only: bool) -> Option<LeakPattern> {
    if suspects.is_empty() {
        return reserved_only.then_some(LeakPattern::ReservedGrowth);
    }
    let forward_ops: HashSet<&str> = suspects
        .iter()
        .filter(|g| g.phase == Phase::Forward)
        .map(|g| g.op.as_str())
        .collect();
    if forward_ops.len() >= 2 {
        return Some(LeakPattern::GraphHeld);
    }
    Some(match suspects[0].phase {
        Phase::Forward => LeakPattern::GrowingCollection,
        Phase::Backward => LeakPattern::KeptGradients,
        Phase::Optimizer => LeakPattern::KeptAfterStep,
    })
}

/// The hunt's state between epoch ends.
pub(crate) struct LeakHunter {
    slot: usize,
    threshold: u64,
    warmup_epochs: u64,
    blocks: Vec<RegisteredBlock>,
    prev: Option<HashMap<Key, Agg>>,
    grew_before: HashSet<Key>,
    prev_reserved: Option<(i64, i64)>,
    names: Names,
}

impl LeakHunter {
    pub(crate) fn new(slot: usize, threshold: u64, warmup_epochs: u64) -> Self {
        LeakHunter {
            slot,
            threshold,
            warmup_epochs,
            blocks: Vec::new(),
            prev: None,
            grew_before: HashSet::new(),
            prev_reserved: None,
            names: Names::default(),
        }
    }

    /// Bytes this hunter holds (its buffers), for the profiler's own-memory figure.
    pub(crate) fn own_bytes(&self) -> u64 {
        let per_group = std::mem::size_of::<(Key, Agg)>() as u64;
        (self.blocks.capacity() * std::mem::size_of::<RegisteredBlock>()) as u64
            + self
                .prev
                .as_ref()
                .map_or(0, |m| m.capacity() as u64 * per_group)
            + self.grew_before.capacity() as u64 * std::mem::size_of::<Key>() as u64
    }

    /// Looks for leaks at the end of `epoch`. `exclude`: storages of variables and
    /// gradients; `cuda`: (allocated, reserved) on CUDA runs.
    pub(crate) fn epoch_end(
        &mut self,
        epoch: u64,
        exclude: &HashSet<u64>,
        cuda: Option<(i64, i64)>,
    ) -> Result<Option<LeakReport>> {
        ffi::live_blocks(self.slot, &mut self.blocks)?;
        let now = group(&self.blocks, exclude);
        let prev = self.prev.replace(now);
        let prev_reserved = std::mem::replace(&mut self.prev_reserved, cuda);
        let now = self.prev.as_ref().expect("set above");
        if epoch <= self.warmup_epochs {
            return Ok(None);
        }
        let Some(prev) = prev else {
            return Ok(None);
        };
        let (keys, growing, growth) = judge(now, &prev, &self.grew_before, self.threshold);
        self.grew_before = growing;

        let reserved_growth = match (cuda, prev_reserved) {
            (Some((_, r)), Some((_, pr))) => Some(r - pr),
            _ => None,
        };
        let allocated_growth = match (cuda, prev_reserved) {
            (Some((a, _)), Some((pa, _))) => a - pa,
            _ => 0,
        };
        let reserved_only = reserved_growth.is_some_and(|r| {
            r > self.threshold as i64 && allocated_growth <= self.threshold as i64 / 4
        });
        if keys.is_empty() && !reserved_only {
            return Ok(None);
        }
        let suspects: Vec<LeakGroup> = keys
            .iter()
            .map(|k| {
                let a = now[k];
                let p = prev.get(k).copied().unwrap_or_default();
                LeakGroup {
                    op: self.names.get(k.0),
                    phase: k.1,
                    layer: self.names.get(k.2),
                    first_iteration: a.first as u64,
                    last_iteration: a.last as u64,
                    count: a.count,
                    bytes: a.bytes,
                    growth_bytes: a.bytes as i64 - p.bytes as i64,
                    growth_count: a.count as i64 - p.count as i64,
                }
            })
            .collect();
        let pattern = pattern_of(&suspects, reserved_only);
        Ok(Some(LeakReport {
            epoch,
            growth_bytes: growth,
            reserved_growth_bytes: reserved_growth,
            suspects,
            pattern,
            complete: ffi::registry()?.dropped == 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(count: u64, bytes: u64) -> Agg {
        Agg {
            count,
            bytes,
            first: 1,
            last: 1,
        }
    }

    #[test]
    fn steady_groups_are_not_suspects() {
        let m: HashMap<Key, Agg> = [
            ((1, Phase::Forward, 2), agg(3, 300)),
            ((4, Phase::Optimizer, -1), agg(2, 80)),
        ]
        .into();
        let (s, growing, growth) = judge(&m, &m, &HashSet::new(), 0);
        assert!(s.is_empty() && growing.is_empty());
        assert_eq!(growth, 0);
    }

    #[test]
    fn fast_growth_names_every_growing_group_largest_first() {
        let prev: HashMap<Key, Agg> = [((1, Phase::Forward, 2), agg(1, 100))].into();
        let now: HashMap<Key, Agg> = [
            ((1, Phase::Forward, 2), agg(2, 200)),
            ((5, Phase::Forward, 2), agg(1, 5000)),
            ((6, Phase::Backward, 2), agg(1, 10)),
        ]
        .into();
        let (s, _, growth) = judge(&now, &prev, &HashSet::new(), 1000);
        assert_eq!(growth, 5110);
        assert_eq!(
            s,
            vec![
                (5, Phase::Forward, 2),
                (1, Phase::Forward, 2),
                (6, Phase::Backward, 2)
            ]
        );
    }

    #[test]
    fn slow_growth_needs_two_epochs_in_a_row() {
        let e1: HashMap<Key, Agg> = [((1, Phase::Forward, 2), agg(1, 100))].into();
        let e2: HashMap<Key, Agg> = [((1, Phase::Forward, 2), agg(2, 200))].into();
        let e3: HashMap<Key, Agg> = [((1, Phase::Forward, 2), agg(3, 300))].into();
        let (s2, grew, _) = judge(&e2, &e1, &HashSet::new(), 1 << 20);
        assert!(s2.is_empty(), "one small growth is not yet a leak");
        let (s3, _, _) = judge(&e3, &e2, &grew, 1 << 20);
        assert_eq!(s3, vec![(1, Phase::Forward, 2)]);
    }

    #[test]
    fn a_group_that_shrank_back_is_not_a_suspect() {
        let e1: HashMap<Key, Agg> = [((1, Phase::Forward, 2), agg(1, 100))].into();
        let e2: HashMap<Key, Agg> = [((1, Phase::Forward, 2), agg(2, 200))].into();
        let (_, grew, _) = judge(&e2, &e1, &HashSet::new(), 1 << 20);
        let (s3, _, _) = judge(&e1, &e2, &grew, 1 << 20);
        assert!(s3.is_empty());
    }

    fn group_of(op: &str, phase: Phase) -> LeakGroup {
        LeakGroup {
            op: op.into(),
            phase,
            layer: "l".into(),
            first_iteration: 1,
            last_iteration: 2,
            count: 2,
            bytes: 8,
            growth_bytes: 4,
            growth_count: 1,
        }
    }

    #[test]
    fn patterns() {
        let graph = [
            group_of("aten::relu", Phase::Forward),
            group_of("aten::linear", Phase::Forward),
        ];
        assert_eq!(pattern_of(&graph, false), Some(LeakPattern::GraphHeld));
        let one = [group_of("aten::linear", Phase::Forward)];
        assert_eq!(
            pattern_of(&one, false),
            Some(LeakPattern::GrowingCollection)
        );
        let bwd = [group_of("MmBackward0", Phase::Backward)];
        assert_eq!(pattern_of(&bwd, false), Some(LeakPattern::KeptGradients));
        let opt = [group_of("aten::add", Phase::Optimizer)];
        assert_eq!(pattern_of(&opt, false), Some(LeakPattern::KeptAfterStep));
        assert_eq!(pattern_of(&[], true), Some(LeakPattern::ReservedGrowth));
        assert_eq!(pattern_of(&[], false), None);
    }
}
