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
    pub(super) fn find_expandable_block(&mut self, kind: PoolKind, size: u64, stream: u64) -> u64 {
        // The stream's own segments: one expandable segment per stream.
        let unmapped: Vec<u64> = self
            .pool(kind)
            .unmapped
            .range((stream, 0)..=(stream, u64::MAX))
            .map(|&(_, addr)| addr)
            .collect();
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
                stream,
            },
        );
        self.pool_mut(kind).unmapped.insert((stream, base));
        base
    }

    /// `map_block`: backs the first `size` bytes of the unmapped block
    /// `to_map` with whole pages, merges it with free neighbours and puts it
    /// in the free set.  Returns its address after merging.
    pub(super) fn map_block(&mut self, to_map: u64, size: u64) -> u64 {
        let (base, block_size, next, kind, stream) = {
            let b = self.block(to_map);
            debug_assert!(!b.mapped && size <= b.size);
            (
                b.expandable.expect("expandable block"),
                b.size,
                b.next,
                b.pool,
                b.stream,
            )
        };
        let page = self.expandable_segments[&base].page;
        // Unmapped blocks start on a page boundary.
        let mapped = size.div_ceil(page) * page;
        debug_assert!(mapped <= block_size);
        self.pool_mut(kind).unmapped.remove(&(stream, to_map));
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
                    stream,
                },
            );
            self.pool_mut(kind).unmapped.insert((stream, rest));
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
        self.pool_mut(kind).free.insert((stream, merged, dst));
        self.add_reserved(mapped);
        dst
    }

    /// `try_allocate_expandable_block`: maps enough pages for `size` at the
    /// lowest possible address and returns the free block that now holds at
    /// least `size` bytes (taken out of the free set).
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        kind: PoolKind,
        size: u64,
        stream: u64,
    ) -> Option<u64> {
        let mut candidate = self.find_expandable_block(kind, size, stream);
        if !self.block(candidate).mapped {
            let to_map = self.block(candidate).size.min(size);
            if self.over_limit(self.pages_of(candidate, to_map)) {
                return None;
            }
            candidate = self.map_block(candidate, to_map);
        }
        while self.block(candidate).size < size {
            let remaining = size - self.block(candidate).size;
            let next = self
                .block(candidate)
                .next
                .expect("free block followed by unmapped space");
            let to_map = remaining.min(self.block(next).size);
            // Pages mapped before stay mapped (free), as in PyTorch.
            if self.over_limit(self.pages_of(next, to_map)) {
                return None;
            }
            candidate = self.map_block(next, to_map);
        }
        let csize = self.block(candidate).size;
        self.pool_mut(kind).free.remove(&(stream, csize, candidate));
        Some(candidate)
    }

    /// Bytes `map_block(addr, size)` maps: whole pages of the block's segment.
    fn pages_of(&self, addr: u64, size: u64) -> u64 {
        let base = self.block(addr).expandable.expect("expandable block");
        let page = self.expandable_segments[&base].page;
        size.div_ceil(page) * page
    }

    /// `unmap_block`: unmaps the whole pages inside the free block `addr`.
    /// Returns the address of the unmapped block, if any page was unmapped.
    pub(super) fn unmap_block(&mut self, addr: u64) -> Option<u64> {
        let (size, prev, next, kind, base, stream) = {
            let b = self.block(addr);
            (
                b.size,
                b.prev,
                b.next,
                b.pool,
                b.expandable.expect("expandable block"),
                b.stream,
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
        self.pool_mut(kind).free.remove(&(stream, size, addr));
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
            stream,
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
                    stream,
                },
            );
            self.pool_mut(kind).free.insert((stream, before, addr));
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
                    stream,
                },
            );
            self.pool_mut(kind).free.insert((stream, after, after_addr));
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
        self.pool_mut(kind).unmapped.insert((stream, dst));
        self.stats.reserved -= unmapped_size;
        Some(dst)
    }

    /// `release_blocks`: frees every unsplit free segment of a pool and unmaps
    /// the free pages of its expandable segments.
    pub(super) fn release_blocks(&mut self, kind: PoolKind) {
        let free: Vec<(u64, u64, u64)> = self.pool(kind).free.iter().copied().collect();
        let mut to_unmap = Vec::new();
        for (stream, size, addr) in free {
            let b = self.block(addr);
            if b.expandable.is_some() {
                to_unmap.push(addr);
            } else if b.prev.is_none() && b.next.is_none() {
                self.pool_mut(kind).free.remove(&(stream, size, addr));
                self.blocks.remove(&addr);
                self.stats.reserved -= size;
                self.stats.segments -= 1;
            }
        }
        for addr in to_unmap {
            if let Some(u) = self.unmap_block(addr) {
                let b = self.block(u);
                if b.prev.is_none() && b.next.is_none() {
                    let (base, stream) = (b.expandable.expect("expandable block"), b.stream);
                    self.pool_mut(kind).unmapped.remove(&(stream, u));
                    self.blocks.remove(&u);
                    self.expandable_segments.remove(&base);
                }
            }
        }
    }

    /// `release_cached_blocks`: every stream's unsplit free segments released and the
    /// free pages of expandable segments unmapped, large pool first (`empty_cache`, and
    /// the last retry of a request before an out-of-memory error).
    pub(super) fn release_cached_blocks(&mut self) {
        self.release_blocks(PoolKind::Large);
        self.release_blocks(PoolKind::Small);
    }

    /// `release_available_cached_blocks`: with `max_split_size_mb` set, the first retry
    /// of a request that would exceed the device releases the stream's oversized cached
    /// blocks (never split, so each is a whole segment): the smallest one that covers
    /// the request (at least `max_split_size`), or else the largest ones down until
    /// their sizes add up to it. Whether it released enough.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        kind: PoolKind,
        size: u64,
        stream: u64,
    ) -> bool {
        let max_split = self.config.max_split_size_bytes();
        if max_split == u64::MAX {
            return false;
        }
        let key = size.max(max_split);
        let release = |a: &mut Self, (s, size, addr): (u64, u64, u64)| {
            a.pool_mut(kind).free.remove(&(s, size, addr));
            a.blocks.remove(&addr);
            a.stats.reserved -= size;
            a.stats.segments -= 1;
        };
        let stream_blocks = (stream, 0, 0)..=(stream, u64::MAX, u64::MAX);
        let first = self
            .pool(kind)
            .free
            .range((stream, key, 0)..=(stream, u64::MAX, u64::MAX))
            .next()
            .copied();
        match first {
            Some(k) if self.block(k.2).expandable.is_none() => {
                release(self, k);
                true
            }
            _ => {
                // Below the key, largest first, while oversized.
                let candidates: Vec<(u64, u64, u64)> = self
                    .pool(kind)
                    .free
                    .range(stream_blocks)
                    .rev()
                    .filter(|k| k.1 < key)
                    .take_while(|k| k.1 >= max_split)
                    .copied()
                    .collect();
                let mut released = 0u64;
                for k in candidates {
                    if released >= key {
                        break;
                    }
                    if self.block(k.2).expandable.is_none() {
                        release(self, k);
                        released += k.1;
                    }
                }
                released >= key
            }
        }
    }
}
