//! Replays one iteration's step log into a [`StepProfile`], in named passes:
//!
//! 1. [`collect_ops`]: every timeline op's name, phase, first variable, scope and the
//!    forward op of a backward node;
//! 2. [`classify_blocks`]: the category of every block born in the iteration, from what
//!    became of it (freed in its phase: TEMP; forward blocks alive at a backward start:
//!    ACT; backward blocks that outlive it: GRAD; optimizer blocks that outlive it: OPT);
//! 3. [`attribute_layers`]: the layer of every op;
//! 4. [`live_by_category`]: live bytes by category after every op, the peak and each
//!    category's maximum;
//! 5. [`layer_table`] and [`count_flops`]: per-layer parameters, activations, FLOPs;
//! 6. [`idle::idle_at_peak`] (with the step detail on): the blocks idle at the peak,
//!    and [`idle::idle_by_row`]: their bytes past their last read after every op.
//!
//! Nothing here runs while the model does.

use std::collections::{HashMap, HashSet};

use crate::events::{Event, EventKind};
use crate::names::{Names, MISSING};
use crate::phase::Phase;

use crate::timeline::{
    Category, CategoryBytes, LayerProfile, Peak, StepProfile, StepRow, StepStart, UncountedOp,
    VarEntry, CATEGORIES,
};

/// What one timeline op is.
#[derive(Debug, Clone)]
struct OpRec {
    name: i32,
    phase: Option<Phase>,
    var: i32,
    scope: i32,
    /// Run by TorchScript: the module's path name id (-1: the root module's own op).
    module: Option<i32>,
    link: i32,
}

impl Default for OpRec {
    fn default() -> Self {
        OpRec {
            name: -1,
            phase: None,
            var: -1,
            scope: -1,
            module: None,
            link: -1,
        }
    }
}

/// Whom an alloc or free event belongs to.
#[derive(Debug, Clone, Copy)]
enum Owner {
    None,
    Born(u32),
    Initial(Category),
}

#[derive(Debug, Clone)]
struct Born {
    bytes: i64,
    phase: Phase,
    op: i32,
    cat: Option<Category>,
    /// Taken by the device for itself (never a tensor's, never idle).
    device_owned: bool,
}

/// Pass 2's result.
struct Births {
    born: Vec<Born>,
    owner: Vec<Owner>,
    /// Activation bytes by forward op, one map per backward pass.
    act_passes: Vec<HashMap<i32, i64>>,
}

/// Whether generation `generation` is at or after `start` (32-bit wrap-aware).
fn in_step(generation: u32, start: u32) -> bool {
    (generation.wrapping_sub(start) as i32) >= 0
}

/// Replays one iteration's step log into a profile; with `site_name` (the step detail
/// was on), the blocks idle at its peak too, their sites named by it.
pub(crate) fn replay(
    events: &[Event],
    overflow: bool,
    start: &StepStart,
    slot: u8,
    vars: &[VarEntry],
    names: &mut Names,
    site_name: Option<&mut dyn FnMut(i32) -> String>,
) -> StepProfile {
    let mut consistent = !overflow;
    let ops = collect_ops(events);
    let births = classify_blocks(events, start, slot, &mut consistent);
    let op_layer = attribute_layers(&ops, vars, names);
    let (mut rows, row_at, peak, category_max, peak_at) = live_by_category(
        events,
        &births,
        start,
        slot,
        &ops,
        &op_layer,
        names,
        &mut consistent,
    );
    let mut layers = layer_table(&ops, &op_layer, vars, &births.act_passes);
    let (forward_flops, backward_flops, optimizer_flops, uncounted_ops) =
        count_flops(events, &ops, &op_layer, &mut layers, names);
    let idle = site_name.map(|site_name| {
        idle::idle_at_peak(
            events, &births, start.live, slot, &ops, &op_layer, names, peak_at, site_name,
        )
    });
    if let Some(idle) = &idle {
        for (row, bytes) in rows
            .iter_mut()
            .zip(idle::idle_by_row(&row_at, &idle.replay.drops))
        {
            row.idle_bytes = bytes;
        }
    }
    StepProfile {
        start_bytes: start.live.max(0) as u64,
        rows,
        peak,
        category_max,
        layers: layers.into_layers(),
        forward_flops,
        backward_flops,
        optimizer_flops,
        uncounted_ops,
        complete: consistent,
        ops_recorded: true,
        idle,
        ..StepProfile::default()
    }
}

