//! A rank's events: the one-GPU dry run's, with FSDP2's shards and buffers (see the
//! module above for what each is and when).

use std::collections::{HashMap, HashSet};

use super::units::units;
use super::{elem_bytes, Fsdp, ShardedCategory, Var};
use crate::error::Result;
use crate::events::{Event, EventKind};
use crate::phase::Phase;

/// Fresh block ids of FSDP's own buffers: far from the dry run's fake addresses and from
/// the replay's workspace ids.
const FSDP_ID: u64 = 0x5D00_0000_0000_0000;
/// The run's blocks, renamed one name a block.
const RENAMED_ID: u64 = 0x5E00_0000_0000_0000;

/// Streams of FSDP2's buffers, by index in the replay (0 is the default stream): the
/// all-gather copy-in stream (where the all-gather outputs are made) and the
/// reduce-scatter stream.
const ALL_GATHER_STREAM: u32 = 1;
const REDUCE_SCATTER_STREAM: u32 = 2;

/// A rank's events: the dry run's with FSDP2's states and buffers, and the category of
/// every block FSDP2 makes or resizes.
pub(crate) struct Sharded {
    pub weights: Vec<Event>,
    pub events: Vec<Event>,
    pub categories: HashMap<u64, ShardedCategory>,
}

struct Unit {
    params: Vec<usize>,
    /// Padded shard bytes of the unit's trainable parameters (Σ c·r·b) in their dtype:
    /// the gradient shards'.
    shard: u64,
    /// Every parameter's (frozen ones too) in `param_dtype`: what each rank puts into the
    /// all-gather.
    gather: u64,
    /// The trainable parameters' in `reduce_dtype`: each rank's reduce-scatter output.
    reduce: u64,
    /// The shards are cast to `param_dtype` before the all-gather.
    cast: bool,
    /// The reduce-scatter output is cast to the parameters' dtype.
    recast: bool,
}

