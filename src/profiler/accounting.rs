//! Turning what the native layer measured into the numbers of a report. Pure functions
//! over plain data, so every rule here is unit-tested without libtorch.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::ffi::BackwardEvent;

/// Intermediate gradients of one iteration: the peak, over each backward pass, of live
/// bytes born in that pass that are not weight gradients.
///
/// `events` are the births (+size) and deaths (-size) logged during backward, in order;
/// a pass is a run of events with the same generation. `grads` holds the block
/// addresses of the weight gradients live now (after backward): a birth is a weight
/// gradient's if it is the last birth at such an address and no death follows it.
/// `grads` maps each address to its own index below `grads.len()` (one look-up an
/// event); `scratch` is reused from one call to the next, so a steady iteration
/// allocates nothing here (a hash set of the gradients decided, rebuilt at every call,
/// cost a fifth of the profiler's instructions on a step of many small ops).
pub fn intermediate_peak(
    events: &[BackwardEvent],
    device: u32,
    grads: &GradIndex,
    scratch: &mut PeakScratch,
) -> u64 {
    // One pass, from the end. A weight gradient's birth is the last event at a
    // gradient's address, if it is a birth: met first from the end, where each gradient
    // is decided. A pass's peak is its total less the least sum of its events after
    // some point (0 after its last): running(t) = total - (the events after t).
    let PeakScratch { decided } = scratch;
    decided.clear();
    decided.resize(grads.len(), false);
    let mut peak: i64 = 0;
    let mut pass = None;
    let mut after: i64 = 0;
    let mut least: i64 = 0;
    for e in events.iter().rev() {
        if e.device != device {
            continue;
        }
        if pass != Some(e.generation) {
            if pass.is_some() {
                peak = peak.max(after - least);
            }
            pass = Some(e.generation);
            after = 0;
            least = 0;
        }
        let mut delta = e.delta;
        if let Some(k) = grads.get(e.ptr) {
            let k = k as usize;
            if !decided[k] {
                decided[k] = true;
                if delta > 0 {
                    delta = 0;
                }
            }
        }
        least = least.min(after);
        after += delta;
    }
    if pass.is_some() {
        peak = peak.max(after - least);
    }
    peak.max(0) as u64
}

/// The weight gradients' block addresses, each with an index of its own (0, 1, ...),
/// and a filter of 4,096 bits over them: most events of a backward log are at other
/// addresses (the activations' gradients), and the filter turns those away in a few
/// instructions, without a look-up in the map.
#[derive(Debug, Clone)]
pub(crate) struct GradIndex {
    map: FxHashMap<u64, u32>,
    filter: [u64; FILTER_WORDS],
}

const FILTER_WORDS: usize = 64;

impl Default for GradIndex {
    fn default() -> Self {
        GradIndex {
            map: FxHashMap::default(),
            filter: [0; FILTER_WORDS],
        }
    }
}

impl GradIndex {
    /// The filter's word and bit for `ptr`: the top 12 bits of a multiplicative hash
    /// (block addresses share their low bits, their alignment).
    fn bit(ptr: u64) -> (usize, u64) {
        let h = ptr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52;
        ((h >> 6) as usize, 1 << (h & 63))
    }

    /// Empties it, keeping the map's room.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.filter = [0; FILTER_WORDS];
    }

    /// Adds `ptr` with the next index; false if it was there already.
    pub(crate) fn insert(&mut self, ptr: u64) -> bool {
        let next = self.map.len() as u32;
        match self.map.entry(ptr) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(next);
                let (w, b) = Self::bit(ptr);
                self.filter[w] |= b;
                true
            }
        }
    }

    /// How many addresses it holds.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The index of `ptr`, if it is a gradient's address.
    pub(crate) fn get(&self, ptr: u64) -> Option<u32> {
        let (w, b) = Self::bit(ptr);
        if self.filter[w] & b == 0 {
            return None;
        }
        self.map.get(&ptr).copied()
    }
}