/// Pass 1: the timeline ops, indexed by their number in the step.
fn collect_ops(events: &[Event]) -> Vec<OpRec> {
    let n_ops = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::OpBegin | EventKind::OpEnd) && e.op >= 0)
        .map(|e| e.op as usize + 1)
        .max()
        .unwrap_or(0);
    let mut ops = vec![OpRec::default(); n_ops];
    for e in events {
        if e.op < 0 || e.op as usize >= n_ops {
            continue;
        }
        let o = &mut ops[e.op as usize];
        match e.kind {
            EventKind::OpBegin => {
                o.name = e.aux;
                o.var = e.value as i32;
                o.scope = e.generation as i32 - 1;
                o.module = (e.ptr > 0).then(|| (e.ptr as i64 - 2) as i32);
                o.phase.get_or_insert(e.phase);
            }
            EventKind::OpEnd => {
                if o.name < 0 {
                    o.name = e.aux;
                }
                o.phase = Some(e.phase);
            }
            EventKind::Link if o.link < 0 && e.aux >= 0 && e.aux < e.op => o.link = e.aux,
            _ => {}
        }
    }
    ops
}

/// Pass 2: the category of every block born in the iteration, and the owner of every
/// alloc/free event of the profiled device.
fn classify_blocks(events: &[Event], start: &StepStart, slot: u8, consistent: &mut bool) -> Births {
    let mut born: Vec<Born> = Vec::new();
    let mut live_born: HashMap<u64, u32> = HashMap::new();
    let mut owner: Vec<Owner> = vec![Owner::None; events.len()];
    let mut act_passes: Vec<HashMap<i32, i64>> = Vec::new();
    let mut phase = Phase::Forward;
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc { .. } if e.device == slot => {
                let id = born.len() as u32;
                let device_owned = start.device_owned.contains(&e.ptr);
                born.push(Born {
                    bytes: e.value,
                    phase: e.phase,
                    op: e.op,
                    cat: device_owned.then_some(Category::Workspace),
                    device_owned,
                });
                live_born.insert(e.ptr, id);
                owner[i] = Owner::Born(id);
            }
            EventKind::Free if e.device == slot => {
                if in_step(e.generation, start.generation) {
                    match live_born.remove(&e.ptr) {
                        Some(id) => {
                            born[id as usize].cat.get_or_insert(Category::Temp);
                            owner[i] = Owner::Born(id);
                        }
                        None => *consistent = false,
                    }
                } else {
                    owner[i] = Owner::Initial(initial_category(start, e));
                }
            }
            EventKind::Phase => {
                let next = e.phase;
                let mut act = HashMap::new();
                for &id in live_born.values() {
                    let b = &mut born[id as usize];
                    if b.cat.is_some() {
                        continue;
                    }
                    if next == Phase::Backward && b.phase == Phase::Forward {
                        b.cat = Some(Category::Act);
                        *act.entry(b.op).or_insert(0) += b.bytes;
                    } else if phase == Phase::Backward && b.phase == Phase::Backward {
                        b.cat = Some(Category::Grad);
                    } else if phase == Phase::Optimizer && b.phase == Phase::Optimizer {
                        b.cat = Some(Category::Opt);
                    }
                }
                if next == Phase::Backward {
                    act_passes.push(act);
                }
                phase = next;
            }
            _ => {}
        }
    }
    // Blocks still alive at the end: what their birth phase makes them.
    for &id in live_born.values() {
        let b = &mut born[id as usize];
        b.cat.get_or_insert(match b.phase {
            Phase::Backward => Category::Grad,
            Phase::Optimizer => Category::Opt,
            Phase::Forward => Category::Other,
        });
    }
    Births {
        born,
        owner,
        act_passes,
    }
}

/// The category of a block alive when the iteration began, freed during it.
fn initial_category(start: &StepStart, e: &Event) -> Category {
    if start.workspace.contains_key(&e.ptr) {
        Category::Workspace
    } else if start.param.contains_key(&e.ptr) {
        Category::Param
    } else if start.buffer.contains_key(&e.ptr) {
        Category::Buffer
    } else if start.grad.contains_key(&e.ptr) {
        Category::Grad
    } else if e.phase == Phase::Optimizer {
        Category::Opt
    } else {
        Category::Other
    }
}

