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
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ffi::{self, ev, TlEvent};

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
}

impl Category {
    /// All categories, in the order of CSV columns and of the plot's stack (bottom up).
    pub const ALL: [Category; 7] = [
        Category::Param,
        Category::Buffer,
        Category::Opt,
        Category::Grad,
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
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Bytes per category at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CategoryBytes([u64; 7]);

impl CategoryBytes {
    /// Bytes of one category.
    pub fn get(&self, c: Category) -> u64 {
        self.0[c.index()]
    }

    /// Sum over all categories.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    fn from_signed(v: &[i64; 7]) -> Self {
        let mut out = [0u64; 7];
        for (o, x) in out.iter_mut().zip(v) {
            *o = (*x).max(0) as u64;
        }
        CategoryBytes(out)
    }

    fn max_with(&mut self, other: &CategoryBytes) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a = (*a).max(b);
        }
    }
}

/// Phase of an op, found without user calls (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Phase {
    /// From the iteration's first op to the first autograd node.
    #[serde(rename = "forward")]
    Forward,
    /// Autograd nodes, until control returns to user code.
    #[serde(rename = "backward")]
    Backward,
    /// After backward, until the next forward op or `record_stats`.
    #[serde(rename = "optimizer")]
    Optimizer,
}

impl Phase {
    pub(crate) fn from_native(p: u8) -> Phase {
        match p {
            1 => Phase::Backward,
            2 => Phase::Optimizer,
            _ => Phase::Forward,
        }
    }

    /// Lower-case name, as in the CSV.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}

/// Live bytes after one op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineRow {
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
}

/// The highest live bytes of the iteration, at allocation granularity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peak {
    /// Live bytes at the peak.
    pub bytes: u64,
    /// Their split by category.
    pub breakdown: CategoryBytes,
    /// The op during which the peak was reached (`None`: before the first op).
    pub op_index: Option<u32>,
    /// Its name.
    pub op: String,
    /// Its phase.
    pub phase: Option<Phase>,
    /// Its layer.
    pub layer: String,
}

impl Peak {
    /// Where the peak was reached: `aten::div (optimizer, l1)`.
    pub fn location(&self) -> String {
        let op = if self.op.is_empty() {
            "the iteration start"
        } else {
            &self.op
        };
        let layer = if self.layer.is_empty() {
            "-"
        } else {
            &self.layer
        };
        format!("{op} ({}, {layer})", self.phase.map_or("-", |ph| ph.name()))
    }
}

/// Memory and FLOPs of one layer in the profiled iteration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LayerProfile {
    /// Layer name: a VarStore path without its last component (`layer1.0.conv1`), a
    /// scope name, or `(none)` for ops before any layer.
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
/// it; any other op belongs to the layer that ran last. Ops inside a [`scope`] belong
/// to the scope.
#[derive(Debug, Clone, Default)]
pub struct StepProfile {
    /// Step number (1-based `record_stats` count) of the iteration.
    pub step: u64,
    /// Epoch of the iteration.
    pub epoch: usize,
    /// Iteration within the epoch.
    pub iteration: usize,
    /// Device profiled (`cpu`, `cuda:0`).
    pub device: String,
    /// Live bytes when the iteration began.
    pub start_bytes: u64,
    /// One row per op, in the order ops returned.
    pub rows: Vec<TimelineRow>,
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
    pub gen: u32,
    pub live: i64,
    pub param: HashMap<u64, i64>,
    pub buffer: HashMap<u64, i64>,
    pub grad: HashMap<u64, i64>,
    pub opt: i64,
}

/// The layer of a variable path: everything before the last `.`.
pub(crate) fn layer_of(path: &str) -> String {
    match path.rfind('.') {
        Some(i) => path[..i].to_string(),
        None => "(root)".to_string(),
    }
}

const NONE_LAYER: &str = "(none)";

#[derive(Debug, Clone, Copy)]
enum Owner {
    None,
    Born(u32),
    Initial(Category),
}

#[derive(Debug, Clone)]
struct Born {
    bytes: i64,
    phase: u8,
    op: i32,
    cat: Option<Category>,
}

