//! What the allocator looks like at one moment: its pools ([`CachingAllocator::pools`])
//! and its segments ([`CachingAllocator::segments`]), for the replay's reports.

use super::*;

impl CachingAllocator {
    /// How the reserved bytes are cut now: what is free inside the segments, by pool,
    /// and the largest free block (a larger request needs a new segment).
    pub fn pools(&self) -> PoolState {
        let sum = |p: &Pool| p.free.iter().map(|(_, size, _)| size).sum::<u64>();
        let largest = |p: &Pool| p.free.iter().map(|(_, size, _)| *size).max().unwrap_or(0);
        PoolState {
            reserved: self.stats.reserved,
            allocated: self.stats.allocated,
            free_small: sum(&self.small),
            free_large: sum(&self.large),
            largest_free: largest(&self.small).max(largest(&self.large)),
        }
    }

    /// Every segment now, in address order: how its bytes are cut, and which callers'
    /// blocks it holds.
    pub fn segments(&self) -> Vec<SegmentState> {
        let ids: HashMap<u64, u64> = self.live.iter().map(|(id, addr)| (*addr, *id)).collect();
        let mut heads: Vec<u64> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.prev.is_none())
            .map(|(a, _)| *a)
            .collect();
        heads.sort_unstable();
        heads
            .into_iter()
            .map(|head| {
                let mut s = SegmentState {
                    small: self.block(head).pool == PoolKind::Small,
                    stream: self.block(head).stream,
                    ..SegmentState::default()
                };
                let mut at = Some(head);
                while let Some(addr) = at {
                    let b = self.block(addr);
                    if b.mapped {
                        s.size += b.size;
                        if b.allocated {
                            s.allocated += b.size;
                            s.live
                                .push((ids.get(&addr).copied().unwrap_or(addr), b.size));
                        } else {
                            s.free += b.size;
                            s.largest_free = s.largest_free.max(b.size);
                        }
                    }
                    at = b.next;
                }
                s
            })
            .filter(|s| s.size > 0)
            .collect()
    }
}
