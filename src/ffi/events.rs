//! The native logs decoded into the one event model (`crate::events`). Both logs the
//! native op recorder and allocator hooks write (the step log of a profiled step,
//! `logs.cpp`; the meta trace of a dry run, `dryrun/trace.cpp`) hold `MpTlEvent`s,
//! decoded here, once, into [`Event`]s. No code outside `ffi` matches a raw kind.

use crate::events::{Event, EventKind, TransientSize};
use crate::phase::Phase;

use super::native;

/// The phase the native layer numbers `p` (its idle state reads as forward).
pub(crate) fn phase(p: impl Into<u32>) -> Phase {
    match p.into() {
        native::PHASE_BACKWARD => Phase::Backward,
        native::PHASE_OPTIMIZER => Phase::Optimizer,
        _ => Phase::Forward,
    }
}

/// `MpTlEvent`: one raw event of the step log or of the meta trace, decoded into an
/// [`Event`] before it leaves `ffi` (see memprof.h for the fields).
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
        native::EV_ALLOC => EventKind::Alloc { stream: 0 },
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
        native::EV_TRANSIENT => EventKind::Transient {
            size: match raw.aux {
                native::TRANSIENT_BOUND => TransientSize::Bound,
                native::TRANSIENT_MEASURED => TransientSize::Measured,
                native::TRANSIENT_RULE => TransientSize::Rule,
                native::TRANSIENT_SPLIT => TransientSize::Split,
                _ => TransientSize::Exact,
            },
        },
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
        assert_eq!(
            out[11].kind,
            EventKind::Transient {
                size: TransientSize::Exact
            }
        );
        assert_eq!(out[0].kind, EventKind::Alloc { stream: 0 });
        assert_eq!(out[8].kind, EventKind::Read);
    }
}