#[derive(Debug, Clone, Default)]
struct OpRec {
    name: i32,
    phase: Option<u8>,
    var: i32,
    scope: i32,
    link: i32,
    begun: bool,
}

/// Names of interned ids, looked up once each.
#[derive(Default)]
pub(crate) struct Names(HashMap<i32, String>);

impl Names {
    pub(crate) fn get(&mut self, id: i32) -> String {
        self.0
            .entry(id)
            .or_insert_with(|| ffi::name(id).unwrap_or_else(|| "?".into()))
            .clone()
    }

    /// The op named by a block's origin: `(no op)` for -1 (born outside any op).
    pub(crate) fn op(&mut self, id: i32) -> String {
        if id < 0 {
            "(no op)".into()
        } else {
            self.get(id)
        }
    }

    /// The layer named by a block's origin: `(none)` for -1 (unknown).
    pub(crate) fn layer(&mut self, id: i32) -> String {
        if id < 0 {
            NONE_LAYER.into()
        } else {
            self.get(id)
        }
    }
}

/// Whether generation `gen` is at or after `start` (32-bit wrap-aware).
fn in_step(gen: u32, start: u32) -> bool {
    (gen.wrapping_sub(start) as i32) >= 0
}

/// Replays one iteration's step log into a profile.
pub(crate) fn replay(
    events: &[TlEvent],
    overflow: bool,
    start: &StepStart,
    slot: u8,
    vars: &[VarEntry],
    names: &mut Names,
) -> StepProfile {
    // Ops.
    let n_ops = events
        .iter()
        .filter(|e| matches!(e.kind, ev::OP_BEGIN | ev::OP_END) && e.op >= 0)
        .map(|e| e.op as usize + 1)
        .max()
        .unwrap_or(0);
    let mut ops = vec![
        OpRec {
            name: -1,
            var: -1,
            scope: -1,
            link: -1,
            ..OpRec::default()
        };
        n_ops
    ];
    for e in events {
        if e.op < 0 || e.op as usize >= n_ops {
            continue;
        }
        let o = &mut ops[e.op as usize];
        match e.kind {
            ev::OP_BEGIN => {
                o.name = e.aux;
                o.var = e.value as i32;
                o.scope = e.gen as i32 - 1;
                o.phase.get_or_insert(e.phase);
                o.begun = true;
            }
            ev::OP_END => {
                if o.name < 0 {
                    o.name = e.aux;
                }
                o.phase = Some(e.phase);
            }
            ev::LINK if o.link < 0 && e.aux >= 0 && e.aux < e.op => o.link = e.aux,
            _ => {}
        }
    }

    // Pass 1: decide the category of every block born in the iteration.
    let mut born: Vec<Born> = Vec::new();
    let mut live_born: HashMap<u64, u32> = HashMap::new();
    let mut owner: Vec<Owner> = vec![Owner::None; events.len()];
    let mut act_passes: Vec<HashMap<i32, i64>> = Vec::new();
    let mut phase: u8 = 0;
    let mut consistent = !overflow;
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            ev::ALLOC if e.device == slot => {
                let id = born.len() as u32;
                born.push(Born {
                    bytes: e.value,
                    phase: e.phase,
                    op: e.op,
                    cat: None,
                });
                live_born.insert(e.ptr, id);
                owner[i] = Owner::Born(id);
            }
            ev::FREE if e.device == slot => {
                if in_step(e.gen, start.gen) {
                    match live_born.remove(&e.ptr) {
                        Some(id) => {
                            let b = &mut born[id as usize];
                            b.cat.get_or_insert(Category::Temp);
                            owner[i] = Owner::Born(id);
                        }
                        None => consistent = false,
                    }
                } else {
                    let cat = if start.param.contains_key(&e.ptr) {
                        Category::Param
                    } else if start.buffer.contains_key(&e.ptr) {
                        Category::Buffer
                    } else if start.grad.contains_key(&e.ptr) {
                        Category::Grad
                    } else if e.phase == 2 {
                        Category::Opt
                    } else {
                        Category::Other
                    };
                    owner[i] = Owner::Initial(cat);
                }
            }
            ev::PHASE => {
                let next = e.phase;
                let mut act = HashMap::new();
                for &id in live_born.values() {
                    let b = &mut born[id as usize];
                    if b.cat.is_some() {
                        continue;
                    }
                    if next == 1 && b.phase == 0 {
                        b.cat = Some(Category::Act);
                        *act.entry(b.op).or_insert(0) += b.bytes;
                    } else if phase == 1 && b.phase == 1 {
                        b.cat = Some(Category::Grad);
                    } else if phase == 2 && b.phase == 2 {
                        b.cat = Some(Category::Opt);
                    }
                }
                if next == 1 {
                    act_passes.push(act);
                }
                phase = next;
            }
            _ => {}
        }
    }
    for &id in live_born.values() {
        let b = &mut born[id as usize];
        if b.cat.is_none() {
            b.cat = Some(match b.phase {
                1 => Category::Grad,
                2 => Category::Opt,
                _ => Category::Other,
            });
        }
    }

    // Optimizers update each parameter's state, then the parameter: an optimizer op
    // that reads no variable belongs to the variable updated next.
    let mut next_var = vec![-1i32; n_ops];
    let mut upcoming = -1;
    for (i, o) in ops.iter().enumerate().rev() {
        if o.phase != Some(2) {
            upcoming = -1;
            continue;
        }
        if o.var >= 0 {
            upcoming = o.var;
        }
        next_var[i] = upcoming;
    }

    // Layers of ops, in the order they began.
    let mut op_layer: Vec<String> = Vec::with_capacity(n_ops);
    let mut last = NONE_LAYER.to_string();
    for (i, o) in ops.iter().enumerate() {
        let var = if o.var >= 0 { o.var } else { next_var[i] };
        let layer = if o.scope >= 0 {
            names.get(o.scope)
        } else if o.link >= 0 {
            op_layer[o.link as usize].clone()
        } else if var >= 0 && (var as usize) < vars.len() {
            vars[var as usize].layer.clone()
        } else {
            last.clone()
        };
        last = layer.clone();
        op_layer.push(layer);
    }
    let layer_at = |op: i32| -> String {
        if op >= 0 && (op as usize) < op_layer.len() {
            op_layer[op as usize].clone()
        } else {
            NONE_LAYER.to_string()
        }
    };
    let phase_at = |op: i32| -> Option<Phase> {
        if op >= 0 && (op as usize) < ops.len() {
            ops[op as usize].phase.map(Phase::from_native)
        } else {
            None
        }
    };

    // Pass 2: live bytes by category after every op; the peak; category maxima.
    let mut cur = [0i64; 7];
    for (map, c) in [
        (&start.param, Category::Param),
        (&start.buffer, Category::Buffer),
        (&start.grad, Category::Grad),
    ] {
        cur[c.index()] = map.values().sum();
    }
    cur[Category::Opt.index()] = start.opt;
    let claimed: i64 = cur.iter().sum();
    cur[Category::Other.index()] = start.live - claimed;
    if cur[Category::Other.index()] < 0 {
        consistent = false;
    }
    let mut total: i64 = start.live;
    let mut peak = Peak {
        bytes: total.max(0) as u64,
        breakdown: CategoryBytes::from_signed(&cur),
        ..Peak::default()
    };
    let mut peak_op: Option<i32> = None;
    let mut category_max = CategoryBytes::from_signed(&cur);
    let mut rows = Vec::with_capacity(n_ops);
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            ev::ALLOC | ev::FREE if e.device == slot => {
                let cat = match owner[i] {
                    Owner::Born(id) => born[id as usize].cat.unwrap_or(Category::Other),
                    Owner::Initial(c) => c,
                    Owner::None => continue,
                };
                cur[cat.index()] += e.value;
                total += e.value;
                if e.value > 0 {
                    let now = CategoryBytes::from_signed(&cur);
                    category_max.max_with(&now);
                    if total > peak.bytes as i64 {
                        peak.bytes = total as u64;
                        peak.breakdown = now;
                        peak_op = Some(e.op);
                    }
                }
            }
            ev::OP_END if e.op >= 0 => {
                let o = &ops[e.op as usize];
                rows.push(TimelineRow {
                    op_index: e.op as u32,
                    op: names.get(o.name),
                    phase: Phase::from_native(e.phase),
                    layer: layer_at(e.op),
                    bytes: CategoryBytes::from_signed(&cur),
                    allocated_bytes: e.value.max(0) as u64,
                });
            }
            _ => {}
        }
    }
    if let Some(op) = peak_op {
        if op >= 0 && (op as usize) < ops.len() {
            peak.op_index = Some(op as u32);
            peak.op = names.get(ops[op as usize].name);
            peak.phase = phase_at(op);
            peak.layer = layer_at(op);
        }
    }

    // Layers: parameters, activations, FLOPs.
    let mut layers: Vec<LayerProfile> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut layer_mut = |name: &str, layers: &mut Vec<LayerProfile>| -> usize {
        *index.entry(name.to_string()).or_insert_with(|| {
            layers.push(LayerProfile {
                layer: name.to_string(),
                ..LayerProfile::default()
            });
            layers.len() - 1
        })
    };
    for (op, layer) in op_layer.iter().enumerate() {
        if ops[op].phase.map(Phase::from_native) == Some(Phase::Forward) {
            layer_mut(layer, &mut layers);
        }
    }
    for v in vars {
        let i = layer_mut(&v.layer, &mut layers);
        layers[i].parameters_bytes += v.bytes;
    }
    for pass in &act_passes {
        let mut per_layer: HashMap<String, i64> = HashMap::new();
        for (&op, &bytes) in pass {
            *per_layer.entry(layer_at(op)).or_insert(0) += bytes;
        }
        for (layer, bytes) in per_layer {
            let i = layer_mut(&layer, &mut layers);
            layers[i].activation_bytes = layers[i].activation_bytes.max(bytes.max(0) as u64);
        }
    }
    let (mut fwd, mut bwd, mut opt) = (0u64, 0u64, 0u64);
    let mut uncounted: HashMap<i32, u64> = HashMap::new();
    for e in events {
        match e.kind {
            ev::FLOPS => {
                let flops = e.value.max(0) as u64;
                match phase_at(e.op).unwrap_or(Phase::from_native(e.phase)) {
                    Phase::Forward => {
                        fwd += flops;
                        let i = layer_mut(&layer_at(e.op), &mut layers);
                        layers[i].forward_flops += flops;
                    }
                    Phase::Backward => {
                        bwd += flops;
                        let i = layer_mut(&layer_at(e.op), &mut layers);
                        layers[i].backward_flops += flops;
                    }
                    Phase::Optimizer => opt += flops,
                }
            }
            ev::UNCOUNTED => *uncounted.entry(e.aux).or_insert(0) += 1,
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

    StepProfile {
        start_bytes: start.live.max(0) as u64,
        rows,
        peak,
        category_max,
        layers,
        forward_flops: fwd,
        backward_flops: bwd,
        optimizer_flops: opt,
        uncounted_ops,
        complete: consistent,
        ..StepProfile::default()
    }
}

#[derive(Serialize)]
struct TimelineCsvRow<'a> {
    op_index: u32,
    op: &'a str,
    phase: &'static str,
    layer: &'a str,
    param_bytes: u64,
    buffer_bytes: u64,
    grad_bytes: u64,
    act_bytes: u64,
    temp_bytes: u64,
    opt_bytes: u64,
    other_bytes: u64,
    total_bytes: u64,
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

    /// Writes the timeline as CSV: `op_index, op, phase, layer`, one `<category>_bytes`
    /// column per category and `total_bytes`. Replaces the file atomically.
    pub fn write_timeline_csv(&self, path: &Path) -> Result<()> {
        write_atomically(path, |w| {
            for r in &self.rows {
                let b = &r.bytes;
                w.serialize(TimelineCsvRow {
                    op_index: r.op_index,
                    op: &r.op,
                    phase: r.phase.name(),
                    layer: &r.layer,
                    param_bytes: b.get(Category::Param),
                    buffer_bytes: b.get(Category::Buffer),
                    grad_bytes: b.get(Category::Grad),
                    act_bytes: b.get(Category::Act),
                    temp_bytes: b.get(Category::Temp),
                    opt_bytes: b.get(Category::Opt),
                    other_bytes: b.get(Category::Other),
                    total_bytes: b.total(),
                })?;
            }
            Ok(())
        })
    }

    /// Writes the layers as CSV: `layer, parameters_bytes, activation_bytes,
    /// forward_flops, backward_flops`. Replaces the file atomically.
    pub fn write_layers_csv(&self, path: &Path) -> Result<()> {
        write_atomically(path, |w| {
            for l in &self.layers {
                w.serialize(l)?;
            }
            Ok(())
        })
    }

    /// Writes the plot: PNG or SVG by the file's extension (`.svg` gives SVG).
    pub fn plot(&self, path: &Path, title: Option<&str>) -> Result<()> {
        crate::plot::plot_timeline(self, path, title)
    }
}