/// Pass 3: the layer of every op, in the order ops began: a scope's name; a backward
/// node's forward op's layer; in TorchScript, the module running it ([`MISSING`] for the
/// root module's own ops); the layer of the first variable the op reads; else the
/// layer that ran last. Optimizers update each parameter's state, then the parameter:
/// an optimizer op that reads no variable belongs to the variable updated next.
fn attribute_layers(ops: &[OpRec], vars: &[VarEntry], names: &mut Names) -> Vec<String> {
    let mut next_var = vec![-1i32; ops.len()];
    let mut upcoming = -1;
    for (i, o) in ops.iter().enumerate().rev() {
        if o.phase != Some(Phase::Optimizer) {
            upcoming = -1;
            continue;
        }
        if o.var >= 0 {
            upcoming = o.var;
        }
        next_var[i] = upcoming;
    }
    let modules = module_paths(vars);
    let mut module_layer: HashMap<i32, String> = HashMap::new();
    let mut op_layer: Vec<String> = Vec::with_capacity(ops.len());
    let mut last = MISSING.to_string();
    for (i, o) in ops.iter().enumerate() {
        let var = if o.var >= 0 { o.var } else { next_var[i] };
        let layer = if o.scope >= 0 {
            names.get(o.scope)
        } else if o.link >= 0 {
            op_layer[o.link as usize].clone()
        } else if let Some(module) = o.module {
            module_layer
                .entry(module)
                .or_insert_with(|| match names.get(module) {
                    m if m == MISSING => m,
                    m => module_path(&m, &modules),
                })
                .clone()
        } else if var >= 0 && (var as usize) < vars.len() {
            vars[var as usize].layer.clone()
        } else {
            last.clone()
        };
        last = layer.clone();
        op_layer.push(layer);
    }
    op_layer
}

/// Every module path that holds variables, and the paths above them.
fn module_paths(vars: &[VarEntry]) -> HashSet<String> {
    let mut paths = HashSet::new();
    for v in vars {
        if v.layer == MISSING {
            continue;
        }
        let mut end = v.layer.len();
        loop {
            paths.insert(v.layer[..end].to_string());
            match v.layer[..end].rfind('.') {
                Some(i) => end = i,
                None => break,
            }
        }
    }
    paths
}

/// The module path of the TorchScript interpreter's `path`, as `named_modules()` writes
/// it. The interpreter names each module it calls by the attribute it was called through,
/// so a container that is never called itself (a `ModuleList`, a `ModuleDict`) is
/// missing: `encoder.0.attention` is `encoder.layer.0.attention`. Such a level is found
/// back from the modules that hold variables (`modules`) when exactly one of them fits;
/// otherwise the interpreter's name is kept.
fn module_path(path: &str, modules: &HashSet<String>) -> String {
    let mut cur = String::new();
    for c in path.split('.') {
        let prefix = if cur.is_empty() {
            String::new()
        } else {
            format!("{cur}.")
        };
        let direct = format!("{prefix}{c}");
        if modules.contains(&direct) {
            cur = direct;
            continue;
        }
        let mut skipped = modules.iter().filter(|m| {
            m.strip_prefix(prefix.as_str())
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(_, tail)| tail == c)
        });
        cur = match (skipped.next(), skipped.next()) {
            (Some(m), None) => m.clone(),
            _ => direct,
        };
    }
    cur
}

fn layer_at(op_layer: &[String], op: i32) -> String {
    if op >= 0 && (op as usize) < op_layer.len() {
        op_layer[op as usize].clone()
    } else {
        MISSING.to_string()
    }
}

fn phase_at(ops: &[OpRec], op: i32) -> Option<Phase> {
    if op >= 0 && (op as usize) < ops.len() {
        ops[op as usize].phase
    } else {
        None
    }
}

/// Pass 4: live bytes by category after every op (and the index of each row's op-end
/// event); the peak; category maxima; the index of the event that reached the peak
/// (`None`: the step's start).
#[allow(clippy::too_many_arguments)]
fn live_by_category(
    events: &[Event],
    births: &Births,
    start: &StepStart,
    slot: u8,
    ops: &[OpRec],
    op_layer: &[String],
    names: &mut Names,
    consistent: &mut bool,
) -> (Vec<StepRow>, Vec<usize>, Peak, CategoryBytes, Option<usize>) {
    let mut cur = [0i64; CATEGORIES];
    for (map, c) in [
        (&start.param, Category::Param),
        (&start.buffer, Category::Buffer),
        (&start.grad, Category::Grad),
        (&start.workspace, Category::Workspace),
    ] {
        cur[c.index()] = map.values().sum();
    }
    cur[Category::Opt.index()] = start.opt;
    let claimed: i64 = cur.iter().sum();
    cur[Category::Other.index()] = start.live - claimed;
    if cur[Category::Other.index()] < 0 {
        *consistent = false;
    }
    let mut total: i64 = start.live;
    let mut peak = Peak {
        bytes: total.max(0) as u64,
        breakdown: CategoryBytes::from_signed(&cur),
        ..Peak::default()
    };
    let mut peak_op: Option<i32> = None;
    let mut peak_at: Option<usize> = None;
    let mut category_max = CategoryBytes::from_signed(&cur);
    let mut rows = Vec::with_capacity(ops.len());
    let mut row_at = Vec::with_capacity(ops.len());
    // The highest live bytes since the last row.
    let mut since_row: i64 = total;
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc { .. } | EventKind::Free if e.device == slot => {
                let cat = match births.owner[i] {
                    Owner::Born(id) => births.born[id as usize].cat.unwrap_or(Category::Other),
                    Owner::Initial(c) => c,
                    Owner::None => continue,
                };
                cur[cat.index()] += e.value;
                total += e.value;
                since_row = since_row.max(total);
                if e.value > 0 {
                    let now = CategoryBytes::from_signed(&cur);
                    category_max.max_with(&now);
                    if total > peak.bytes as i64 {
                        peak.bytes = total as u64;
                        peak.breakdown = now;
                        peak_op = Some(e.op);
                        peak_at = Some(i);
                    }
                }
            }
            EventKind::OpEnd if e.op >= 0 && (e.op as usize) < ops.len() => {
                rows.push(StepRow {
                    op_index: e.op as u32,
                    op: names.get(ops[e.op as usize].name),
                    phase: e.phase,
                    layer: layer_at(op_layer, e.op),
                    bytes: CategoryBytes::from_signed(&cur),
                    allocated_bytes: e.value.max(0) as u64,
                    peak_bytes: since_row.max(0) as u64,
                    idle_bytes: 0,
                });
                row_at.push(i);
                since_row = total;
            }
            _ => {}
        }
    }
    if let Some(op) = peak_op {
        if op >= 0 && (op as usize) < ops.len() {
            peak.op_index = Some(op as u32);
            peak.op = names.get(ops[op as usize].name);
            peak.phase = phase_at(ops, op);
            peak.layer = layer_at(op_layer, op);
        }
    }
    (rows, row_at, peak, category_max, peak_at)
}

