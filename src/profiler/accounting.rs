//! Turning what the native layer measured into the numbers of a report. Pure functions
//! over plain data, so every rule here is unit-tested without libtorch.

use rustc_hash::FxHashSet;

use crate::ffi::{BackwardEvent, TensorBlock};

/// Intermediate gradients of one iteration: the peak, over each backward pass, of live
/// bytes born in that pass that are not weight gradients.
///
/// `events` are the births (+size) and deaths (-size) logged during backward, in order;
/// a pass is a run of events with the same generation. `grad_birth` has a flag an
/// event: whether it is the birth of a weight gradient's block, left out (see
/// [`mark_grad_births`]).
pub fn intermediate_peak(events: &[BackwardEvent], device: u32, grad_birth: &[bool]) -> u64 {
    debug_assert_eq!(events.len(), grad_birth.len());
    let (mut peak, mut running, mut pass) = (0i64, 0i64, None);
    for (e, &skip) in events.iter().zip(grad_birth) {
        if e.device() != device {
            continue;
        }
        if pass != Some(e.generation()) {
            pass = Some(e.generation());
            running = 0;
        }
        if !skip {
            running += e.delta();
            peak = peak.max(running);
        }
    }
    peak as u64
}

/// Marks, in `births` (a flag an event of `log`, this iteration's backward log, whose
/// events of device `slot` are the gradients'), the births of the weight gradients'
/// blocks `grads` as read after backward: a block born in a backward pass knows the
/// place its birth was logged at ([`TensorBlock::birth_in`]). The rule is the one
/// [`intermediate_peak`] always had, "a weight gradient's birth is the last event at its
/// block's address, if that is a birth", found by the block's identity instead of a
/// look-up of every event's address (a map of the
/// gradients' addresses, rebuilt after every `zero_grad`, and its look-ups cost a third
/// of `record_stats` on a step of many small ops). The other defined gradients' blocks
/// (born before this iteration, or not in a backward pass) go to `unborn`. Returns the bytes of the distinct blocks marked: gradients that share a
/// block have one birth.
pub(crate) fn mark_grad_births<'a>(
    log: &[BackwardEvent],
    slot: usize,
    grads: impl Iterator<Item = &'a TensorBlock>,
    births: &mut Vec<bool>,
    unborn: &mut Vec<BlockInfo>,
) -> u64 {
    births.clear();
    births.resize(log.len(), false);
    unborn.clear();
    let mut bytes = 0;
    for g in grads.filter(|g| g.defined) {
        match g.birth_in(log, slot) {
            Some(at) => {
                if !births[at] {
                    births[at] = true;
                    bytes += g.bytes;
                }
            }
            None => unborn.push(BlockInfo {
                base: g.base,
                bytes: g.bytes,
                born_in_optimizer: g.born_in_optimizer(),
            }),
        }
    }
    bytes
}

/// What a report needs to know about one allocation behind a variable or a gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    /// Block identity (storage base address).
    pub base: u64,
    /// Bytes as accounted by the allocator.
    pub bytes: u64,
    /// Born during an optimizer phase (so already inside the optimizer-state counter).
    pub born_in_optimizer: bool,
}

/// Sum of the bytes of distinct blocks (variables that share storage count once).
pub fn distinct_bytes<'a>(blocks: impl IntoIterator<Item = &'a BlockInfo>) -> u64 {
    let mut seen = FxHashSet::default();
    blocks
        .into_iter()
        .filter(|b| seen.insert(b.base))
        .map(|b| b.bytes)
        .sum()
}

/// Bytes of the distinct weight and gradient blocks born in an optimizer phase (a
/// gradient re-created by a `zero_grad` after `step`, say): they are counted among the
/// optimizer phase's live bytes but have their own category.
pub fn optimizer_claimed<'a>(weights_and_grads: impl IntoIterator<Item = &'a BlockInfo>) -> u64 {
    let mut seen = FxHashSet::default();
    weights_and_grads
        .into_iter()
        .filter(|b| b.born_in_optimizer && seen.insert(b.base))
        .map(|b| b.bytes)
        .sum()
}