/// Rank `rank` of `fsdp` over the dry run (`weights`, `run`) of a model with `vars` (in
/// the order of the dry run's variable indices).
/// `loss_scope`: the name id of the scope the dry run's loss ran in (the model's
/// forward pass has returned at its first op). `foreach_set`: the optimizer is PyTorch's
/// foreach Adam or AdamW, whose step makes one more state-sized set at once
/// (`_foreach_sqrt(exp_avg_sqs)`), where the dry run's optimizer makes one parameter's at
/// a time.
pub(crate) fn shard(
    weights: &[Event],
    run: &[Event],
    vars: &[Var],
    fsdp: &Fsdp,
    rank: u32,
    loss_scope: Option<i32>,
    foreach_set: bool,
) -> Result<Sharded> {
    fsdp.validate()?;
    let world = u64::from(fsdp.world);
    let rank = u64::from(rank);
    let names: Vec<&str> = vars.iter().map(|v| v.name.as_str()).collect();
    let found = units(&names, fsdp.units.as_deref())?;
    // Unit 0 is the root.
    let mut unit_of = vec![0usize; vars.len()];
    let mut units: Vec<Unit> = (0..=found.len())
        .map(|_| Unit {
            params: Vec::new(),
            shard: 0,
            gather: 0,
            reduce: 0,
            cast: false,
            recast: false,
        })
        .collect();
    for (i, v) in vars.iter().enumerate() {
        let u = found
            .iter()
            .position(|m| v.name.starts_with(&format!("{m}.")))
            .map_or(0, |p| p + 1);
        unit_of[i] = u;
        if v.sharded() {
            // Every parameter all-gathered; only those that train reduce-scattered.
            let numel = v.padded_shard_numel(world);
            let unit = &mut units[u];
            unit.params.push(i);
            unit.gather += numel * elem_bytes(fsdp.param_kind(v.kind));
            unit.cast |= fsdp.param_kind(v.kind) != v.kind;
            if v.trainable {
                unit.shard += v.padded_shard_bytes(world);
                unit.reduce += numel * elem_bytes(fsdp.reduce_kind(v.kind));
                unit.recast |= fsdp.reduce_kind(v.kind) != v.kind;
            }
        }
    }
    let by_ptr: HashMap<u64, usize> = vars.iter().enumerate().map(|(i, v)| (v.ptr, i)).collect();
    let mut categories: HashMap<u64, ShardedCategory> = HashMap::new();

    // The weights: each parameter its padded shard.
    let weights: Vec<Event> = weights
        .iter()
        .map(|e| match (e.kind, by_ptr.get(&e.ptr)) {
            (EventKind::Alloc { .. }, Some(&i)) if vars[i].sharded() => {
                categories.insert(e.ptr, ShardedCategory::ShardedParameters);
                Event {
                    value: vars[i].padded_shard_bytes(world) as i64,
                    ..*e
                }
            }
            (EventKind::Alloc { .. }, Some(_)) => {
                categories.insert(e.ptr, ShardedCategory::Buffers);
                *e
            }
            _ => *e,
        })
        .collect();

    // Only a parameter (frozen or not) says which unit runs: a buffer or a shared
    // variable read inside a unit does not end it.
    let unit_of_op = |value: i64| -> Option<usize> {
        usize::try_from(value)
            .ok()
            .filter(|&v| vars.get(v).is_some_and(|v| v.sharded()))
            .map(|v| unit_of[v])
    };
    let local_set: u64 = vars
        .iter()
        .filter(|v| v.trainable)
        .map(|v| v.local_shard_bytes(world, rank))
        .sum();
    let mut foreach_temp: Option<u64> = None;
    let opt_var = optimizer_vars(run);
    let grads = surviving_backward_births(run);

    let mut w = Walk {
        out: Vec::with_capacity(run.len() + 64 * units.len()),
        categories,
        next_id: FSDP_ID,
        world,
        fsdp,
        units: &units,
        vars,
        params: vec![Vec::new(); units.len()],
        gathered: vec![None; units.len()],
        grads: vec![Vec::new(); units.len()],
        freed_early: HashSet::new(),
        sharded_grads: Vec::new(),
        rs_input: None,
        last_gather: None,
    };
    let mut phase = Phase::Forward;
    let mut step = 0u32;
    // Forward: the units in the order they ran, the unit running, each op's unit.
    let mut order: Vec<usize> = Vec::new();
    let mut fwd_unit: HashMap<i32, usize> = HashMap::new();
    let mut current: Option<usize> = None;
    let mut bwd: Option<usize> = None;
    // Units reduce-scattered this step.
    let mut reduced: Vec<bool> = vec![false; units.len()];
    // The model's forward pass has returned (its post-forward ran).
    let mut returned = false;
    // The last unit's post-forward, and the root's.
    let model_returned = |w: &mut Walk, current: Option<usize>, e: &Event| {
        if let Some(c) = current.filter(|&c| c != 0) {
            w.post_forward(c, fsdp.reshard_after_forward, e);
        }
        w.free_last_gather(e);
        w.post_forward(0, fsdp.reshard_root, e);
    };
    let run = unique_blocks(run);
    for (i, e) in run.iter().enumerate() {
        match e.kind {
            EventKind::Phase => {
                let next = e.phase;
                if let Some(id) = foreach_temp.take() {
                    w.free(id, e);
                }
                if e.generation > step {
                    // A new step (its gradient shards live until the loop's zero_grad,
                    // where the dry run frees its gradients).
                    step = e.generation;
                    order.clear();
                    fwd_unit.clear();
                    current = None;
                    bwd = None;
                    reduced.iter_mut().for_each(|r| *r = false);
                    returned = false;
                }
                if next == Phase::Backward && phase != Phase::Backward {
                    // Gradients a loop never set to none are reduce-scattered anew.
                    w.free_sharded_grads(e);
                }
                if phase == Phase::Forward && next == Phase::Backward {
                    // The model's post-forward (unless the loss began it), then the
                    // root's pre-backward, which unshards the root and prefetches the
                    // last unit.
                    if !returned {
                        model_returned(&mut w, current, e);
                    }
                    w.unshard(0, e);
                    if let Some(&last) = order.iter().rev().find(|&&u| u != 0) {
                        w.prefetch(last, e);
                    }
                    bwd = Some(0);
                }
                if phase == Phase::Backward && next != Phase::Backward {
                    // The final callback: every unit not yet reduced (the one running
                    // first, the root last), prefetches that found no use dropped.
                    let mut rest: Vec<usize> = bwd.filter(|&b| b != 0).into_iter().collect();
                    rest.extend(order.iter().rev().copied().filter(|&u| u != 0));
                    rest.extend((1..units.len()).filter(|u| !order.contains(u)));
                    rest.push(0);
                    for u in rest {
                        if !reduced[u] {
                            reduced[u] = true;
                            w.post_backward(u, e);
                        }
                    }
                    w.free_rs_input(e);
                    w.free_last_gather(e);
                    w.drop_prefetches(e);
                    bwd = None;
                }
                phase = next;
                w.out.push(*e);
            }
            EventKind::OpBegin
                if e.phase == Phase::Forward
                    && phase == Phase::Forward
                    && loss_scope.is_some_and(|id| e.generation as i64 == i64::from(id) + 1) =>
            {
                // The loss: the model's forward pass has returned.
                if !returned && current.is_some() {
                    model_returned(&mut w, current, e);
                    returned = true;
                }
                w.out.push(*e);
            }
            EventKind::OpBegin if e.phase == Phase::Forward && phase == Phase::Forward => {
                if current.is_none() {
                    // The root's pre-forward, at the step's first op.
                    w.unshard(0, e);
                    order.push(0);
                    current = Some(0);
                }
                let u = unit_of_op(e.value).unwrap_or(current.unwrap_or(0));
                let c = current.unwrap_or(0);
                if u != c {
                    if c != 0 {
                        w.post_forward(c, fsdp.reshard_after_forward, e);
                    }
                    if u != 0 && !order.contains(&u) {
                        order.push(u);
                    }
                    if u != 0 {
                        w.unshard(u, e);
                    }
                    current = Some(u);
                }
                fwd_unit.insert(e.op, u);
                w.out.push(*e);
            }
            // In backward, a node's unit is its forward op's; an op reading a unit's
            // variable (a checkpointed segment's forward pass run again) is the unit's.
            EventKind::Link | EventKind::OpBegin if phase == Phase::Backward => {
                w.out.push(*e);
                let u = if e.kind == EventKind::Link {
                    fwd_unit.get(&e.aux).copied()
                } else {
                    let u = unit_of_op(e.value);
                    fwd_unit.insert(e.op, u.or(bwd).unwrap_or(0));
                    u
                };
                let (Some(u), b) = (u, bwd.unwrap_or(0)) else {
                    continue;
                };
                if u == b {
                    continue;
                }
                if b != 0 && !reduced[b] {
                    reduced[b] = true;
                    w.post_backward(b, e);
                }
                if u != 0 && !reduced[u] {
                    w.unshard(u, e);
                    // Prefetch the unit before it in forward order.
                    if let Some(k) = order.iter().position(|&x| x == u) {
                        if let Some(&prev) = order[..k].iter().rev().find(|&&x| x != 0) {
                            w.prefetch(prev, e);
                        }
                    }
                }
                bwd = Some(u);
            }
            EventKind::Alloc { .. } if grads.contains(&i) => {
                let u = bwd.unwrap_or(0);
                w.grads[u].push(e.ptr);
                w.categories
                    .insert(e.ptr, ShardedCategory::UnshardedGradients);
                w.out.push(*e);
            }
            EventKind::Alloc { .. } if e.phase == Phase::Optimizer => {
                if foreach_set && foreach_temp.is_none() && local_set > 0 {
                    // PyTorch's foreach step: one more state-sized set, for the step.
                    foreach_temp = Some(w.alloc(local_set, 0, ShardedCategory::OptimizerState, e));
                }
                let sized = opt_var.get(&(step, e.op)).map(|&v| &vars[v]).filter(|v| {
                    v.trainable && e.value == v.bytes_in(fsdp.param_kind(v.kind)) as i64
                });
                let value = match sized {
                    Some(v) => v.local_shard_bytes(world, rank) as i64,
                    None => e.value,
                };
                w.categories.insert(e.ptr, ShardedCategory::OptimizerState);
                w.out.push(Event { value, ..*e });
            }
            // The loop's zero_grad: the dry run frees its gradients, FSDP2's shards go.
            EventKind::Free if w.freed_early.remove(&e.ptr) => w.free_sharded_grads(e),
            _ => w.out.push(*e),
        }
    }
    Ok(Sharded {
        weights,
        events: w.out,
        categories: w.categories,
    })
}