/// Layers in the order they first ran, looked up by name.
#[derive(Default)]
struct LayerTable {
    layers: Vec<LayerProfile>,
    index: HashMap<String, usize>,
}

impl LayerTable {
    fn entry(&mut self, name: &str) -> &mut LayerProfile {
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => {
                self.layers.push(LayerProfile {
                    layer: name.to_string(),
                    ..LayerProfile::default()
                });
                self.index.insert(name.to_string(), self.layers.len() - 1);
                self.layers.len() - 1
            }
        };
        &mut self.layers[i]
    }

    fn into_layers(self) -> Vec<LayerProfile> {
        self.layers
    }
}

/// Pass 5a: layers with their parameters and activations (the largest over the
/// iteration's backward passes).
fn layer_table(
    ops: &[OpRec],
    op_layer: &[String],
    vars: &[VarEntry],
    act_passes: &[HashMap<i32, i64>],
) -> LayerTable {
    let mut t = LayerTable::default();
    for (op, layer) in op_layer.iter().enumerate() {
        if ops[op].phase == Some(Phase::Forward) {
            t.entry(layer);
        }
    }
    for v in vars {
        t.entry(&v.layer).parameters_bytes += v.bytes;
    }
    for pass in act_passes {
        let mut per_layer: HashMap<String, i64> = HashMap::new();
        for (&op, &bytes) in pass {
            *per_layer.entry(layer_at(op_layer, op)).or_insert(0) += bytes;
        }
        for (layer, bytes) in per_layer {
            let l = t.entry(&layer);
            l.activation_bytes = l.activation_bytes.max(bytes.max(0) as u64);
        }
    }
    t
}

/// Pass 5b: FLOPs by phase and layer, and the ops without a FLOP formula.
fn count_flops(
    events: &[Event],
    ops: &[OpRec],
    op_layer: &[String],
    layers: &mut LayerTable,
    names: &mut Names,
) -> (u64, u64, u64, Vec<UncountedOp>) {
    let (mut fwd, mut bwd, mut opt) = (0u64, 0u64, 0u64);
    let mut uncounted: HashMap<i32, u64> = HashMap::new();
    for e in events {
        match e.kind {
            EventKind::Flops => {
                let flops = e.value.max(0) as u64;
                match phase_at(ops, e.op).unwrap_or(e.phase) {
                    Phase::Forward => {
                        fwd += flops;
                        layers.entry(&layer_at(op_layer, e.op)).forward_flops += flops;
                    }
                    Phase::Backward => {
                        bwd += flops;
                        layers.entry(&layer_at(op_layer, e.op)).backward_flops += flops;
                    }
                    Phase::Optimizer => opt += flops,
                }
            }
            EventKind::Uncounted => *uncounted.entry(e.aux).or_insert(0) += 1,
            _ => {}
        }
    }
    let mut uncounted_ops: Vec<UncountedOp> = uncounted
        .into_iter()
        .map(|(id, calls)| UncountedOp {
            op: names.get(id),
            calls,
        })
        .collect();
    uncounted_ops.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.op.cmp(&b.op)));
    (fwd, bwd, opt, uncounted_ops)
}

mod idle;
#[cfg(test)]
mod tests;
