//! The step timeline's op events in an iteration that recorded none.
//!
//! Recording every op costs a launch-bound step about 40% (libtorch's RecordFunction
//! for every op, and the op recorder behind it: docs/in-a-training-run.md#overhead). But
//! a training loop runs the same ops, allocating the same sizes, every iteration. So the
//! native side records the ops' events only in the iterations that learn (the first
//! two, every 64th, and any after one that differed: `native/hooks/op_seq.cpp`), and in
//! the others logs blocks and phases alone, as every profiled iteration counts them.
//! The last learning iteration's log is kept here, as a template; an iteration that
//! recorded no op and is profiled (the run's highest peak so far, or the step asked
//! for) takes its op events from it: where both logs' blocks and phases are the same
//! (kind, device, bytes, birth phase, which block of the iteration a free ends), the
//! ops ran as in the template, and its op events go between this iteration's own block
//! events where they were in the template. What differs between two such iterations is
//! kept from this one: the blocks' addresses and generations, and the live bytes at an
//! op's end (moved by the difference of the two iterations' live bytes at their start).
//!
//! Where the logs differ (a batch of another shape, a branch taken, a free in another
//! place), nothing is guessed. Where it shows at an allocation (a block of another
//! size), the native side records every op that begins after it; where it shows only
//! here, the profile has no ops. Either way it says so
//! ([`StepProfile::ops_recorded`](crate::StepProfile)), and the next iteration learns.
//! `tests/timeline_learned.rs` holds a merged profile to the one of the same step
//! with every op recorded.

use rustc_hash::FxHashMap;

use crate::events::{Event, EventKind};
use crate::ffi::StepLogStart;

/// The last learning iteration's step log.
#[derive(Debug, Default)]
pub(crate) struct Template {
    events: Vec<Event>,
    start: StepLogStart,
    /// Whether `events` is a complete log (not overflowed).
    complete: bool,
    /// Whether there is one.
    set: bool,
}

/// Events the allocation hooks log in every iteration (the others are the op recorder's).
fn block_side(e: &Event) -> bool {
    matches!(
        e.kind,
        EventKind::Alloc { .. } | EventKind::Free | EventKind::Phase
    )
}

/// What a block-side event is, independently of where its block lies: its kind, device,
/// birth phase, bytes, and for a free, the block of this iteration it ends (its birth's
/// place among the iteration's allocations), or that the block was live at the start.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    kind: EventKind,
    device: u8,
    phase: crate::Phase,
    value: i64,
    /// A free: the ordinal of its block's birth in the iteration; -1 born before it.
    /// A phase change: its generation after the iteration's start.
    which: i64,
}

/// The block-side events of a log, as shapes.
fn shapes(events: &[Event], start: &StepLogStart) -> Vec<(usize, Shape)> {
    let mut births: FxHashMap<(u8, u64), i64> = FxHashMap::default();
    let mut n_births = 0i64;
    let mut out = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        if !block_side(e) {
            continue;
        }
        let in_step = (e.generation.wrapping_sub(start.generation) as i32) >= 0;
        let which = match e.kind {
            EventKind::Alloc { .. } => {
                births.insert((e.device, e.ptr), n_births);
                n_births += 1;
                0
            }
            EventKind::Free if in_step => births.remove(&(e.device, e.ptr)).unwrap_or(-2),
            EventKind::Free => -1,
            _ => e.generation.wrapping_sub(start.generation) as i64,
        };
        out.push((
            i,
            Shape {
                kind: e.kind,
                device: e.device,
                phase: e.phase,
                value: e.value,
                which,
            },
        ));
    }
    out
}

impl Template {
    /// Keeps a learning iteration's log (every op recorded) as the template.
    pub(crate) fn keep(&mut self, events: &[Event], start: StepLogStart, overflow: bool) {
        self.events.clear();
        self.events.extend_from_slice(events);
        self.start = start;
        self.complete = !overflow;
        self.set = true;
    }

    /// An iteration's log without op events (`events`, begun at `start`) with the
    /// template's op events put in, into `out`; false where the two iterations' blocks
    /// and phases are not the same (`out` is then untouched).
    pub(crate) fn merge(
        &self,
        events: &[Event],
        start: &StepLogStart,
        out: &mut Vec<Event>,
    ) -> bool {
        if !self.set || !self.complete {
            return false;
        }
        let ours = shapes(events, start);
        let theirs = shapes(&self.events, &self.start);
        if ours.len() != theirs.len()
            || ours
                .iter()
                .zip(&theirs)
                .any(|((_, a), (_, b))| a != b || a.which == -2)
        {
            return false;
        }
        let shift = start.live - self.start.live;
        out.clear();
        out.reserve(self.events.len());
        let mut next = ours.iter();
        for t in &self.events {
            if block_side(t) {
                let Some(&(i, _)) = next.next() else {
                    return false;
                };
                let mut e = events[i];
                e.op = t.op;
                out.push(e);
            } else {
                let mut e = *t;
                if e.kind == EventKind::OpEnd {
                    e.value += shift;
                }
                out.push(e);
            }
        }
        true
    }
}