/// The walk's state: the events made so far and FSDP2's live buffers.
struct Walk<'a> {
    out: Vec<Event>,
    categories: HashMap<u64, ShardedCategory>,
    next_id: u64,
    world: u64,
    fsdp: &'a Fsdp,
    units: &'a [Unit],
    vars: &'a [Var],
    /// Each unit's unsharded parameters (empty: sharded).
    params: Vec<Vec<u64>>,
    /// Each unit's all-gather output not yet copied out.
    gathered: Vec<Option<u64>>,
    /// Each unit's unsharded gradients (the dry run's blocks).
    grads: Vec<Vec<u64>>,
    /// Gradient blocks freed at their unit's reduce-scatter (the dry run frees them later).
    freed_early: HashSet<u64>,
    /// Reduce-scatter outputs, until zero_grad.
    sharded_grads: Vec<u64>,
    /// The last reduce-scatter input, until the next one.
    rs_input: Option<u64>,
    /// The last all-gather output copied out in forward, until the next unit's copy-out.
    last_gather: Option<u64>,
}

impl Walk<'_> {
    fn alloc(&mut self, bytes: u64, stream: u32, cat: ShardedCategory, at: &Event) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.categories.insert(id, cat);
        self.out.push(Event {
            kind: EventKind::Alloc { stream },
            ptr: id,
            value: bytes as i64,
            aux: 0,
            ..*at
        });
        id
    }

    fn free(&mut self, id: u64, at: &Event) {
        self.out.push(freed(id, at));
    }

    /// The unit's all-gather output, on the all-gather stream (issued, not copied out).
    fn prefetch(&mut self, u: usize, at: &Event) {
        let unit = &self.units[u];
        if unit.params.is_empty() || !self.params[u].is_empty() || self.gathered[u].is_some() {
            return;
        }
        let (gather, cast) = (unit.gather, unit.cast);
        // Mixed precision: the shards copied into one flat input in param_dtype first,
        // freed once copied into the output.
        let input =
            cast.then(|| self.alloc(gather, ALL_GATHER_STREAM, ShardedCategory::AllGather, at));
        let id = self.alloc(
            self.world * gather,
            ALL_GATHER_STREAM,
            ShardedCategory::AllGather,
            at,
        );
        if let Some(input) = input {
            self.free(input, at);
        }
        self.gathered[u] = Some(id);
    }

    /// The unit's parameters unsharded: all-gathered (unless prefetched), the previous
    /// forward all-gather output freed, each parameter made, its all-gather output
    /// freed in backward or held until the next unit's in forward.
    fn unshard(&mut self, u: usize, at: &Event) {
        if self.units[u].params.is_empty() || !self.params[u].is_empty() {
            return;
        }
        self.prefetch(u, at);
        if at.phase == Phase::Forward {
            self.free_last_gather(at);
        }
        let params: Vec<u64> = self.units[u]
            .params
            .clone()
            .into_iter()
            .map(|p| {
                let v = &self.vars[p];
                let bytes = v.unsharded_bytes_in(self.world, self.fsdp.param_kind(v.kind));
                self.alloc(bytes, 0, ShardedCategory::UnshardedParameters, at)
            })
            .collect();
        self.params[u] = params;
        let gathered = self.gathered[u].take();
        if at.phase == Phase::Forward {
            self.last_gather = gathered;
        } else if let Some(g) = gathered {
            self.free(g, at);
        }
    }

    /// All-gather outputs prefetched and never copied out.
    fn drop_prefetches(&mut self, at: &Event) {
        for u in 0..self.gathered.len() {
            if let Some(g) = self.gathered[u].take() {
                self.free(g, at);
            }
        }
    }

    fn free_last_gather(&mut self, at: &Event) {
        if let Some(g) = self.last_gather.take() {
            self.free(g, at);
        }
    }

    fn reshard(&mut self, u: usize, at: &Event) {
        for id in std::mem::take(&mut self.params[u]) {
            self.free(id, at);
        }
    }

    fn post_forward(&mut self, u: usize, reshard: bool, at: &Event) {
        if reshard {
            self.reshard(u, at);
        }
    }

    /// The unit's backward ended: parameters freed, its gradients reduce-scattered.
    fn post_backward(&mut self, u: usize, at: &Event) {
        self.reshard(u, at);
        if let Some(g) = self.gathered[u].take() {
            self.free(g, at);
        }
        let unit = &self.units[u];
        let (shard, reduce, recast) = (unit.shard, unit.reduce, unit.recast);
        if shard == 0 {
            return;
        }
        self.free_rs_input(at);
        let input = self.alloc(self.world * reduce, 0, ShardedCategory::ReduceScatter, at);
        self.rs_input = Some(input);
        for g in std::mem::take(&mut self.grads[u]) {
            self.free(g, at);
            self.freed_early.insert(g);
        }
        let mut output = self.alloc(
            reduce,
            REDUCE_SCATTER_STREAM,
            ShardedCategory::ShardedGradients,
            at,
        );
        if recast {
            // Reduced in another dtype than the parameters': cast to theirs.
            let cast = self.alloc(
                shard,
                REDUCE_SCATTER_STREAM,
                ShardedCategory::ShardedGradients,
                at,
            );
            self.free(output, at);
            output = cast;
        }
        self.sharded_grads.push(output);
    }

    fn free_rs_input(&mut self, at: &Event) {
        if let Some(id) = self.rs_input.take() {
            self.free(id, at);
        }
    }

    fn free_sharded_grads(&mut self, at: &Event) {
        for id in std::mem::take(&mut self.sharded_grads) {
            self.free(id, at);
        }
    }
}

