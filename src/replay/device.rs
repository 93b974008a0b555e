//! The dry run replayed as a profiled step is, in two stages:
//!
//! 1. **The device's allocator** ([`through_allocator`]): the weights' and the run's
//!    events go through the model of PyTorch's CUDA caching allocator, which charges
//!    each block its size (the request rounded up, and a block's unsplit rest) and takes
//!    the cuBLAS and cuBLASLt workspaces at a thread's first call that needs one. Out
//!    come the same events with the device's bytes, the workspaces as allocations, the
//!    predicted peaks and where they were reached.
//! 2. **The step passes** ([`predicted_step`]): the step whose peak is the run's peak is
//!    cut out of those events and replayed by the passes a profiled step goes through
//!    (`replay::step`): categories, layers, FLOPs, the blocks idle at the peak, as a
//!    [`StepProfile`].

use std::collections::{HashMap, HashSet};

use super::allocator::{AllocatorConfig, AllocatorStats, CachingAllocator, PoolState};
use super::step::replay as replay_step;
use crate::events::{Event, EventKind, TransientSize};
use crate::names::Names;
use crate::phase::Phase;
use crate::timeline::{StepProfile, StepStart, VarEntry};

/// The device a replay models: the caching allocator's settings and the GPU's cuBLAS and
/// cuBLASLt workspaces (each taken once per thread that needs one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceModel<'a> {
    pub allocator: &'a AllocatorConfig,
    pub cublas_workspace: u64,
    pub cublaslt_workspace: u64,
}

impl DeviceModel<'_> {
    /// The workspaces a call on cuBLAS (`lt`: on cuBLASLt) in `phase` wants, as (slot,
    /// bytes), each slot taken once per run: the autograd engine's CUDA thread runs
    /// backward with a handle (and workspaces) of its own, and a cuBLASLt call gets its
    /// handle through the cuBLAS one, so it takes the cuBLAS workspace first, then its
    /// own. Slots: 0 and 1 cuBLAS (training thread, autograd thread), 2 and 3 cuBLASLt.
    pub(crate) fn workspace_wants(
        &self,
        lt: bool,
        phase: Phase,
    ) -> impl Iterator<Item = (usize, u64)> {
        let thread = usize::from(phase == Phase::Backward);
        std::iter::once((thread, self.cublas_workspace))
            .chain(lt.then_some((2 + thread, self.cublaslt_workspace)))
    }
}

/// Ids of the cuBLAS workspaces in the replay (the dry run's blocks are fake addresses
/// far below): this plus the slot.
pub(crate) const WORKSPACE_ID: u64 = u64::MAX - 16;
/// The blocks of kernels' workspaces ([`EventKind::Transient`]): this plus a count, far
/// from the dry run's fake addresses and from [`WORKSPACE_ID`].
pub(crate) const TRANSIENT_ID: u64 = 1 << 62;

/// The dry run as the device sees it.
#[derive(Debug, Clone)]
pub(crate) struct Device {
    /// The weights' and the run's events, each allocation's and free's bytes as the
    /// allocator charges them (frees: minus), the cuBLAS workspaces as allocations
    /// (never freed), frees of blocks the allocator never saw left out.
    pub events: Vec<Event>,
    /// Allocated bytes once the weights were on the device.
    pub weights: u64,
    /// Allocated bytes once the weights and the first batch were on the device.
    pub baseline: u64,
    /// The allocator's statistics at the end (peaks included).
    pub stats: AllocatorStats,
    /// cuBLAS workspaces taken (the training thread, the autograd thread), then
    /// cuBLASLt ones.
    pub workspaces: [bool; 4],
    /// Allocations of the run.
    pub allocations: u64,
    /// FLOPs of the run.
    pub flops: u64,
    /// Each step's peak allocated (from 1, in order), where it was first reached.
    pub steps: Vec<StepPeak>,
    pub unknown_frees: u64,
    pub refused_requests: u64,
    /// The pools when reserved first reached its peak, and the request that made the
    /// last segment then (the caching allocator only).
    pub at_reserved_peak: Option<(PoolState, u64)>,
    /// Kernels' workspaces ([`EventKind::Transient`]) replayed, and the largest as
    /// charged.
    pub transients: u64,
    pub largest_transient: u64,
    /// Of them, those charged at the larger plausible size (convolutions not measured on
    /// the GPU estimated for).
    pub bounded_transients: u64,
    /// Every request the allocator was asked, in order (the weights', the run's, the
    /// cuBLAS workspaces', the kernels' workspaces'): what a recorded history's `alloc`
    /// actions are compared with. A measured convolution backward's workspace is one
    /// request here, the most it held at once, where the GPU made two.
    pub requests: Vec<Request>,
    /// How many of them are the weights' (the first ones).
    pub weight_requests: usize,
}