/// An iteration's log unlike the template's: its block and phase events alone, with no
/// op.
pub(crate) fn without_ops(events: &mut Vec<Event>) {
    events.retain(block_side);
    for e in events {
        e.op = -1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Phase;

    fn ev(kind: EventKind, op: i32, ptr: u64, value: i64, generation: u32) -> Event {
        let mut e = Event::new(kind);
        e.op = op;
        e.ptr = ptr;
        e.value = value;
        e.generation = generation;
        e
    }

    /// A learned iteration (start generation 10, 1000 bytes live): op 0 allocates 64
    /// bytes, op 1 allocates 32 and frees the 64, then backward.
    fn learned() -> Vec<Event> {
        let mut phase = ev(EventKind::Phase, -1, 0, 0, 11);
        phase.phase = Phase::Backward;
        vec![
            ev(EventKind::OpBegin, 0, 0, -1, 0),
            ev(EventKind::Alloc { stream: 0 }, 0, 0x100, 64, 10),
            ev(EventKind::OpEnd, 0, 0, 1064, 0),
            ev(EventKind::OpBegin, 1, 0, -1, 0),
            ev(EventKind::Alloc { stream: 0 }, 1, 0x200, 32, 10),
            ev(EventKind::Free, 1, 0x100, -64, 10),
            ev(EventKind::OpEnd, 1, 0, 1032, 0),
            phase,
        ]
    }

    fn start(generation: u32, live: i64) -> StepLogStart {
        StepLogStart { generation, live }
    }

    #[test]
    fn a_steady_iteration_takes_the_learned_ops_between_its_own_blocks() {
        let mut t = Template::default();
        t.keep(&learned(), start(10, 1000), false);
        // The same iteration later: other addresses, generations, 500 more bytes live,
        // and no op (its events' op is whatever ran last).
        let mut phase = ev(EventKind::Phase, -1, 0, 0, 21);
        phase.phase = Phase::Backward;
        let steady = vec![
            ev(EventKind::Alloc { stream: 0 }, 7, 0x900, 64, 20),
            ev(EventKind::Alloc { stream: 0 }, 7, 0x800, 32, 20),
            ev(EventKind::Free, 7, 0x900, -64, 20),
            phase,
        ];
        let mut out = Vec::new();
        assert!(t.merge(&steady, &start(20, 1500), &mut out));
        let kinds: Vec<_> = out.iter().map(|e| (e.kind, e.op, e.ptr)).collect();
        assert_eq!(
            kinds,
            vec![
                (EventKind::OpBegin, 0, 0),
                (EventKind::Alloc { stream: 0 }, 0, 0x900),
                (EventKind::OpEnd, 0, 0),
                (EventKind::OpBegin, 1, 0),
                (EventKind::Alloc { stream: 0 }, 1, 0x800),
                (EventKind::Free, 1, 0x900),
                (EventKind::OpEnd, 1, 0),
                (EventKind::Phase, -1, 0),
            ]
        );
        // Live bytes at each op's end: this iteration's, 500 above the template's.
        assert_eq!(out[2].value, 1564);
        assert_eq!(out[6].value, 1532);
        assert_eq!(out[1].generation, 20);
    }

    #[test]
    fn an_iteration_unlike_the_learned_one_takes_nothing() {
        let mut t = Template::default();
        let mut out = Vec::new();
        let s = start(20, 1000);
        let a = |ptr, v| ev(EventKind::Alloc { stream: 0 }, -1, ptr, v, 20);
        let f = |ptr, v| ev(EventKind::Free, -1, ptr, v, 20);
        let mut phase = ev(EventKind::Phase, -1, 0, 0, 21);
        phase.phase = Phase::Backward;
        // No template yet.
        assert!(!t.merge(&[a(1, 64), a(2, 32), f(1, -64), phase], &s, &mut out));
        t.keep(&learned(), start(10, 1000), false);
        // Another size (a batch of another shape).
        assert!(!t.merge(&[a(1, 64), a(2, 48), f(1, -64), phase], &s, &mut out));
        // The other block freed.
        assert!(!t.merge(&[a(1, 64), a(2, 32), f(2, -32), phase], &s, &mut out));
        // A block fewer.
        assert!(!t.merge(&[a(1, 64), a(2, 32), phase], &s, &mut out));
        // The free before the second birth.
        assert!(!t.merge(&[a(1, 64), f(1, -64), a(2, 32), phase], &s, &mut out));
        // Backward not begun.
        assert!(!t.merge(&[a(1, 64), a(2, 32), f(1, -64)], &s, &mut out));
        assert!(out.is_empty());
        // A template that overflowed is not one.
        t.keep(&learned(), start(10, 1000), true);
        assert!(!t.merge(&[a(1, 64), a(2, 32), f(1, -64), phase], &s, &mut out));
    }
}
