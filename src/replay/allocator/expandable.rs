//! Expandable segments (`expandable_segments:True`): one segment per pool whose virtual
//! range is backed by pages on demand (PyTorch's `try_allocate_expandable_block`,
//! `find_expandable_block`, `map_block`, `unmap_block`), and the release of cached
//! blocks (`release_cached_blocks`).

use super::*;

impl CachingAllocator {
    // ----- expandable segments -----

    pub(super) fn allocatable(&self, addr: Option<u64>) -> bool {
        addr.is_some_and(|a| !self.block(a).allocated)
    }

    pub(super) fn has_available_address_space(&self, start: u64, size: u64) -> bool {
        let mut bytes = 0u64;
        let mut cur = Some(start);
        while bytes < size && self.allocatable(cur) {
            let b = self.block(cur.expect("allocatable block"));
            bytes = bytes.saturating_add(b.size);
            cur = b.next;
        }
        bytes >= size
    }

    /// `find_expandable_block`: the lowest-address run of free and unmapped
    /// blocks that can hold `size`, or a new segment.
    pub(super) fn find_expandable_block(&mut self, kind: PoolKind, size: u64) -> u64 {
        let unmapped: Vec<u64> = self.pool(kind).unmapped.iter().copied().collect();
        for u in unmapped {
            let mut c = u;
            let prev = self.block(u).prev;
            if self.allocatable(prev) {
                c = prev.expect("allocatable block");
            }
            if self.has_available_address_space(c, size) {
                return c;
            }
        }
        let page = match kind {
            PoolKind::Small => K_SMALL_BUFFER,
            PoolKind::Large => self.config.large_segment_size(),
        };
        let virtual_size = EXPANDABLE_VIRTUAL_SIZE.div_ceil(page) * page;
        let base = self.bump_address(virtual_size);
        self.expandable_segments
            .insert(base, ExpandableSegment { page });
        self.blocks.insert(
            base,
            Block {
                size: virtual_size,
                requested: 0,
                allocated: false,
                mapped: false,
                prev: None,
                next: None,
                pool: kind,
                expandable: Some(base),
            },
        );
        self.pool_mut(kind).unmapped.insert(base);
        base
    }

    /// `map_block`: backs the first `size` bytes of the unmapped block
    /// `to_map` with whole pages, merges it with free neighbours and puts it
    /// in the free set.  Returns its address after merging.
    pub(super) fn map_block(&mut self, to_map: u64, size: u64) -> u64 {
        let (base, block_size, next, kind) = {
            let b = self.block(to_map);
            debug_assert!(!b.mapped && size <= b.size);
            (
                b.expandable.expect("expandable block"),
                b.size,
                b.next,
                b.pool,
            )
        };
        let page = self.expandable_segments[&base].page;
        // Unmapped blocks start on a page boundary.
        let mapped = size.div_ceil(page) * page;
        debug_assert!(mapped <= block_size);
        self.pool_mut(kind).unmapped.remove(&to_map);
        self.block_mut(to_map).mapped = true;
        if mapped < block_size {
            let rest = to_map + mapped;
            if let Some(n) = next {
                self.block_mut(n).prev = Some(rest);
            }
            self.blocks.insert(
                rest,
                Block {
                    size: block_size - mapped,
                    requested: 0,
                    allocated: false,
                    mapped: false,
                    prev: Some(to_map),
                    next,
                    pool: kind,
                    expandable: Some(base),
                },
            );
            self.pool_mut(kind).unmapped.insert(rest);
            let b = self.block_mut(to_map);
            b.size = mapped;
            b.next = Some(rest);
        }
        let mut dst = to_map;
        if let Some(p) = self.block(dst).prev {
            dst = self.try_merge_blocks(dst, p);
        }
        if let Some(n) = self.block(dst).next {
            dst = self.try_merge_blocks(dst, n);
        }
        let merged = self.block(dst).size;
        self.pool_mut(kind).free.insert((merged, dst));
        self.add_reserved(mapped);
        dst
    }