/// Optimizer state: live bytes born in optimizer phases, less the weights and gradients
/// among them ([`optimizer_claimed`]).
pub fn optimizer_state(optimizer_born_live: i64, claimed: u64) -> u64 {
    (optimizer_born_live.max(0) as u64).saturating_sub(claimed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live gradient block at `base` of device `slot`, as the native layer reads it
    /// after backward: its birth's place in `log` is the last event at its address
    /// there, if that is a birth (a block born in this log), else `stale` (the place
    /// it was logged at in an earlier iteration's log, or 0: none).
    fn grad_block(log: &[BackwardEvent], slot: u32, base: u64, stale: u32) -> TensorBlock {
        let last = log
            .iter()
            .rposition(|e| e.device() == slot && e.ptr() == base)
            .filter(|&i| log[i].delta() > 0);
        TensorBlock {
            base,
            bytes: last.map_or(64, |i| log[i].delta() as u64),
            defined: true,
            tracked: true,
            device: Some(slot as usize),
            birth_log: last.map_or(stale, |i| i as u32 + 1),
            ..TensorBlock::default()
        }
    }

    /// The peak with the gradients at `grads` (addresses) left out, marked as
    /// `record_stats` marks them.
    fn peak(events: &[BackwardEvent], device: u32, grads: &[u64]) -> u64 {
        let blocks: Vec<TensorBlock> = grads
            .iter()
            .map(|&g| grad_block(events, device, g, 0))
            .collect();
        let mut births = Vec::new();
        mark_grad_births(
            events,
            device as usize,
            blocks.iter(),
            &mut births,
            &mut Vec::new(),
        );
        intermediate_peak(events, device, &births)
    }

    fn ev(ptr: u64, delta: i64, generation: u32) -> BackwardEvent {
        BackwardEvent::new(ptr, delta, generation, 0)
    }

    #[test]
    fn weight_gradients_are_excluded_from_the_peak() {
        // a (100) and b (50) are temporaries, g (1000) becomes a weight gradient.
        let events = [
            ev(1, 100, 7),
            ev(2, 1000, 7),
            ev(3, 50, 7),
            ev(1, -100, 7),
            ev(3, -50, 7),
        ];
        let grads = [2];
        assert_eq!(peak(&events, 0, &grads), 150);
        // Without knowing g is a gradient it would count.
        assert_eq!(peak(&events, 0, &[]), 1150);
    }

    #[test]
    fn a_reused_address_is_a_gradient_only_for_its_last_birth() {
        // Address 5 first holds a temporary (freed), then the gradient.
        let events = [ev(5, 300, 7), ev(5, -300, 7), ev(5, 200, 7), ev(6, 10, 7)];
        let grads = [5];
        assert_eq!(peak(&events, 0, &grads), 300);
    }

    #[test]
    fn each_backward_pass_starts_from_zero() {
        // Pass 1 leaves 40 bytes alive past its end (freed later, unlogged).
        let events = [ev(1, 40, 7), ev(2, 30, 9), ev(2, -30, 9)];
        assert_eq!(peak(&events, 0, &[]), 40);
        let events = [ev(1, 10, 7), ev(2, 30, 9), ev(3, 5, 9)];
        assert_eq!(peak(&events, 0, &[]), 35);
    }

    /// The rule computed the plain way, by address: an event of `device` is a weight
    /// gradient's birth if it is a birth at a gradient's address and no later event of
    /// that device is at that address. (How the peak runs over the events the flags
    /// leave is held by the hand-computed tests above.)
    fn births_by_definition(events: &[BackwardEvent], device: u32, grads: &[u64]) -> Vec<bool> {
        (0..events.len())
            .map(|i| {
                let e = &events[i];
                e.device() == device
                    && grads.contains(&e.ptr())
                    && e.delta() > 0
                    && events[i + 1..]
                        .iter()
                        .all(|later| later.device() != device || later.ptr() != e.ptr())
            })
            .collect()
    }

    #[test]
    fn the_marked_births_are_the_rule_on_many_random_logs() {
        // xorshift64: random logs without a dependency, the same on every run.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..2000 {
            // Two devices with address pools of their own (2 to 9 and 102 to 109); an
            // address holds one live block at a time, as an allocator's does. Blocks
            // are born and die in passes 7, 8 and 9, in that order; a death is logged
            // only in the pass of its birth, as the native log does. Some blocks are
            // alive from before the log.
            let mut live: Vec<Option<(u32, i64)>> = vec![None; 2 * 8];
            for b in live.iter_mut() {
                if next(4) == 0 {
                    *b = Some((0, 64));
                }
            }
            let mut events = Vec::new();
            let mut generation = 7u32;
            for _ in 0..next(60) {
                generation = (generation + u32::from(next(12) == 0)).min(9);
                let k = next(16) as usize;
                let (device, ptr) = (k as u32 / 8, 2 + (k as u64 % 8) + 100 * (k as u64 / 8));
                match live[k] {
                    None => {
                        let size = 1 + next(200) as i64;
                        live[k] = Some((generation, size));
                        events.push(BackwardEvent::new(ptr, size, generation, device));
                    }
                    Some((born, size)) => {
                        live[k] = None;
                        if born == generation {
                            events.push(BackwardEvent::new(ptr, -size, generation, device));
                        }
                    }
                }
            }
            for device in [0u32, 1] {
                // Some live blocks are the gradients: those born before this log know
                // a place of an earlier log (any, or none).
                let grads: Vec<u64> = (0..8u64)
                    .filter(|&i| live[device as usize * 8 + i as usize].is_some())
                    .map(|i| 2 + i + 100 * u64::from(device))
                    .filter(|_| next(3) != 0)
                    .collect();
                let blocks: Vec<TensorBlock> = grads
                    .iter()
                    .map(|&g| grad_block(&events, device, g, next(events.len() as u64 + 2) as u32))
                    .collect();
                let (mut births, mut unborn) = (Vec::new(), Vec::new());
                let born_bytes = mark_grad_births(
                    &events,
                    device as usize,
                    blocks.iter(),
                    &mut births,
                    &mut unborn,
                );
                assert_eq!(
                    births,
                    births_by_definition(&events, device, &grads),
                    "{events:?} grads {grads:?} device {device}"
                );
                // Every gradient is marked or unborn, its bytes counted once.
                let marked: u64 = blocks
                    .iter()
                    .filter(|b| !unborn.iter().any(|u| u.base == b.base))
                    .map(|b| b.bytes)
                    .sum();
                assert_eq!(born_bytes, marked);
                assert_eq!(
                    births.iter().filter(|&&b| b).count() + unborn.len(),
                    grads.len()
                );
            }
        }
    }

    #[test]
    fn a_birth_is_found_by_its_place_only_where_the_log_holds_it() {
        let log = [ev(1, 100, 7), ev(2, 50, 7), ev(1, -100, 7), ev(3, 70, 7)];
        let block = |base, birth_log| TensorBlock {
            base,
            bytes: 50,
            defined: true,
            tracked: true,
            device: Some(0),
            birth_log,
            ..TensorBlock::default()
        };
        assert_eq!(block(2, 2).birth_in(&log, 0), Some(1));
        // A place of an earlier log: another address's birth there, a death, past the
        // end, none.
        assert_eq!(block(2, 1).birth_in(&log, 0), None);
        assert_eq!(block(1, 3).birth_in(&log, 0), None);
        assert_eq!(block(2, 9).birth_in(&log, 0), None);
        assert_eq!(block(2, 0).birth_in(&log, 0), None);
        // Another device's log, a block whose birth was not seen, no block.
        assert_eq!(block(2, 2).birth_in(&log, 1), None);
        assert_eq!(
            TensorBlock {
                tracked: false,
                ..block(2, 2)
            }
            .birth_in(&log, 0),
            None
        );
        assert_eq!(
            TensorBlock {
                defined: false,
                ..block(2, 2)
            }
            .birth_in(&log, 0),
            None
        );
        // Two gradients on one block count once; one born before the log is unborn.
        let (mut births, mut unborn) = (Vec::new(), Vec::new());
        let grads = [block(2, 2), block(2, 2), block(9, 0)];
        assert_eq!(
            mark_grad_births(&log, 0, grads.iter(), &mut births, &mut unborn),
            50
        );
        assert_eq!(births, [false, true, false, false]);
        let unborn: Vec<(u64, u64)> = unborn.iter().map(|b| (b.base, b.bytes)).collect();
        assert_eq!(unborn, [(9, 50)]);
    }

    #[test]
    fn other_devices_are_ignored() {
        let e = BackwardEvent::new(1, 100, 7, 1);
        assert_eq!(peak(&[e], 0, &[]), 0);
        assert_eq!(peak(&[e], 1, &[]), 100);
    }

    #[test]
    fn shared_blocks_count_once() {
        let b = |base, bytes| BlockInfo {
            base,
            bytes,
            born_in_optimizer: false,
        };
        assert_eq!(distinct_bytes(&[b(1, 10), b(1, 10), b(2, 5)]), 15);
    }

    #[test]
    fn optimizer_state_leaves_out_gradients_born_in_the_optimizer_phase() {
        let grad = BlockInfo {
            base: 9,
            bytes: 64,
            born_in_optimizer: true,
        };
        let weight = BlockInfo {
            base: 8,
            bytes: 32,
            born_in_optimizer: false,
        };
        assert_eq!(optimizer_claimed(&[grad, weight, grad]), 64);
        assert_eq!(
            optimizer_state(1000, optimizer_claimed(&[grad, weight, grad])),
            936
        );
        assert_eq!(optimizer_state(10, optimizer_claimed(&[grad])), 0);
    }
}
