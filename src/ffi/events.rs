//! The one event model. Both logs the native op recorder and allocator hooks write (the
//! step log of a profiled step, `logs.cpp`; the meta trace of a dry run, `dryrun/trace.cpp`)
//! hold `MpTlEvent`s, decoded here, once, into [`Event`]s. No code outside `ffi` matches a
//! raw kind: the step timeline's replay and the estimate read the same events, whatever
//! their source.

use crate::phase::Phase;

use super::native;

/// What an [`Event`] is, and what its fields mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EventKind {
    /// A block born: `ptr` the block, `value` its bytes, `phase` and `generation` its
    /// birth, `device` its device slot, `op` the timeline op running, `aux` its call
    /// stack's site id + 1 (0: none kept).
    Alloc,
    /// A block freed: `ptr`, `value` minus its bytes, `phase` and `generation` its birth,
    /// `device`, `op`.
    Free,
    /// A timeline op begins: `op` its index in the step, `aux` its name id, `generation`
    /// its scope's name id + 1 (0: none), `value` the index of the first variable among
    /// its inputs (-1: none), `ptr` in TorchScript its module path's name id + 2 (1: the
    /// root module), 0 outside TorchScript.
    OpBegin,
    /// A timeline op returns: `op`, `aux` its name id, `value` the device's live bytes.
    OpEnd,
    /// A backward node's forward op: `op` the node, `aux` the forward op, `ptr` the
    /// autograd sequence number.
    Link,
    /// FLOPs counted at an op: `op`, `aux` the name id of the op counted, `value` FLOPs.
    Flops,
    /// An op with no FLOP formula: `op`, `aux` its name id.
    Uncounted,
    /// A phase begins: `phase`, `generation` the new generation (a dry run: its step).
    Phase,
    /// `op` (or an op nested in it) took the block `ptr` as an input.
    Read,
    /// A dry run: the weights and the first batch are on the device.
    Baseline,
    /// A dry run: an op that CUDA runs on cuBLAS (`lt` false) or on cuBLASLt (`lt` true)
    /// returned, inside timeline op `op`; `aux` its name id.
    Workspace {
        /// cuBLASLt (which takes a workspace of its own after the cuBLAS one).
        lt: bool,
    },
    /// A dry run: a CUDA kernel inside timeline op `op` takes `value` bytes after its
    /// outputs and frees them before it returns (cuDNN's convolution workspace); `aux`
    /// what the size is (`native::TRANSIENT_*`): the kernel's own; the larger plausible
    /// one (a convolution not measured on the GPU); the most a measured call held at
    /// once over requests not known one by one (a convolution backward's); or, beside
    /// that, the same call's larger plausible size, for the pool's other layout.
    Transient,
}

/// One event of a profiled step or of a dry run (see [`EventKind`] for the fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Event {
    pub kind: EventKind,
    pub phase: Phase,
    pub device: u8,
    pub generation: u32,
    pub op: i32,
    pub aux: i32,
    pub ptr: u64,
    pub value: i64,
}

impl Event {
    /// An event of `kind` with every field empty (no op, no block, forward).
    #[cfg(test)]
    pub(crate) fn new(kind: EventKind) -> Event {
        Event {
            kind,
            phase: Phase::Forward,
            device: 0,
            generation: 0,
            op: -1,
            aux: 0,
            ptr: 0,
            value: 0,
        }
    }

    /// Whether it is a birth or a death of a block.
    pub(crate) fn is_block(&self) -> bool {
        matches!(self.kind, EventKind::Alloc | EventKind::Free)
    }
}

/// The phase the native layer numbers `p` (its idle state reads as forward).
pub(crate) fn phase(p: impl Into<u32>) -> Phase {
    match p.into() {
        native::PHASE_BACKWARD => Phase::Backward,
        native::PHASE_OPTIMIZER => Phase::Optimizer,
        _ => Phase::Forward,
    }
}

/// `MpTlEvent`: one raw event of the step log or of the meta trace, decoded into an
/// [`Event`](super::Event) before it leaves `ffi` (see memprof.h for the fields).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MpTlEvent {
    pub kind: u8,
    pub phase: u8,
    pub device: u8,
    pub pad: u8,
    pub generation: u32,
    pub op: i32,
    pub aux: i32,
    pub ptr: u64,
    pub value: i64,
}

/// The raw event's kind, `None` for a kind this crate does not know (never written).
fn kind_of(raw: &MpTlEvent) -> Option<EventKind> {
    Some(match raw.kind {
        native::EV_ALLOC => EventKind::Alloc,
        native::EV_FREE => EventKind::Free,
        native::EV_OP_BEGIN => EventKind::OpBegin,
        native::EV_OP_END => EventKind::OpEnd,
        native::EV_LINK => EventKind::Link,
        native::EV_FLOPS => EventKind::Flops,
        native::EV_UNCOUNTED => EventKind::Uncounted,
        native::EV_PHASE => EventKind::Phase,
        native::EV_READ => EventKind::Read,
        native::EV_BASELINE => EventKind::Baseline,
        native::EV_WORKSPACE => EventKind::Workspace { lt: raw.value == 2 },
        native::EV_TRANSIENT => EventKind::Transient,
        _ => return None,
    })
}

/// Decodes raw events into `into` (cleared first), in order.
pub(super) fn decode(raw: &[MpTlEvent], into: &mut Vec<Event>) -> crate::Result<()> {
    into.clear();
    into.try_reserve_exact(raw.len()).map_err(|e| {
        crate::Error::Native(format!(
            "cannot allocate a buffer of {} events: {e}",
            raw.len()
        ))
    })?;
    into.extend(raw.iter().filter_map(|r| {
        Some(Event {
            kind: kind_of(r)?,
            phase: phase(r.phase),
            device: r.device,
            generation: r.generation,
            op: r.op,
            aux: r.aux,
            ptr: r.ptr,
            value: r.value,
        })
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_numbers_map_to_phases() {
        assert_eq!(phase(native::PHASE_FORWARD), Phase::Forward);
        assert_eq!(phase(native::PHASE_BACKWARD as u8), Phase::Backward);
        assert_eq!(phase(native::PHASE_OPTIMIZER), Phase::Optimizer);
        assert_eq!(phase(native::PHASE_IDLE), Phase::Forward);
    }

    #[test]
    fn every_kind_the_native_layer_writes_decodes() {
        let raw: Vec<MpTlEvent> = (1..=12)
            .map(|k| MpTlEvent {
                kind: k,
                phase: native::PHASE_BACKWARD as u8,
                value: 2,
                ..MpTlEvent::default()
            })
            .chain([MpTlEvent {
                kind: 200,
                ..MpTlEvent::default()
            }])
            .collect();
        let mut out = Vec::new();
        decode(&raw, &mut out).unwrap();
        assert_eq!(out.len(), 12, "the unknown kind is left out");
        assert!(out
            .iter()
            .all(|e| e.phase == Phase::Backward && e.value == 2));
        assert_eq!(out[10].kind, EventKind::Workspace { lt: true });
        assert_eq!(out[11].kind, EventKind::Transient);
        assert_eq!(out[0].kind, EventKind::Alloc);
        assert_eq!(out[8].kind, EventKind::Read);
    }
}