fn write_atomically(
    path: &Path,
    body: impl FnOnce(&mut csv::Writer<Vec<u8>>) -> std::result::Result<(), csv::Error>,
) -> Result<()> {
    let csv_err = |source| Error::Csv {
        path: path.to_path_buf(),
        source,
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    body(&mut w).map_err(csv_err)?;
    let bytes = w
        .into_inner()
        .map_err(|e| csv_err(csv::Error::from(e.into_error())))?;
    crate::fs::write_atomic(path, &bytes)
}

/// Names the layer of every op run on this thread until the guard drops, overriding
/// the attribution by variables. Scopes nest (the innermost wins, up to 32 deep); the
/// backward nodes of a scope's forward ops belong to the scope too.
///
/// ```no_run
/// # fn attention(x: &tch::Tensor) -> tch::Tensor { x.shallow_clone() }
/// # let x = tch::Tensor::zeros([1], (tch::Kind::Float, tch::Device::Cpu));
/// let y = {
///     let _scope = tch_memprof::scope("attention");
///     attention(&x)
/// };
/// ```
///
/// Without a profiler, or with the timeline off, a scope does nothing. If the native
/// layer refuses it (nested deeper than 32), a warning is logged and the ops keep
/// their usual layer.
#[must_use = "the scope ends when the guard drops"]
pub fn scope(name: &str) -> Scope {
    let pushed = match ffi::intern(name).and_then(ffi::scope_push) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("tch-memprof: scope {name:?} not opened: {e}");
            false
        }
    };
    Scope {
        pushed,
        _not_send: std::marker::PhantomData,
    }
}

