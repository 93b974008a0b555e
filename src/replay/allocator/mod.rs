//! A model of PyTorch's CUDA caching allocator, for one device and its streams.
//!
//! The dry run on libtorch's meta device records the sequence of allocations
//! and frees of a workload (sizes, order, lifetimes).  [`CachingAllocator`]
//! replays that sequence through the same decisions the native CUDA caching
//! allocator makes and reports what `torch.cuda.memory_stats()` would show:
//! allocated bytes (block sizes handed out), reserved bytes (memory obtained
//! from the driver), requested bytes (the original request sizes) and their
//! peaks.
//!
//! # Source
//!
//! Modelled on PyTorch's `c10/cuda/CUDACachingAllocator.cpp`
//! (`DeviceCachingAllocator`), `c10/core/AllocatorConfig.{h,cpp}`
//! (`AcceleratorAllocatorConfig`, `ConfigTokenizer`) and
//! `c10/cuda/CUDAAllocatorConfig.cpp`, version 2.11 (read in the main-branch
//! source of early 2026, from which 2.11 was branched in February 2026).
//! The rules modelled here have been stable through the 2.x releases; the
//! one recent addition is the `large_segment_size_mb` option (January 2026),
//! which makes the former 20 MiB constants (`kLargeBuffer`, and the default of
//! `max_non_split_rounding_mb`) configurable; releases without it reject the
//! key and behave as with the default of 20.
//!
//! # What is modelled
//!
//! Constants (`c10/core/AllocatorConfig.h`):
//!
//! | name             | value   | meaning                                                   |
//! |------------------|---------|-----------------------------------------------------------|
//! | `kMinBlockSize`  | 512 B   | every request is rounded up to a multiple of this         |
//! | `kSmallSize`     | 1 MiB   | rounded requests up to this size use the small pool       |
//! | `kSmallBuffer`   | 2 MiB   | segment size for the small pool                           |
//! | `kLargeBuffer`   | 20 MiB  | segment size for large requests under `kMinLargeAlloc` (the `large_segment_size_mb` option, default 20) |
//! | `kMinLargeAlloc` | 10 MiB  | large requests from here on get their own segment         |
//! | `kRoundLarge`    | 2 MiB   | those segments are rounded up to a multiple of this       |
//!
//! * `round_size`: `max(512, request)` rounded up to a multiple of 512 B, or,
//!   when `roundup_power2_divisions` gives `d > 1` divisions for the size's
//!   power-of-two interval and the size exceeds `512 * d`, rounded up to the
//!   next of `d` equal steps between the surrounding powers of two
//!   (`roundup_power2_next_division`).
//! * pools: rounded size `<= kSmallSize` goes to the small pool, others to
//!   the large pool.  A new segment (`get_allocation_size`) is
//!   `kSmallBuffer` for the small pool, `large_segment_size` (20 MiB) for
//!   sizes below `kMinLargeAlloc`, else the size rounded up to `kRoundLarge`.
//! * `get_free_block`: best fit, i.e. the first free block of the pool in
//!   `(stream, size, address)` order with `size >= request`; then
//!   `max_split_size` vetoes: a request `< max_split_size` never takes a block
//!   `>= max_split_size`, and a request `>= max_split_size` takes a block only
//!   if the block is `< request + max_non_split_rounding_size` (20 MiB by
//!   default).  A veto means a new segment, not a further search.
//! * `should_split`: small pool (or expandable segments): remainder
//!   `>= kMinBlockSize`; large pool: `request < max_split_size` and remainder
//!   `> kSmallSize`.  Unsplit blocks are charged whole to `allocated`.
//! * `free_block` / `try_merge_blocks`: a freed block merges with free
//!   neighbours of the same segment.
//! * `empty_cache` (`release_cached_blocks`): every segment whose single block
//!   is free is released; with expandable segments every fully free page is
//!   unmapped and an expandable segment with nothing mapped is released.
//! * stats: `allocated_bytes` counts block sizes, `reserved_bytes` segment
//!   (or mapped page) sizes, `requested_bytes` the original requests; each
//!   with a peak, updated on every increase; `reset_peaks` sets peak = current.
//! * `expandable_segments:True` (`try_allocate_expandable_block`,
//!   `find_expandable_block`, `map_block`, `unmap_block`): each pool has one
//!   segment with a huge virtual range that is backed by physical pages on
//!   demand; pages are `kSmallBuffer` (2 MiB) in the small pool and
//!   `large_segment_size` (20 MiB) in the large pool.  On a cache miss the
//!   lowest-address free-or-unmapped run that can hold the *rounded request*
//!   (no 20 MiB / 2 MiB segment rounding) is mapped page by page and merged
//!   with the free block before it; reserved grows by the mapped pages.  Every
//!   block of an expandable segment is split when the remainder is at least
//!   512 B.  Best fit treats a free block that borders unmapped space as
//!   being as large as it could grow, so other fitting blocks are preferred
//!   (the `expandable_size` walk in `get_free_block`).  The `max_split_size`
//!   vetoes apply here too; a vetoed request then grows the segment (or takes
//!   the free block that borders unmapped space) instead of getting a new
//!   segment.  `segments` stays 0, as PyTorch's `segment` stat does.
//! * Streams (`malloc_on`): every block has its segment's stream; both pools
//!   order free blocks by stream, then size, then address
//!   (`BlockComparatorSize`), and unmapped ranges by stream, then address
//!   (`BlockComparatorAddress`); `get_free_block` takes a block of the
//!   request's stream only, a split's remainder keeps its stream, and each
//!   stream grows expandable segments of its own (`find_expandable_block`).
//!   A run on several streams reserves the sum of their high-water marks.
//!   `empty_cache` releases every stream's cached segments.
//! * A device limit (`with_device_limit`; none by default): a segment (or
//!   mapped pages) that would exceed it is retried as `malloc` retries: after
//!   `release_available_cached_blocks` (with `max_split_size_mb`: the
//!   stream's smallest oversized cached block that covers the request, or
//!   its largest ones until they add up to it), then after
//!   `release_cached_blocks` (every stream's); then refused.
//!
//! # What is not modelled
//!
//! * More than one device, `record_stream` and its events (the replay of a
//!   history frees a block at `free_completed`), CUDA graph private pools and
//!   `MemPool`s. The replays of the estimate and of a recorded history still
//!   run on one stream (a history on several is marked: `RecordedRun::streams`).
//! * Without a device limit (the default), segments are always obtained.
//!   `per_process_memory_fraction` and `garbage_collection_threshold`
//!   (whose collection only runs when a memory fraction is set) are parsed
//!   and kept but have no effect here.
//! * `backend:cudaMallocAsync` (a different allocator): parsing it is an
//!   error.
//! * Addresses are simulated: each new segment gets a fresh address above
//!   all earlier ones.  Ties between free blocks of equal size go to the lower
//!   address as in PyTorch, but real `cudaMalloc` addresses can come in
//!   another order (for instance after `empty_cache`), so among equal-size
//!   blocks a different one may be chosen than on the GPU.  Sizes and the
//!   totals do not depend on that except through later merges.
//! * An expandable segment's virtual range is 1 TiB here; PyTorch reserves
//!   1.125 x the GPU's memory.  The difference only matters past the GPU's
//!   capacity, which is not modelled.
//! * Requests of 1 EiB or more are refused by PyTorch with an
//!   out-of-memory error; here they are counted (`refused_requests`) and
//!   allocate nothing.
//!
//! The model is split by concern: `config` (the `PYTORCH_CUDA_ALLOC_CONF` parser and
//! the rounding rules), this file (pools, best fit, split, merge, statistics) and
//! `expandable.rs` (expandable segments); the unit tests are in `tests.rs`.

