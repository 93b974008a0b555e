//! What a recorded run's reserved peak is made of: the segments the replay holds when
//! its reserved bytes first reach their peak, by pool and size, how much of each is
//! free, and which blocks (where they were asked for) kept the free bytes of a segment
//! from being returned or used for a larger request.

use std::collections::HashMap;

use super::Recording;
use crate::estimate::{AllocatorConfig, CachingAllocator, PoolState, SegmentState};
use crate::events::EventKind;
use crate::replay::{TRANSIENT_ID, WORKSPACE_ID};

/// The replay of a recorded run at its reserved peak ([`Recording::at_reserved_peak`]).
#[derive(Debug, Clone)]
pub struct PeakView {
    /// How the reserved bytes are cut.
    pub pools: PoolState,
    /// Every segment, in address order; a block's id is its recorded address.
    pub segments: Vec<SegmentState>,
    /// Where each block live at the peak was asked for (an index into
    /// [`Recording::sites`]), by its recorded address; blocks without one left out.
    pub sites: HashMap<u64, u32>,
    /// The event ([`Recording::events`], 0-based) at which reserved first reached its
    /// peak.
    pub event: usize,
}

impl Recording {
    /// The replay under `config` when its reserved bytes first reach their peak; `None`
    /// for a history that reserves nothing.
    pub fn at_reserved_peak(&self, config: &AllocatorConfig) -> Option<PeakView> {
        // The one replay's events (by stream, the history's releases of the cache, a
        // captured history's workspaces and kernels' buffers as the replay takes them).
        let gpu = self.workspace_gpu();
        let options = crate::estimate::Options {
            allocator: config.clone(),
            gpu,
            ..Default::default()
        };
        let device = options.device();
        let replay = |until: usize, sites: &mut HashMap<u64, u32>| {
            let mut alloc = CachingAllocator::new(config.clone());
            let (mut peak, mut at) = (0, None);
            let (mut workspaces, mut transients) = ([false; 4], 0u64);
            for (i, e) in self.replay_events_at().take_while(|(i, _)| *i < until) {
                match e.kind {
                    EventKind::Workspace { lt } => {
                        for (slot, size) in device.workspace_wants(lt, e.phase) {
                            if !workspaces[slot] && size > 0 {
                                workspaces[slot] = true;
                                alloc.malloc_on(WORKSPACE_ID + slot as u64, size, 0);
                            }
                        }
                    }
                    EventKind::Transient { .. } if e.value > 0 => {
                        transients += 1;
                        let id = TRANSIENT_ID + transients;
                        alloc.malloc_on(id, e.value as u64, 0);
                        if alloc.stats().reserved > peak {
                            peak = alloc.stats().reserved;
                            at = Some(i);
                        }
                        alloc.free(id);
                        continue;
                    }
                    EventKind::Alloc { stream } => {
                        alloc.malloc_on(e.ptr, e.value as u64, u64::from(stream));
                        if e.aux > 0 {
                            sites.insert(e.ptr, e.aux as u32 - 1);
                        } else {
                            sites.remove(&e.ptr);
                        }
                    }
                    EventKind::Free => {
                        alloc.free(e.ptr);
                        sites.remove(&e.ptr);
                    }
                    EventKind::Release => alloc.empty_cache(),
                    _ => continue,
                }
                if alloc.stats().reserved > peak {
                    peak = alloc.stats().reserved;
                    at = Some(i);
                }
            }
            (alloc, at)
        };
        let (_, at) = replay(self.events.len(), &mut HashMap::new());
        let event = at?;
        let mut sites = HashMap::new();
        let (alloc, _) = replay(event + 1, &mut sites);
        Some(PeakView {
            pools: alloc.pools(),
            segments: alloc.segments(),
            sites,
            event,
        })
    }
}