    /// `try_allocate_expandable_block`: maps enough pages for `size` at the
    /// lowest possible address and returns the free block that now holds at
    /// least `size` bytes (taken out of the free set).
    pub(super) fn try_allocate_expandable_block(&mut self, kind: PoolKind, size: u64) -> u64 {
        let mut candidate = self.find_expandable_block(kind, size);
        if !self.block(candidate).mapped {
            let to_map = self.block(candidate).size.min(size);
            candidate = self.map_block(candidate, to_map);
        }
        while self.block(candidate).size < size {
            let remaining = size - self.block(candidate).size;
            let next = self
                .block(candidate)
                .next
                .expect("free block followed by unmapped space");
            let to_map = remaining.min(self.block(next).size);
            candidate = self.map_block(next, to_map);
        }
        let csize = self.block(candidate).size;
        self.pool_mut(kind).free.remove(&(csize, candidate));
        candidate
    }

    /// `unmap_block`: unmaps the whole pages inside the free block `addr`.
    /// Returns the address of the unmapped block, if any page was unmapped.
    pub(super) fn unmap_block(&mut self, addr: u64) -> Option<u64> {
        let (size, prev, next, kind, base) = {
            let b = self.block(addr);
            (
                b.size,
                b.prev,
                b.next,
                b.pool,
                b.expandable.expect("expandable block"),
            )
        };
        let page = self.expandable_segments[&base].page;
        let first_page = (addr - base).div_ceil(page);
        let end_page = (addr + size - base) / page;
        if first_page >= end_page {
            return None;
        }
        let unmapped_addr = base + first_page * page;
        let unmapped_size = (end_page - first_page) * page;
        self.pool_mut(kind).free.remove(&(size, addr));
        self.blocks.remove(&addr);

        let before = unmapped_addr - addr;
        let after = size - before - unmapped_size;
        let after_addr = unmapped_addr + unmapped_size;
        let mut u = Block {
            size: unmapped_size,
            requested: 0,
            allocated: false,
            mapped: false,
            prev,
            next,
            pool: kind,
            expandable: Some(base),
        };
        if before > 0 {
            self.blocks.insert(
                addr,
                Block {
                    size: before,
                    requested: 0,
                    allocated: false,
                    mapped: true,
                    prev,
                    next: Some(unmapped_addr),
                    pool: kind,
                    expandable: Some(base),
                },
            );
            self.pool_mut(kind).free.insert((before, addr));
            u.prev = Some(addr);
        } else if let Some(p) = prev {
            self.block_mut(p).next = Some(unmapped_addr);
        }
        if after > 0 {
            self.blocks.insert(
                after_addr,
                Block {
                    size: after,
                    requested: 0,
                    allocated: false,
                    mapped: true,
                    prev: Some(unmapped_addr),
                    next,
                    pool: kind,
                    expandable: Some(base),
                },
            );
            self.pool_mut(kind).free.insert((after, after_addr));
            u.next = Some(after_addr);
            if let Some(n) = next {
                self.block_mut(n).prev = Some(after_addr);
            }
        } else if let Some(n) = next {
            self.block_mut(n).prev = Some(unmapped_addr);
        }
        self.blocks.insert(unmapped_addr, u);

        let mut dst = unmapped_addr;
        if let Some(p) = self.block(dst).prev {
            dst = self.try_merge_blocks(dst, p);
        }
        if let Some(n) = self.block(dst).next {
            dst = self.try_merge_blocks(dst, n);
        }
        self.pool_mut(kind).unmapped.insert(dst);
        self.stats.reserved -= unmapped_size;
        Some(dst)
    }

    /// `release_blocks`: frees every unsplit free segment of a pool and unmaps
    /// the free pages of its expandable segments.
    pub(super) fn release_blocks(&mut self, kind: PoolKind) {
        let free: Vec<(u64, u64)> = self.pool(kind).free.iter().copied().collect();
        let mut to_unmap = Vec::new();
        for (size, addr) in free {
            let b = self.block(addr);
            if b.expandable.is_some() {
                to_unmap.push(addr);
            } else if b.prev.is_none() && b.next.is_none() {
                self.pool_mut(kind).free.remove(&(size, addr));
                self.blocks.remove(&addr);
                self.stats.reserved -= size;
                self.stats.segments -= 1;
            }
        }
        for addr in to_unmap {
            if let Some(u) = self.unmap_block(addr) {
                let b = self.block(u);
                if b.prev.is_none() && b.next.is_none() {
                    let base = b.expandable.expect("expandable block");
                    self.pool_mut(kind).unmapped.remove(&u);
                    self.blocks.remove(&u);
                    self.expandable_segments.remove(&base);
                }
            }
        }
    }
}