/// One request to the allocator: the bytes asked for, and the name id of the op that
/// asked (-1: none, as for the weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub bytes: u64,
    pub op: i32,
}

/// The highest allocated bytes of one step of the dry run, and where it was first
/// reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepPeak {
    /// The step, from 1.
    pub step: u32,
    pub bytes: u64,
    /// The name id of the timeline op that was running (-1: none).
    pub op: i32,
    pub phase: Phase,
}

/// What turns a request into the bytes a device holds.
enum Allocator {
    /// PyTorch's CUDA caching allocator (the model), with the cuBLAS workspaces.
    Caching(Box<CachingAllocator>),
    /// Every block its request, no workspace: the CPU allocator's bytes, for the checks
    /// of a predicted step against a measured CPU step.
    AsRequested {
        live: HashMap<u64, u64>,
        stats: AllocatorStats,
        unknown_frees: u64,
    },
}

impl Allocator {
    /// The pools now (the caching allocator only).
    fn pools(&self) -> Option<PoolState> {
        match self {
            Allocator::Caching(a) => Some(a.pools()),
            Allocator::AsRequested { .. } => None,
        }
    }

    /// A block for `id` on `stream` (an index: the caching allocator keys its free blocks
    /// by it; the CPU's bytes have no streams).
    fn malloc(&mut self, id: u64, bytes: u64, stream: u32) -> u64 {
        match self {
            Allocator::Caching(a) => a.malloc_on(id, bytes, u64::from(stream)),
            Allocator::AsRequested { live, stats, .. } => {
                if bytes > 0 {
                    live.insert(id, bytes);
                    stats.allocated += bytes;
                    stats.peak_allocated = stats.peak_allocated.max(stats.allocated);
                    stats.reserved = stats.allocated;
                    stats.peak_reserved = stats.peak_allocated;
                    stats.requested = stats.allocated;
                    stats.peak_requested = stats.peak_allocated;
                }
                bytes
            }
        }
    }

    fn free(&mut self, id: u64) {
        match self {
            Allocator::Caching(a) => a.free(id),
            Allocator::AsRequested {
                live,
                stats,
                unknown_frees,
            } => match live.remove(&id) {
                Some(bytes) => {
                    stats.allocated -= bytes;
                    stats.reserved = stats.allocated;
                    stats.requested = stats.allocated;
                }
                None => *unknown_frees += 1,
            },
        }
    }

    /// `torch.cuda.empty_cache()`: the cached segments released (the CPU's bytes cache
    /// nothing).
    fn release(&mut self) {
        if let Allocator::Caching(a) = self {
            a.empty_cache();
        }
    }

    fn stats(&self) -> AllocatorStats {
        match self {
            Allocator::Caching(a) => a.stats(),
            Allocator::AsRequested { stats, .. } => *stats,
        }
    }
}

/// Replays the weights' and the run's events through the caching allocator of `device`
/// (its settings, the GPU's cuBLAS workspaces).
///
/// A cuDNN convolution's workspace is the size measured for the call on the GPU where
/// there is one, else the larger plausible size (see the dry run's convolution
/// kernels); a measured backward call holds it over several requests whose sizes are not
/// known one by one. Both are right for the allocated peak's safe side, but a pool that
/// splits a workspace other than the real one for later blocks may need fewer segments
/// than the GPU does. So when the run has such workspaces, the peak reserved is the
/// largest of three replays: with them (measured, else the larger plausible size),
/// without them, and with every convolution backward's at its larger plausible size:
/// each is a way the pool can fall.
pub(crate) fn through_allocator(weights: &[Event], run: &[Event], options: &DeviceModel) -> Device {
    let caching = || Allocator::Caching(Box::new(CachingAllocator::new(options.allocator.clone())));
    let mut device = replay_on(caching(), weights, run, options, Transients::All);
    let has = |size| run.iter().any(|e| e.kind == EventKind::Transient { size });
    let (bound, measured) = (has(TransientSize::Bound), has(TransientSize::Measured));
    if bound || measured {
        // Where a call's requests are not all known (one charged by the rule, or
        // measured only as the most it held at once), the pool's layout is not known
        // either: the larger of the plausible ones.
        let mut others = vec![Transients::Exact];
        if has(TransientSize::Rule) {
            others.push(Transients::Rule);
        }
        for other in others {
            let layout = replay_on(caching(), weights, run, options, other);
            device.stats.peak_reserved = device.stats.peak_reserved.max(layout.stats.peak_reserved);
        }
    }
    device
}