mod config;
mod expandable;
#[cfg(test)]
mod tests;
mod views;

use std::collections::{BTreeSet, HashMap, HashSet};

pub use config::AllocatorConfig;

pub(super) const MIB: u64 = 1024 * 1024;
/// All sizes are rounded to at least this (`kMinBlockSize`).
pub const K_MIN_BLOCK_SIZE: u64 = 512;
/// Largest "small" request (`kSmallSize`).
pub const K_SMALL_SIZE: u64 = MIB;
/// Small-pool segment size and expandable small-pool page size (`kSmallBuffer`).
pub const K_SMALL_BUFFER: u64 = 2 * MIB;
/// Default large segment size (`kLargeBuffer`, `large_segment_size_mb:20`).
pub const K_LARGE_BUFFER: u64 = 20 * MIB;
/// Requests from this size on get a segment of their own (`kMinLargeAlloc`).
pub const K_MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding of those segments (`kRoundLarge`).
pub const K_ROUND_LARGE: u64 = 2 * MIB;

/// Number of power-of-two intervals of `roundup_power2_divisions`
/// (1 MiB .. 64 GiB; index `floor(log2(size)) - 20`, clamped to 0..=15).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// Requests this large are refused by PyTorch (`one_exa_bytes`).
pub(super) const ONE_EXA_BYTES: u64 = 1 << 60;
/// Virtual size given to an expandable segment (see module docs).
pub(super) const EXPANDABLE_VIRTUAL_SIZE: u64 = 1 << 40;
/// Upper bound of `pinned_num_register_threads` (`pinned_max_register_threads`).
pub(super) const PINNED_MAX_REGISTER_THREADS: u64 = 128;