/// Guard of a [`scope`]; the scope ends when it drops. Not `Send`: scopes belong to
/// the thread that opened them.
#[derive(Debug)]
pub struct Scope {
    pushed: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.pushed {
            if let Err(e) = ffi::scope_pop() {
                log::warn!("tch-memprof: closing a scope failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(ptr: u64, bytes: i64, gen: u32, phase: u8, op: i32) -> TlEvent {
        TlEvent {
            kind: ev::ALLOC,
            phase,
            gen,
            op,
            ptr,
            value: bytes,
            ..TlEvent::default()
        }
    }
    fn free(ptr: u64, bytes: i64, gen: u32, phase: u8, op: i32) -> TlEvent {
        TlEvent {
            kind: ev::FREE,
            phase,
            gen,
            op,
            ptr,
            value: -bytes,
            ..TlEvent::default()
        }
    }
    fn begin(op: i32, phase: u8, var: i64) -> TlEvent {
        TlEvent {
            kind: ev::OP_BEGIN,
            phase,
            op,
            aux: -1,
            value: var,
            ..TlEvent::default()
        }
    }
    fn end(op: i32, phase: u8, live: i64) -> TlEvent {
        TlEvent {
            kind: ev::OP_END,
            phase,
            op,
            aux: -1,
            value: live,
            ..TlEvent::default()
        }
    }
    fn phase(gen: u32, p: u8) -> TlEvent {
        TlEvent {
            kind: ev::PHASE,
            phase: p,
            gen,
            op: -1,
            ..TlEvent::default()
        }
    }

    /// A hand-made iteration: weights 100 B at start, grads 10 B from the last
    /// iteration (freed in forward), forward keeps 40 B and frees a 5 B temporary,
    /// backward makes a 100 B gradient and a 7 B activation gradient, the optimizer
    /// makes 200 B of state and a 3 B temporary.
    #[test]
    fn replay_classifies_blocks_by_what_became_of_them() {
        let start = StepStart {
            gen: 10,
            live: 100 + 10 + 1,
            param: HashMap::from([(1, 100)]),
            grad: HashMap::from([(2, 10)]),
            ..StepStart::default()
        };
        let events = vec![
            begin(0, 0, 0),
            alloc(10, 40, 10, 0, 0),
            alloc(11, 5, 10, 0, 0),
            free(11, 5, 10, 0, 0),
            free(2, 10, 5, 1, 0),
            end(0, 0, 141),
            phase(11, 1),
            begin(1, 1, -1),
            alloc(20, 100, 11, 1, 1),
            alloc(21, 7, 11, 1, 1),
            free(21, 7, 11, 1, 1),
            free(10, 40, 10, 0, 1),
            end(1, 1, 201),
            phase(12, 2),
            begin(2, 2, 0),
            alloc(30, 200, 12, 2, 2),
            alloc(31, 3, 12, 2, 2),
            free(31, 3, 12, 2, 2),
            end(2, 2, 401),
        ];
        let vars = vec![VarEntry {
            layer: "fc".into(),
            bytes: 100,
        }];
        let p = replay(&events, false, &start, 0, &vars, &mut Names::default());
        assert!(p.complete);
        assert_eq!(p.rows.len(), 3);
        let r0 = &p.rows[0].bytes;
        assert_eq!(r0.get(Category::Param), 100);
        assert_eq!(r0.get(Category::Act), 40);
        assert_eq!(r0.get(Category::Grad), 0);
        assert_eq!(r0.get(Category::Other), 1);
        assert_eq!(r0.total(), 141);
        let r1 = &p.rows[1].bytes;
        assert_eq!(r1.get(Category::Grad), 100);
        assert_eq!(r1.get(Category::Act), 0);
        assert_eq!(r1.total(), 201);
        let r2 = &p.rows[2].bytes;
        assert_eq!(r2.get(Category::Opt), 200);
        assert_eq!(r2.total(), 401);
        // Peak: 100 + 100 + 1 + 200 + 3 during the optimizer op.
        assert_eq!(p.peak.bytes, 404);
        assert_eq!(p.peak.breakdown.get(Category::Temp), 3);
        assert_eq!(p.peak.op_index, Some(2));
        assert_eq!(p.peak.phase, Some(Phase::Optimizer));
        // Category maxima: TEMP saw 7 B in backward.
        assert_eq!(p.category_max.get(Category::Temp), 7);
        assert_eq!(p.category_max.get(Category::Act), 40);
        assert_eq!(p.category_max.get(Category::Grad), 100);
        // Layers: op 0 read variable 0 ("fc"); op 1 has no link and follows op 0.
        let fc = p.layers.iter().find(|l| l.layer == "fc").unwrap();
        assert_eq!(fc.activation_bytes, 40);
        assert_eq!(fc.parameters_bytes, 100);
        assert_eq!(p.phase_boundaries(), (Some(1), Some(2)));
    }

    #[test]
    fn a_freed_block_of_unknown_birth_marks_the_profile_incomplete() {
        let start = StepStart {
            gen: 10,
            ..StepStart::default()
        };
        let events = vec![free(99, 8, 10, 0, -1)];
        let p = replay(&events, false, &start, 0, &[], &mut Names::default());
        assert!(!p.complete);
    }

    #[test]
    fn layer_is_the_path_without_its_last_component() {
        assert_eq!(layer_of("layer1.0.conv1.weight"), "layer1.0.conv1");
        assert_eq!(layer_of("weight"), "(root)");
    }
}