/// The block `id` freed where `at` happens.
pub(super) fn freed(id: u64, at: &Event) -> Event {
    Event {
        kind: EventKind::Free,
        ptr: id,
        value: 0,
        aux: 0,
        ..*at
    }
}

/// The run with each block a name of its own (the dry run's addresses are reused), so
/// that a block's category holds for its life alone; frees and reads follow.
pub(super) fn unique_blocks(run: &[Event]) -> Vec<Event> {
    let mut renamed: HashMap<u64, u64> = HashMap::new();
    let mut next_name = RENAMED_ID;
    run.iter()
        .map(|e| {
            let mut e = *e;
            match e.kind {
                EventKind::Alloc { .. } => {
                    next_name += 1;
                    renamed.insert(e.ptr, next_name);
                    e.ptr = next_name;
                }
                EventKind::Free => {
                    if let Some(id) = renamed.remove(&e.ptr) {
                        e.ptr = id;
                    }
                }
                EventKind::Read => {
                    if let Some(&id) = renamed.get(&e.ptr) {
                        e.ptr = id;
                    }
                }
                _ => {}
            }
            e
        })
        .collect()
}

/// Each optimizer op's variable (by step and op): its own first variable, else the
/// variable the next op updates (optimizers make a parameter's state, then update it).
fn optimizer_vars(run: &[Event]) -> HashMap<(u32, i32), usize> {
    // An op's `generation` is its scope: the step is the last phase event's.
    let mut ops: Vec<(u32, i32, i64)> = Vec::new();
    let mut step = 0;
    for e in run {
        match e.kind {
            EventKind::Phase => step = e.generation,
            EventKind::OpBegin if e.phase == Phase::Optimizer => ops.push((step, e.op, e.value)),
            _ => {}
        }
    }
    let mut out = HashMap::new();
    let mut upcoming: Option<(u32, usize)> = None;
    for &(step, op, var) in ops.iter().rev() {
        if upcoming.is_some_and(|(s, _)| s != step) {
            upcoming = None;
        }
        if let Ok(v) = usize::try_from(var) {
            upcoming = Some((step, v));
        }
        if let Some((_, v)) = upcoming {
            out.insert((step, op), v);
        }
    }
    out
}

/// The events (by index) of blocks born in backward and alive when it ends: the
/// gradients autograd accumulates into the parameters.
pub(super) fn surviving_backward_births(run: &[Event]) -> HashSet<usize> {
    let mut out = HashSet::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut phase = Phase::Forward;
    for (i, e) in run.iter().enumerate() {
        match e.kind {
            EventKind::Phase => {
                if phase == Phase::Backward && e.phase != Phase::Backward {
                    out.extend(live.drain().map(|(_, i)| i));
                }
                phase = e.phase;
            }
            EventKind::Alloc { .. } if phase == Phase::Backward => {
                live.insert(e.ptr, i);
            }
            EventKind::Free => {
                live.remove(&e.ptr);
            }
            _ => {}
        }
    }
    out
}