/// The kernels' workspaces a replay takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transients {
    /// None (the bytes a CPU run holds).
    None,
    /// Those of their kernel's own size (a convolution's where measured as one request,
    /// or request by request).
    Exact,
    /// Every workspace as charged: the kernel's own size, measured, or the larger
    /// plausible one.
    All,
    /// As `All`, but a measured convolution backward's at its larger plausible size.
    Rule,
}

/// The same with every block its request and no workspace (the bytes a CPU run holds).
pub(crate) fn as_requested(weights: &[Event], run: &[Event], options: &DeviceModel) -> Device {
    let alloc = Allocator::AsRequested {
        live: HashMap::new(),
        stats: AllocatorStats::default(),
        unknown_frees: 0,
    };
    replay_on(alloc, weights, run, options, Transients::None)
}

/// `transients`: the kernels' workspaces replayed (none with blocks as requested).
fn replay_on(
    mut alloc: Allocator,
    weights: &[Event],
    run: &[Event],
    options: &DeviceModel,
    transients: Transients,
) -> Device {
    let exact = matches!(alloc, Allocator::AsRequested { .. });
    let takes = |size: TransientSize| match transients {
        _ if exact => false,
        Transients::None => false,
        Transients::Exact => matches!(size, TransientSize::Exact | TransientSize::Split),
        Transients::All => size != TransientSize::Rule,
        Transients::Rule => !matches!(size, TransientSize::Measured | TransientSize::Split),
    };
    let mut charged: HashMap<u64, i64> = HashMap::new();
    let mut events = Vec::with_capacity(weights.len() + run.len() + 4);
    let mut at_reserved_peak: Option<(PoolState, u64)> = None;
    let mut device = |alloc: &mut Allocator,
                      events: &mut Vec<Event>,
                      at_peak: &mut Option<(PoolState, u64)>,
                      e: &Event| match e.kind {
        EventKind::Alloc { stream } => {
            let reserved = alloc.stats().reserved;
            let bytes = alloc.malloc(e.ptr, e.value.max(0) as u64, stream) as i64;
            note_reserved_peak(at_peak, alloc, reserved, e.value.max(0) as u64);
            if bytes > 0 {
                charged.insert(e.ptr, bytes);
                events.push(Event { value: bytes, ..*e });
            }
        }
        EventKind::Free => {
            alloc.free(e.ptr);
            if let Some(bytes) = charged.remove(&e.ptr) {
                events.push(Event {
                    value: -bytes,
                    ..*e
                });
            }
        }
        // A recorded run's release of the cache: the replay's own, and no event.
        EventKind::Release => alloc.release(),
        // What the device holds when the op returns: the allocator's allocated bytes.
        EventKind::OpEnd => events.push(Event {
            value: alloc.stats().allocated as i64,
            ..*e
        }),
        _ => events.push(*e),
    };
    let mut requests = Vec::new();
    for e in weights {
        device(&mut alloc, &mut events, &mut at_reserved_peak, e);
        if e.is_alloc() && e.value > 0 {
            requests.push(Request {
                bytes: e.value as u64,
                op: -1,
            });
        }
    }
    let weights_allocated = alloc.stats().allocated;
    let weight_requests = requests.len();
    let mut baseline = weights_allocated;
    let mut workspaces = [false; 4];
    let (mut taken, mut largest_transient, mut bounded) = (0u64, 0u64, 0u64);
    // A convolution backward charged by the rule takes two workspaces: one call counted.
    let mut last_bounded = None;
    let (mut allocations, mut flops) = (0u64, 0u64);
    let mut steps: Vec<StepPeak> = Vec::new();
    // The name of each op of the step running now, by its index in the step.
    let mut op_names: HashMap<i32, i32> = HashMap::new();
    for e in run {
        let before = events.len();
        device(&mut alloc, &mut events, &mut at_reserved_peak, e);
        match e.kind {
            EventKind::Phase if steps.last().map_or(true, |s| e.generation > s.step) => {
                op_names.clear();
                // A step with no allocation (the loop's end) never holds the peak.
                steps.push(StepPeak {
                    step: e.generation,
                    bytes: 0,
                    op: -1,
                    phase: e.phase,
                });
            }
            EventKind::OpBegin => {
                op_names.insert(e.op, e.aux);
            }
            _ => {}
        }
        match e.kind {
            EventKind::Alloc { .. } => {
                allocations += 1;
                if e.value > 0 {
                    requests.push(Request {
                        bytes: e.value as u64,
                        op: op_names.get(&e.op).copied().unwrap_or(-1),
                    });
                }
            }
            EventKind::Flops => flops += e.value.max(0) as u64,
            EventKind::Baseline => baseline = alloc.stats().allocated,
            EventKind::Workspace { lt } => {
                // The autograd engine's CUDA thread runs backward with a handle (and
                // workspaces) of its own. A cuBLASLt call gets its handle through the
                // cuBLAS one, so it takes the cuBLAS workspace first, then its own.
                for (slot, size) in options.workspace_wants(lt, e.phase) {
                    if !exact && !workspaces[slot] && size > 0 {
                        workspaces[slot] = true;
                        requests.push(Request {
                            bytes: size,
                            op: op_names.get(&e.op).copied().unwrap_or(-1),
                        });
                        let id = WORKSPACE_ID + slot as u64;
                        let reserved = alloc.stats().reserved;
                        let bytes = alloc.malloc(id, size, 0) as i64;
                        note_reserved_peak(&mut at_reserved_peak, &alloc, reserved, size);
                        events.push(Event {
                            kind: EventKind::Alloc { stream: 0 },
                            ptr: id,
                            value: bytes,
                            aux: 0,
                            ..*e
                        });
                    }
                }
            }
            EventKind::Transient { size } if takes(size) && e.value > 0 => {
                // Taken after the kernel's outputs, freed before it returns: a block of
                // its own that the pool may have to make room for.
                taken += 1;
                if size == TransientSize::Bound && last_bounded != Some((e.generation, e.op)) {
                    bounded += 1;
                    last_bounded = Some((e.generation, e.op));
                }
                requests.push(Request {
                    bytes: e.value as u64,
                    op: op_names.get(&e.op).copied().unwrap_or(-1),
                });
                let id = TRANSIENT_ID + taken;
                let reserved = alloc.stats().reserved;
                let bytes = alloc.malloc(id, e.value as u64, 0) as i64;
                note_reserved_peak(&mut at_reserved_peak, &alloc, reserved, e.value as u64);
                largest_transient = largest_transient.max(bytes.max(0) as u64);
                if bytes > 0 {
                    raise_step_peak(&mut steps, alloc.stats().allocated, e, &op_names);
                }
                alloc.free(id);
                for (kind, value) in [
                    (EventKind::Alloc { stream: 0 }, bytes),
                    (EventKind::Free, -bytes),
                ] {
                    events.push(Event {
                        kind,
                        ptr: id,
                        value,
                        aux: 0,
                        ..*e
                    });
                }
            }
            _ => {}
        }
        // The step's peak, at its first allocation that reaches it.
        let now = alloc.stats().allocated;
        for a in events[before..].iter().filter(|a| a.is_alloc()) {
            raise_step_peak(&mut steps, now, a, &op_names);
        }
    }
    let (unknown_frees, refused_requests) = match &alloc {
        Allocator::Caching(a) => (a.unknown_frees(), a.refused_requests()),
        Allocator::AsRequested { unknown_frees, .. } => (*unknown_frees, 0),
    };
    Device {
        events,
        weights: weights_allocated,
        baseline,
        stats: alloc.stats(),
        workspaces,
        allocations,
        flops,
        steps,
        unknown_frees,
        refused_requests,
        at_reserved_peak,
        transients: taken,
        largest_transient,
        bounded_transients: bounded,
        requests,
        weight_requests,
    }
}