/// What the allocator reports, in bytes (as `torch.cuda.memory_stats()`'s
/// `*.all.current` / `*.all.peak` entries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// `allocated_bytes.all.current`: sizes of the blocks handed out.
    pub allocated: u64,
    /// `reserved_bytes.all.current`: segments (or mapped pages) held.
    pub reserved: u64,
    /// `requested_bytes.all.current`: the original request sizes.
    pub requested: u64,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated: u64,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved: u64,
    /// `requested_bytes.all.peak`.
    pub peak_requested: u64,
    /// `segment.all.current`: segments obtained with cudaMalloc.  Expandable
    /// segments are not counted here, as in PyTorch.
    pub segments: u64,
    /// `allocation.all.current`: live blocks.
    pub allocations: u64,
}

/// How the reserved bytes are cut at one moment ([`CachingAllocator::pools`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated bytes (blocks handed out, whole).
    pub allocated: u64,
    /// Free bytes inside the small pool's segments (requests up to 1 MiB).
    pub free_small: u64,
    /// Free bytes inside the large pool's segments.
    pub free_large: u64,
    /// The largest free block.
    pub largest_free: u64,
}

/// One segment at one moment ([`CachingAllocator::segments`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentState {
    /// In the small pool (blocks of up to 1 MiB, 2 MiB segments).
    pub small: bool,
    /// The stream it was allocated for (as [`CachingAllocator::malloc_on`] was given
    /// it): its free blocks go to requests on that stream only.
    pub stream: u64,
    /// Bytes of the segment backed by memory (an expandable segment's mapped pages).
    pub size: u64,
    /// Bytes of its blocks handed out.
    pub allocated: u64,
    /// Bytes of its free blocks (mapped).
    pub free: u64,
    /// Its largest free block.
    pub largest_free: u64,
    /// Its blocks handed out: the caller's id and the block's size, in address order.
    pub live: Vec<(u64, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolKind {
    Small,
    Large,
}

#[derive(Clone, Debug)]
struct Block {
    size: u64,
    requested: u64,
    allocated: bool,
    /// Backed by memory.  Always true outside expandable segments.
    mapped: bool,
    prev: Option<u64>,
    next: Option<u64>,
    pool: PoolKind,
    /// Base address of the expandable segment the block belongs to.
    expandable: Option<u64>,
    /// The stream the segment was allocated for: a free block is handed out again on
    /// that stream only (every block of a segment has the segment's stream).
    stream: u64,
}

#[derive(Default)]
struct Pool {
    /// Free, mapped blocks ordered like PyTorch's `BlockComparatorSize`: stream,
    /// size, then address.
    free: BTreeSet<(u64, u64, u64)>,
    /// Unmapped ranges of expandable segments, as `BlockComparatorAddress` orders
    /// them: stream, then address.
    unmapped: BTreeSet<(u64, u64)>,
}

#[derive(Clone, Copy, Debug)]
struct ExpandableSegment {
    page: u64,
}

/// Replays allocations and frees through a model of PyTorch's CUDA caching
/// allocator (one device, one stream).  See the module documentation.
pub struct CachingAllocator {
    config: AllocatorConfig,
    blocks: HashMap<u64, Block>,
    small: Pool,
    large: Pool,
    expandable_segments: HashMap<u64, ExpandableSegment>,
    live: HashMap<u64, u64>,
    zero_sized: HashSet<u64>,
    next_address: u64,
    stats: AllocatorStats,
    unknown_frees: u64,
    refused_requests: u64,
    /// The most it may reserve (the device's memory), if any.
    limit: Option<u64>,
}

/// The stream of [`CachingAllocator::malloc`]: the current stream of a run that
/// allocates on one.
pub const DEFAULT_STREAM: u64 = 0;

impl CachingAllocator {
    /// An empty allocator (nothing reserved) with the given settings.
    pub fn new(config: AllocatorConfig) -> Self {
        CachingAllocator {
            config,
            blocks: HashMap::new(),
            small: Pool::default(),
            large: Pool::default(),
            expandable_segments: HashMap::new(),
            live: HashMap::new(),
            zero_sized: HashSet::new(),
            next_address: 1 << 32,
            stats: AllocatorStats::default(),
            unknown_frees: 0,
            refused_requests: 0,
            limit: None,
        }
    }

    /// The same allocator on a device of `bytes`: a new segment that would take
    /// reserved over it is retried after releasing cached blocks, as PyTorch's `malloc`
    /// does before an out-of-memory error ([`CachingAllocator::malloc_on`]). Without
    /// one (the default) every segment is obtained, and the peaks say how much the run
    /// needs.
    pub fn with_device_limit(mut self, bytes: u64) -> Self {
        self.limit = Some(bytes);
        self
    }

    /// The settings this allocator replays with.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Allocates `bytes` for the caller's block `id` (ids are unique among
    /// live blocks; reusing a live id frees its block first); returns the
    /// block size charged to allocated.  `bytes == 0`: no block (PyTorch
    /// returns a null pointer), returns 0, and a later `free(id)` is accepted
    /// silently.
    pub fn malloc(&mut self, id: u64, bytes: u64) -> u64 {
        self.malloc_on(id, bytes, DEFAULT_STREAM)
    }

    /// [`CachingAllocator::malloc`] on `stream`: a free block is reused only by a
    /// request on the stream its segment was allocated for; a request no free block of
    /// its stream fits gets a new segment, even where another stream's cached blocks
    /// would fit it. Under a device limit ([`CachingAllocator::with_device_limit`]) a
    /// segment that would exceed it is retried as PyTorch's `malloc` retries: after
    /// releasing oversized cached blocks of the stream (with `max_split_size_mb`), then
    /// after releasing every stream's cached segments; a request that still does not
    /// fit is refused ([`CachingAllocator::refused_requests`]) and returns 0.
    pub fn malloc_on(&mut self, id: u64, bytes: u64, stream: u64) -> u64 {
        if self.live.contains_key(&id) || self.zero_sized.contains(&id) {
            self.free(id);
        }
        if bytes == 0 {
            self.zero_sized.insert(id);
            return 0;
        }
        if bytes >= ONE_EXA_BYTES {
            self.refused_requests += 1;
            return 0;
        }
        let size = self.config.round_size(bytes);
        let kind = if size <= K_SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let addr = match self.get_free_block(kind, size, stream) {
            Some(addr) => addr,
            None => match self.alloc_block(kind, size, stream).or_else(|| {
                self.release_available_cached_blocks(kind, size, stream)
                    .then(|| self.alloc_block(kind, size, stream))
                    .flatten()
                    .or_else(|| {
                        self.release_cached_blocks();
                        self.alloc_block(kind, size, stream)
                    })
            }) {
                Some(addr) => addr,
                None => {
                    self.refused_requests += 1;
                    return 0;
                }
            },
        };
        let split = self.should_split(addr, size);
        let charged = self.alloc_found_block(addr, size, bytes, split);
        self.live.insert(id, addr);
        charged
    }

    /// Frees block `id`; an unknown id is ignored and counted
    /// ([`CachingAllocator::unknown_frees`]).
    pub fn free(&mut self, id: u64) {
        let addr = match self.live.remove(&id) {
            Some(addr) => addr,
            None => {
                if !self.zero_sized.remove(&id) {
                    self.unknown_frees += 1;
                }
                return;
            }
        };
        let (size, requested) = {
            let b = self.blocks.get_mut(&addr).expect("live block");
            b.allocated = false;
            (b.size, b.requested)
        };
        self.stats.allocated -= size;
        self.stats.requested -= requested;
        self.stats.allocations -= 1;
        self.free_block(addr);
    }

    /// Current values and peaks.
    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    /// Frees of ids that were not live.
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// Requests of 1 EiB or more, and requests that did not fit under the device limit
    /// after the retries (PyTorch raises an out-of-memory error).
    pub fn refused_requests(&self) -> u64 {
        self.refused_requests
    }

    /// `torch.cuda.reset_peak_memory_stats()`: every peak becomes the current
    /// value.
    pub fn reset_peaks(&mut self) {
        self.stats.peak_allocated = self.stats.allocated;
        self.stats.peak_reserved = self.stats.reserved;
        self.stats.peak_requested = self.stats.requested;
    }

    /// `torch.cuda.empty_cache()`: releases every segment that holds no
    /// allocated block; with expandable segments, unmaps every fully free page
    /// and releases segments left with nothing mapped.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    // ----- internals, named after DeviceCachingAllocator's methods -----

    fn pool(&self, kind: PoolKind) -> &Pool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut Pool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn block(&self, addr: u64) -> &Block {
        &self.blocks[&addr]
    }

    fn block_mut(&mut self, addr: u64) -> &mut Block {
        self.blocks.get_mut(&addr).expect("block exists")
    }

    fn add_reserved(&mut self, bytes: u64) {
        self.stats.reserved += bytes;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
    }

    fn bump_address(&mut self, size: u64) -> u64 {
        let addr = self.next_address;
        self.next_address = (addr + size).div_ceil(K_SMALL_BUFFER) * K_SMALL_BUFFER;
        addr
    }

    /// `expandable_size`: a free block that borders unmapped space counts as
    /// large as it could grow.
    fn expandable_size(&self, addr: u64) -> u64 {
        let b = self.block(addr);
        match b.next {
            Some(n) if !self.block(n).mapped => b.size.saturating_add(self.block(n).size),
            _ => b.size,
        }
    }

    fn get_free_block(&mut self, kind: PoolKind, size: u64, stream: u64) -> Option<u64> {
        let expandable_active = self.config.expandable_segments;
        let (_, block_size, addr) = {
            let pool = self.pool(kind);
            // The stream's blocks only (`(*it)->stream != p.stream()`: none).
            let mut it = pool
                .free
                .range((stream, size, 0)..=(stream, u64::MAX, u64::MAX));
            let mut cur = *it.next()?;
            if expandable_active {
                while self.block(cur.2).expandable.is_some() {
                    match it.next() {
                        Some(&next)
                            if self.expandable_size(next.2) < self.expandable_size(cur.2) =>
                        {
                            cur = next;
                        }
                        _ => break,
                    }
                }
            }
            cur
        };
        let max_split = self.config.max_split_size_bytes();
        // Do not return an oversized block for a large request.
        if size < max_split && block_size >= max_split {
            return None;
        }
        // Allow oversized block size to be rounded up but within a limit.
        if size >= max_split
            && block_size >= size.saturating_add(self.config.max_non_split_rounding_bytes())
        {
            return None;
        }
        self.pool_mut(kind).free.remove(&(stream, block_size, addr));
        Some(addr)
    }

    /// `alloc_block`: a new segment for `size` on `stream`; `None` where it would take
    /// reserved over the device limit.
    fn alloc_block(&mut self, kind: PoolKind, size: u64, stream: u64) -> Option<u64> {
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(kind, size, stream);
        }
        let alloc_size = self.config.allocation_size(size);
        if self.over_limit(alloc_size) {
            return None;
        }
        let addr = self.bump_address(alloc_size);
        self.blocks.insert(
            addr,
            Block {
                size: alloc_size,
                requested: 0,
                allocated: false,
                mapped: true,
                prev: None,
                next: None,
                pool: kind,
                expandable: None,
                stream,
            },
        );
        self.stats.segments += 1;
        self.add_reserved(alloc_size);
        Some(addr)
    }

    /// Whether `bytes` more reserved would exceed the device limit.
    fn over_limit(&self, bytes: u64) -> bool {
        self.limit
            .is_some_and(|limit| self.stats.reserved.saturating_add(bytes) > limit)
    }

    fn should_split(&self, addr: u64, size: u64) -> bool {
        let b = self.block(addr);
        let remaining = b.size - size;
        if b.pool == PoolKind::Small || self.config.expandable_segments {
            remaining >= K_MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size_bytes() && remaining > K_SMALL_SIZE
        }
    }

    fn alloc_found_block(&mut self, addr: u64, size: u64, orig_size: u64, split: bool) -> u64 {
        if split {
            let (rest_size, next, kind, expandable, stream) = {
                let b = self.block(addr);
                (b.size - size, b.next, b.pool, b.expandable, b.stream)
            };
            let rest_addr = addr + size;
            if let Some(n) = next {
                self.block_mut(n).prev = Some(rest_addr);
            }
            self.blocks.insert(
                rest_addr,
                Block {
                    size: rest_size,
                    requested: 0,
                    allocated: false,
                    mapped: true,
                    prev: Some(addr),
                    next,
                    pool: kind,
                    expandable,
                    stream,
                },
            );
            self.pool_mut(kind)
                .free
                .insert((stream, rest_size, rest_addr));
            let b = self.block_mut(addr);
            b.size = size;
            b.next = Some(rest_addr);
        }
        let block_size = {
            let b = self.block_mut(addr);
            b.allocated = true;
            b.requested = orig_size;
            b.size
        };
        let s = &mut self.stats;
        s.allocations += 1;
        s.allocated += block_size;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        s.requested += orig_size;
        s.peak_requested = s.peak_requested.max(s.requested);
        block_size
    }

    fn free_block(&mut self, addr: u64) {
        let (prev, next, kind, stream) = {
            let b = self.block(addr);
            (b.prev, b.next, b.pool, b.stream)
        };
        let mut dst = addr;
        if let Some(p) = prev {
            dst = self.try_merge_blocks(dst, p);
        }
        if let Some(n) = next {
            dst = self.try_merge_blocks(dst, n);
        }
        let size = self.block(dst).size;
        self.pool_mut(kind).free.insert((stream, size, dst));
    }

    /// Merges `src` into its neighbour `dst` when `src` is free and in the
    /// same mapped state; neither is in a pool set on entry except `src`.
    /// Returns the (possibly new) address of `dst`.
    fn try_merge_blocks(&mut self, dst: u64, src: u64) -> u64 {
        let (src_size, src_prev, src_next, src_mapped, kind, stream) = {
            let s = self.block(src);
            if s.allocated || s.mapped != self.block(dst).mapped {
                return dst;
            }
            (s.size, s.prev, s.next, s.mapped, s.pool, s.stream)
        };
        let pool = self.pool_mut(kind);
        if src_mapped {
            pool.free.remove(&(stream, src_size, src));
        } else {
            pool.unmapped.remove(&(stream, src));
        }
        self.blocks.remove(&src);
        let mut d = self.blocks.remove(&dst).expect("block exists");
        d.size += src_size;
        let new_addr = if d.prev == Some(src) {
            // [src dst]
            d.prev = src_prev;
            if let Some(p) = src_prev {
                self.block_mut(p).next = Some(src);
            }
            if let Some(n) = d.next {
                self.block_mut(n).prev = Some(src);
            }
            src
        } else {
            // [dst src]
            d.next = src_next;
            if let Some(n) = src_next {
                self.block_mut(n).prev = Some(dst);
            }
            dst
        };
        self.blocks.insert(new_addr, d);
        new_addr
    }
}