/// What [`intermediate_peak`] reuses between calls.
#[derive(Debug, Default)]
pub struct PeakScratch {
    decided: Vec<bool>,
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

    fn peak(events: &[BackwardEvent], device: u32, grads: &[u64]) -> u64 {
        let mut index = GradIndex::default();
        for g in grads {
            index.insert(*g);
        }
        intermediate_peak(events, device, &index, &mut PeakScratch::default())
    }

    fn ev(ptr: u64, delta: i64, generation: u32) -> BackwardEvent {
        BackwardEvent {
            ptr,
            delta,
            generation,
            device: 0,
        }
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

    /// The rule as the docs state it, computed the plain way: which births are weight
    /// gradients' (the last event at a gradient's address, a birth), then each pass's
    /// running sum from its start, forward.
    fn peak_by_definition(events: &[BackwardEvent], device: u32, grads: &[u64]) -> u64 {
        let mine: Vec<&BackwardEvent> = events.iter().filter(|e| e.device == device).collect();
        let grad_birth: Vec<bool> = (0..mine.len())
            .map(|i| {
                let e = mine[i];
                grads.contains(&e.ptr)
                    && e.delta > 0
                    && mine[i + 1..].iter().all(|later| later.ptr != e.ptr)
            })
            .collect();
        let (mut peak, mut running, mut pass) = (0i64, 0i64, None);
        for (e, skip) in mine.iter().zip(&grad_birth) {
            if pass != Some(e.generation) {
                pass = Some(e.generation);
                running = 0;
            }
            if !skip {
                running += e.delta;
                peak = peak.max(running);
            }
        }
        peak as u64
    }

    #[test]
    fn the_one_pass_peak_is_the_rule_on_many_random_logs() {
        // xorshift64: random logs without a dependency, the same on every run.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut scratch = PeakScratch::default();
        for _ in 0..2000 {
            let len = next(40) as usize;
            let events: Vec<BackwardEvent> = (0..len)
                .map(|_| BackwardEvent {
                    ptr: 1 + next(8),
                    delta: next(200) as i64 - 80,
                    generation: 7 + next(3) as u32,
                    device: next(4).min(1) as u32,
                })
                .collect();
            let grads: Vec<u64> = (1..=8).filter(|_| next(2) == 0).collect();
            let mut index = GradIndex::default();
            for &g in &grads {
                index.insert(g);
            }
            for device in [0, 1] {
                assert_eq!(
                    intermediate_peak(&events, device, &index, &mut scratch),
                    peak_by_definition(&events, device, &grads),
                    "{events:?} grads {grads:?} device {device}"
                );
            }
        }
    }

    #[test]
    fn other_devices_are_ignored() {
        let e = BackwardEvent {
            ptr: 1,
            delta: 100,
            generation: 7,
            device: 1,
        };
        assert_eq!(peak(&[e], 0, &[]), 0);
        assert_eq!(peak(&[e], 1, &[]), 100);
    }

    #[test]
    fn the_gradient_index_finds_what_it_holds_and_nothing_else() {
        let mut index = GradIndex::default();
        // CPU blocks are 64-byte aligned and CUDA's 512: addresses alike in their low
        // bits, many of them, as a large model's gradients are.
        let held: Vec<u64> = (0..5000u64).map(|i| 0x7f00_0000_0000 + i * 512).collect();
        for &p in &held {
            assert!(index.insert(p));
        }
        assert!(
            !index.insert(held[7]),
            "a second insert of an address adds nothing"
        );
        assert_eq!(index.len(), held.len());
        for (i, &p) in held.iter().enumerate() {
            assert_eq!(index.get(p), Some(i as u32));
        }
        for i in 0..5000u64 {
            assert_eq!(index.get(0x7f00_0000_0000 + i * 512 + 64), None);
            assert_eq!(index.get(0x5500_0000_0000 + i * 64), None);
        }
        index.clear();
        assert_eq!(index.len(), 0);
        assert_eq!(index.get(held[0]), None);
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