/// The pools when reserved first reached its peak (and the request that made the last
/// segment then): `at` replaced when the request just made (`request` bytes, reserved
/// `before` it) raised reserved above it.
fn note_reserved_peak(
    at: &mut Option<(PoolState, u64)>,
    alloc: &Allocator,
    before: u64,
    request: u64,
) {
    let now = alloc.stats().reserved;
    if now > before && now > at.map_or(0, |(p, _)| p.reserved) {
        *at = alloc.pools().map(|p| (p, request));
    }
}

/// The running step's peak raised to `now` allocated bytes when that is higher, at
/// `e`'s op and phase.
fn raise_step_peak(steps: &mut [StepPeak], now: u64, e: &Event, op_names: &HashMap<i32, i32>) {
    if let Some(s) = steps.last_mut().filter(|s| now > s.bytes) {
        s.bytes = now;
        s.op = op_names.get(&e.op).copied().unwrap_or(-1);
        s.phase = e.phase;
    }
}

/// What the model's variables are, for the replay: the layer and bytes of each (in the
/// order the dry run's op recorder numbers them), and which blocks hold trainable
/// variables (the other blocks the weights made and keep are buffers).
#[derive(Debug, Clone, Default)]
pub(crate) struct ModelVars {
    pub entries: Vec<VarEntry>,
    /// The block of each entry.
    pub ptrs: Vec<u64>,
    pub trainable: HashSet<u64>,
}

/// The step of the dry run whose peak allocated is the run's peak: the last such step (a
/// training step that runs with the optimizer's state in memory). `None` when the run
/// made no step.
pub(crate) fn peak_step(device: &Device) -> Option<StepPeak> {
    // A step that allocated nothing (the loop's end) holds no peak.
    let best = device
        .steps
        .iter()
        .map(|s| s.bytes)
        .filter(|b| *b > 0)
        .max()?;
    device.steps.iter().rev().find(|s| s.bytes == best).copied()
}

/// The profile of dry-run step `step`, as the step timeline replays a profiled step:
/// what is live when it begins is classified as the profiler classifies it (the
/// variables by `vars`: trainable ones PARAM, the others BUFFER; gradients and optimizer
/// state by the phase that made them in an earlier step; the rest, the cuBLAS workspaces
/// included, OTHER),
/// then its events go through the timeline's passes. With `site_name` (which names an
/// allocation's site, its `aux`), the blocks idle at the peak too.
pub(crate) fn predicted_step(
    device: &Device,
    step: u32,
    vars: &ModelVars,
    names: &mut Names,
    site_name: Option<&mut dyn FnMut(i32) -> String>,
) -> StepProfile {
    let events = &device.events;
    let begin = events
        .iter()
        .position(|e| e.kind == EventKind::Phase && e.generation == step)
        .unwrap_or(events.len());
    let end = events[begin..]
        .iter()
        .position(|e| e.kind == EventKind::Phase && e.generation > step)
        .map_or(events.len(), |i| begin + i);
    // What is live at the step's start, and what made it.
    let mut live: HashMap<u64, (i64, Phase, u32)> = HashMap::new();
    for e in &events[..begin] {
        match e.kind {
            EventKind::Alloc { .. } => {
                live.insert(e.ptr, (e.value, e.phase, e.generation));
            }
            EventKind::Free => {
                live.remove(&e.ptr);
            }
            _ => {}
        }
    }
    let variables: HashSet<u64> = vars.ptrs.iter().copied().collect();
    let mut start = StepStart {
        generation: step,
        device_owned: (0..4).map(|slot| WORKSPACE_ID + slot).collect(),
        ..StepStart::default()
    };
    for (&ptr, &(bytes, phase, generation)) in &live {
        start.live += bytes;
        if start.device_owned.contains(&ptr) {
            start.workspace.insert(ptr, bytes);
        } else if vars.trainable.contains(&ptr) {
            start.param.insert(ptr, bytes);
        } else if generation == 0 && variables.contains(&ptr) {
            // The model's other variables (batch-norm statistics); what else building it
            // left (a tensor held outside the variables) is other, as the profiler has it.
            start.buffer.insert(ptr, bytes);
        } else if phase == Phase::Backward && generation > 0 {
            start.grad.insert(ptr, bytes);
        } else if phase == Phase::Optimizer && generation > 0 {
            start.opt += bytes;
        }
    }
    let mut p = replay_step(
        &events[begin..end],
        false,
        &start,
        0,
        &vars.entries,
        names,
        site_name,
    );
    p.step = u64::from(step);
    p.iteration = u64::from(step);
    p.epoch = 1;
    p
}
