//! Unit tests of the caching-allocator model, each against the rule as PyTorch's
//! sources state it, worked by hand.

use super::*;

const KIB: u64 = 1024;

fn alloc() -> CachingAllocator {
    CachingAllocator::new(AllocatorConfig::default())
}

fn alloc_with(conf: &str) -> CachingAllocator {
    CachingAllocator::new(AllocatorConfig::parse(conf).expect("valid config"))
}

/// Walks every segment and checks the bookkeeping against the stats.
fn check_invariants(a: &CachingAllocator) {
    let mut allocated = 0;
    let mut requested = 0;
    let mut mapped = 0;
    let mut live = 0;
    let mut segments = 0;
    let mut free_small = BTreeSet::new();
    let mut free_large = BTreeSet::new();
    let mut unmapped_small = BTreeSet::new();
    let mut unmapped_large = BTreeSet::new();
    for (&addr, b) in &a.blocks {
        if let Some(p) = b.prev {
            let pb = &a.blocks[&p];
            assert_eq!(pb.next, Some(addr));
            assert_eq!(p + pb.size, addr, "blocks are contiguous");
            assert!(
                b.allocated || pb.allocated || pb.mapped != b.mapped,
                "adjacent free blocks in the same state are merged"
            );
        } else if b.expandable.is_none() {
            segments += 1;
        }
        if let Some(n) = b.next {
            assert_eq!(a.blocks[&n].prev, Some(addr));
        }
        if b.allocated {
            allocated += b.size;
            requested += b.requested;
            live += 1;
        }
        if b.mapped {
            mapped += b.size;
            if !b.allocated {
                match b.pool {
                    PoolKind::Small => free_small.insert((b.stream, b.size, addr)),
                    PoolKind::Large => free_large.insert((b.stream, b.size, addr)),
                };
            }
        } else {
            match b.pool {
                PoolKind::Small => unmapped_small.insert((b.stream, addr)),
                PoolKind::Large => unmapped_large.insert((b.stream, addr)),
            };
        }
    }
    let s = a.stats();
    assert_eq!(s.allocated, allocated);
    assert_eq!(s.requested, requested);
    assert_eq!(s.reserved, mapped);
    assert_eq!(s.allocations, live);
    assert_eq!(s.segments, segments);
    assert_eq!(a.small.free, free_small);
    assert_eq!(a.large.free, free_large);
    assert_eq!(a.small.unmapped, unmapped_small);
    assert_eq!(a.large.unmapped, unmapped_large);
    assert!(s.peak_allocated >= s.allocated && s.peak_reserved >= s.reserved);
    assert!(s.allocated <= s.reserved && s.requested <= s.allocated);
}

#[test]
fn small_request_rounds_to_512_in_a_2mib_segment() {
    let mut a = alloc();
    // 100 B -> round_size 512 B; small pool; new segment kSmallBuffer = 2 MiB,
    // split because the remainder 2 MiB - 512 B >= 512 B.
    assert_eq!(a.malloc(1, 100), 512);
    let s = a.stats();
    assert_eq!((s.allocated, s.requested, s.reserved), (512, 100, 2 * MIB));
    assert_eq!((s.segments, s.allocations), (1, 1));
    // 513 B -> 1024 B; 1 MiB exactly is still small.
    assert_eq!(a.malloc(2, 513), 1024);
    assert_eq!(a.malloc(3, MIB), MIB);
    assert_eq!(a.stats().reserved, 2 * MIB);
    check_invariants(&a);
}

#[test]
fn small_segments_are_shared_until_full() {
    let mut a = alloc();
    // 700 KiB = 716800 B (a multiple of 512).  Segment 2097152 B:
    // 1st: remainder 1380352; 2nd: remainder 663552 < 716800, so the 3rd
    // needs a second 2 MiB segment.  (Three 600 KiB requests = 1800 KiB
    // would all fit into one 2 MiB segment.)
    for id in 0..2 {
        assert_eq!(a.malloc(id, 700 * KIB), 700 * KIB);
    }
    assert_eq!(a.stats().reserved, 2 * MIB);
    assert_eq!(a.stats().segments, 1);
    a.malloc(2, 700 * KIB);
    assert_eq!(a.stats().reserved, 4 * MIB);
    assert_eq!(a.stats().segments, 2);
    assert_eq!(a.stats().allocated, 3 * 700 * KIB);

    let mut b = alloc();
    for id in 0..3 {
        b.malloc(id, 600 * KIB);
    }
    assert_eq!(b.stats().reserved, 2 * MIB);
    check_invariants(&a);
    check_invariants(&b);
}

#[test]
fn mid_size_requests_share_a_20mib_segment() {
    let mut a = alloc();
    // 3 MiB: large pool, < kMinLargeAlloc -> 20 MiB segment; remainder
    // 17 MiB > 1 MiB -> split.
    assert_eq!(a.malloc(1, 3 * MIB), 3 * MIB);
    assert_eq!(a.stats().reserved, 20 * MIB);
    // The second 3 MiB splits the 17 MiB free block (remainder 14 MiB).
    assert_eq!(a.malloc(2, 3 * MIB), 3 * MIB);
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.segments),
        (6 * MIB, 20 * MIB, 1)
    );
    assert!(a
        .large
        .free
        .contains(&(DEFAULT_STREAM, 14 * MIB, a.live[&2] + 3 * MIB)));
    check_invariants(&a);
}

#[test]
fn unsplit_remainder_is_charged_to_allocated() {
    let mut a = alloc();
    // 19.5 MiB = 20447232 B: >= 10 MiB -> segment rounded to 2 MiB = 20 MiB;
    // remainder 0.5 MiB is not > 1 MiB -> not split, 20 MiB allocated.
    let req = 19 * MIB + MIB / 2;
    assert_eq!(a.malloc(1, req), 20 * MIB);
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.requested, s.reserved),
        (20 * MIB, req, 20 * MIB)
    );
    check_invariants(&a);
}

#[test]
fn large_requests_get_segments_rounded_to_2mib() {
    let mut a = alloc();
    // 12 MiB -> 12 MiB segment (already a multiple of 2 MiB).
    assert_eq!(a.malloc(1, 12 * MIB), 12 * MIB);
    assert_eq!(a.stats().reserved, 12 * MIB);
    // 13 MiB -> 14 MiB segment; remainder 1 MiB is not > 1 MiB -> 14 MiB
    // allocated.
    assert_eq!(a.malloc(2, 13 * MIB), 14 * MIB);
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.segments),
        (26 * MIB, 26 * MIB, 2)
    );
    // 1 MiB + 1 B rounds to 1 MiB + 512 B: large pool, 20 MiB segment.
    assert_eq!(a.malloc(3, MIB + 1), MIB + 512);
    assert_eq!(a.stats().reserved, 46 * MIB);
    check_invariants(&a);
}

#[test]
fn best_fit_takes_the_smallest_fitting_block() {
    let mut a = alloc();
    a.malloc(1, 16 * MIB); // 16 MiB segment
    a.malloc(2, 12 * MIB); // 12 MiB segment
    a.free(1);
    a.free(2);
    assert_eq!(a.stats().reserved, 28 * MIB);
    // 11 MiB: fitting free blocks 12 MiB and 16 MiB -> 12 MiB; remainder
    // 1 MiB not > 1 MiB -> unsplit, 12 MiB allocated, no new segment.
    assert_eq!(a.malloc(3, 11 * MIB), 12 * MIB);
    // 15 MiB takes the 16 MiB block (remainder 1 MiB, unsplit).
    assert_eq!(a.malloc(4, 15 * MIB), 16 * MIB);
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.segments),
        (28 * MIB, 28 * MIB, 2)
    );
    check_invariants(&a);
}

#[test]
fn equal_sizes_are_taken_by_address() {
    let mut a = alloc();
    a.malloc(1, 12 * MIB);
    a.malloc(2, 12 * MIB);
    let (first, second) = (a.live[&1], a.live[&2]);
    assert!(first < second);
    a.free(2);
    a.free(1);
    a.malloc(3, 12 * MIB);
    assert_eq!(a.live[&3], first);
    check_invariants(&a);
}

#[test]
fn freed_neighbours_merge() {
    let mut a = alloc();
    // Five 4 MiB requests fill one 20 MiB segment: remainders 16, 12, 8, 4
    // MiB are split (> 1 MiB); the fifth takes the last 4 MiB exactly.
    for id in 1..=5 {
        assert_eq!(a.malloc(id, 4 * MIB), 4 * MIB);
    }
    assert_eq!((a.stats().reserved, a.stats().segments), (20 * MIB, 1));
    assert!(a.large.free.is_empty());
    // Freeing the 2nd and 3rd leaves one merged 8 MiB block.
    a.free(2);
    a.free(3);
    assert_eq!(a.large.free.len(), 1);
    assert_eq!(a.large.free.iter().next().unwrap().1, 8 * MIB);
    // 7 MiB fits in it (remainder 1 MiB unsplit -> 8 MiB allocated), no new
    // segment.
    assert_eq!(a.malloc(6, 7 * MIB), 8 * MIB);
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.segments),
        (20 * MIB, 20 * MIB, 1)
    );
    // Everything freed merges back into the one 20 MiB block.
    for id in [1, 4, 5, 6] {
        a.free(id);
    }
    assert_eq!(a.large.free.len(), 1);
    assert_eq!(a.large.free.iter().next().unwrap().1, 20 * MIB);
    check_invariants(&a);
}

#[test]
fn max_split_size_rules() {
    // max_split_size_mb:40 (>= 20).
    let mut a = alloc_with("max_split_size_mb:40");
    // 50 MiB -> 50 MiB segment.
    a.malloc(1, 50 * MIB);
    a.free(1);
    // 45 MiB >= 40 MiB: the 50 MiB block is < 45 + 20 MiB -> taken, and not
    // split (request not < max_split_size): 50 MiB allocated.
    assert_eq!(a.malloc(2, 45 * MIB), 50 * MIB);
    a.free(2);
    // 25 MiB < 40 MiB: the best fit (50 MiB) is >= max_split_size -> vetoed;
    // new segment of 26 MiB (25 MiB rounded to 2 MiB).
    assert_eq!(a.malloc(3, 25 * MIB), 26 * MIB);
    assert_eq!(a.stats().reserved, 76 * MIB);
    // A request under max_split_size still splits a 20 MiB segment.
    assert_eq!(a.malloc(4, 3 * MIB), 3 * MIB);
    assert_eq!(a.stats().reserved, 96 * MIB);
    check_invariants(&a);

    let mut b = alloc_with("max_split_size_mb:40");
    b.malloc(1, 80 * MIB);
    b.free(1);
    // 42 MiB >= 40 MiB but 80 MiB >= 42 + 20 MiB -> vetoed, new 42 MiB
    // segment.
    assert_eq!(b.malloc(2, 42 * MIB), 42 * MIB);
    assert_eq!(b.stats().reserved, 122 * MIB);
    // With max_non_split_rounding_mb:40 the 80 MiB block (< 42 + 40) is
    // taken whole.
    let mut c = alloc_with("max_split_size_mb:40,max_non_split_rounding_mb:40");
    c.malloc(1, 80 * MIB);
    c.free(1);
    assert_eq!(c.malloc(2, 42 * MIB), 80 * MIB);
    assert_eq!(c.stats().reserved, 80 * MIB);
    check_invariants(&b);
    check_invariants(&c);
}

#[test]
fn without_max_split_size_large_blocks_are_split() {
    let mut a = alloc();
    a.malloc(1, 80 * MIB);
    a.free(1);
    // Unlimited max_split_size: 42 MiB splits the 80 MiB block.
    assert_eq!(a.malloc(2, 42 * MIB), 42 * MIB);
    assert_eq!(a.malloc(3, 30 * MIB), 30 * MIB);
    assert_eq!(a.stats().reserved, 80 * MIB);
    check_invariants(&a);
}

#[test]
fn expandable_segments_map_pages() {
    let mut a = alloc_with("expandable_segments:True");
    // 3 MiB: maps one 20 MiB page; remainder 17 MiB >= 512 -> split.
    assert_eq!(a.malloc(1, 3 * MIB), 3 * MIB);
    assert_eq!(a.stats().reserved, 20 * MIB);
    // 30 MiB: the free 17 MiB tail is too small; it grows by mapping
    // 13 MiB -> one more 20 MiB page (37 MiB), split: 7 MiB stay free.
    assert_eq!(a.malloc(2, 30 * MIB), 30 * MIB);
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.segments),
        (33 * MIB, 40 * MIB, 0)
    );
    assert_eq!(
        a.live[&2],
        a.live[&1] + 3 * MIB,
        "the segment grew in place"
    );
    // Without expandable segments: 20 MiB + 30 MiB segments.
    let mut b = alloc();
    b.malloc(1, 3 * MIB);
    b.malloc(2, 30 * MIB);
    assert_eq!(b.stats().reserved, 50 * MIB);
    // 13 MiB in a fresh expandable allocator: one 20 MiB page, split
    // (13 MiB allocated, not the 14 MiB unsplit segment).
    let mut c = alloc_with("expandable_segments:True");
    assert_eq!(c.malloc(1, 13 * MIB), 13 * MIB);
    assert_eq!(c.stats().reserved, 20 * MIB);
    // 100 B in the small pool: one 2 MiB page.
    assert_eq!(c.malloc(2, 100), 512);
    assert_eq!(c.stats().reserved, 22 * MIB);
    // 100 MiB: 7 MiB free at the tail, 93 MiB more -> 5 pages (100 MiB).
    assert_eq!(c.malloc(3, 100 * MIB), 100 * MIB);
    assert_eq!(c.stats().reserved, 122 * MIB);
    check_invariants(&a);
    check_invariants(&c);
}

#[test]
fn expandable_best_fit_prefers_blocks_that_cannot_grow() {
    let mut a = alloc_with("expandable_segments:True");
    a.malloc(1, 5 * MIB); // [0,5) of a 20 MiB page
    a.malloc(2, 11 * MIB); // [5,16), free tail [16,20) borders unmapped space
    let start = a.live[&1];
    a.free(1); // free [0,5), next to the allocated block: no merge
    assert_eq!(a.large.free.len(), 2);
    // 4 MiB: the first fit is the 4 MiB tail, but it counts as 4 MiB +
    // the unmapped rest; the 5 MiB block is smaller by that measure.
    assert_eq!(a.malloc(3, 4 * MIB), 4 * MIB);
    assert_eq!(a.live[&3], start);
    let s = a.stats();
    assert_eq!((s.allocated, s.reserved), (15 * MIB, 20 * MIB));
    // 2 MiB: the free blocks are [4,5) (1 MiB, too small) and the tail
    // [16,20); the tail is used and no page is mapped.
    assert_eq!(a.malloc(4, 2 * MIB), 2 * MIB);
    assert_eq!(a.live[&4], start + 16 * MIB);
    assert_eq!(a.stats().reserved, 20 * MIB);
    check_invariants(&a);
}

#[test]
fn expandable_empty_cache_unmaps_free_pages() {
    let mut a = alloc_with("expandable_segments:True");
    a.malloc(1, 3 * MIB); // [0,3)
    a.malloc(2, 30 * MIB); // [3,33), pages [0,40) mapped
    a.free(2); // free [3,40)
    assert_eq!(a.stats().reserved, 40 * MIB);
    // Page [20,40) is wholly free and unmapped; [3,20) stays mapped.
    a.empty_cache();
    assert_eq!(a.stats().reserved, 20 * MIB);
    check_invariants(&a);
    // Growing again maps the page back.
    assert_eq!(a.malloc(3, 30 * MIB), 30 * MIB);
    assert_eq!(a.stats().reserved, 40 * MIB);
    assert_eq!(a.live[&3], a.live[&1] + 3 * MIB);
    check_invariants(&a);
    // All freed: empty_cache releases everything and the segment.
    a.free(1);
    a.free(3);
    a.malloc(4, 100);
    a.free(4);
    a.empty_cache();
    assert_eq!(a.stats().reserved, 0);
    assert!(a.blocks.is_empty() && a.expandable_segments.is_empty());
    assert_eq!(a.stats().peak_reserved, 42 * MIB);
    check_invariants(&a);
}

#[test]
fn expandable_hole_is_refilled_first() {
    let mut a = alloc_with("expandable_segments:True");
    // Three pages worth: A [0,20), B [20,40), C [40,60).
    a.malloc(1, 20 * MIB);
    a.malloc(2, 20 * MIB);
    a.malloc(3, 20 * MIB);
    let start = a.live[&1];
    a.free(2);
    a.empty_cache(); // unmaps [20,40): a hole between A and C
    assert_eq!(a.stats().reserved, 40 * MIB);
    // 10 MiB: no free mapped block; the hole is the lowest unmapped range.
    assert_eq!(a.malloc(4, 10 * MIB), 10 * MIB);
    assert_eq!(a.live[&4], start + 20 * MIB);
    assert_eq!(a.stats().reserved, 60 * MIB);
    check_invariants(&a);
}

#[test]
fn empty_cache_releases_only_fully_free_segments() {
    let mut a = alloc();
    a.malloc(1, 100); // small segment, stays in use
    a.malloc(2, 3 * MIB); // 20 MiB segment X
    a.malloc(3, 3 * MIB); // also in X
    a.malloc(4, 16 * MIB); // X has 14 MiB free: new 16 MiB segment, freed below
    a.malloc(5, 50 * MIB); // 50 MiB segment, stays in use
    a.free(2); // X is still partly used
    a.free(4);
    assert_eq!(a.stats().reserved, (2 + 20 + 16 + 50) * MIB);
    a.empty_cache();
    // Only the 16 MiB segment had no allocated block.
    let s = a.stats();
    assert_eq!((s.reserved, s.segments), ((2 + 20 + 50) * MIB, 3));
    a.free(3);
    a.free(1);
    a.empty_cache();
    assert_eq!((a.stats().reserved, a.stats().segments), (50 * MIB, 1));
    assert_eq!(a.stats().peak_reserved, 88 * MIB);
    check_invariants(&a);
}

#[test]
fn peaks_track_and_reset() {
    let mut a = alloc();
    a.malloc(1, 3 * MIB);
    a.malloc(2, 3 * MIB);
    a.free(1);
    a.free(2);
    a.malloc(3, 100);
    let s = a.stats();
    assert_eq!((s.allocated, s.peak_allocated), (512, 6 * MIB));
    assert_eq!((s.requested, s.peak_requested), (100, 6 * MIB));
    assert_eq!((s.reserved, s.peak_reserved), (22 * MIB, 22 * MIB));
    a.empty_cache(); // releases the 20 MiB segment
    assert_eq!(a.stats().reserved, 2 * MIB);
    a.reset_peaks();
    let s = a.stats();
    assert_eq!(
        (s.peak_allocated, s.peak_requested, s.peak_reserved),
        (512, 100, 2 * MIB)
    );
}

#[test]
fn zero_bytes_and_unknown_frees() {
    let mut a = alloc();
    assert_eq!(a.malloc(1, 0), 0);
    assert_eq!(a.stats(), AllocatorStats::default());
    a.free(1); // null pointer free: silent
    assert_eq!(a.unknown_frees(), 0);
    a.free(1);
    a.free(99);
    assert_eq!(a.unknown_frees(), 2);
    assert_eq!(a.malloc(2, 1 << 60), 0);
    assert_eq!(a.refused_requests(), 1);
    // A live id reused frees its old block first.
    a.malloc(3, 3 * MIB);
    a.malloc(3, 100);
    assert_eq!(a.stats().allocated, 512);
    assert_eq!(a.stats().allocations, 1);
    check_invariants(&a);
}

#[test]
fn roundup_power2_divisions_rounding() {
    let cfg = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
    // 1200 B: 4 divisions but 1200 <= 512 * 4 -> plain rounding to 1536.
    assert_eq!(cfg.round_size(1200), 1536);
    // 3000 B > 2048: between 2048 and 4096 in steps of 512 -> 3072.
    assert_eq!(cfg.round_size(3000), 3072);
    // 5 MiB + 1: between 4 and 8 MiB in steps of 1 MiB -> 6 MiB.
    assert_eq!(cfg.round_size(5 * MIB + 1), 6 * MIB);
    // Powers of two stay.
    assert_eq!(cfg.round_size(4 * MIB), 4 * MIB);

    // [256:8,>:2]: intervals 0..=8 get 8 divisions, 9..=15 get 2.
    let cfg = AllocatorConfig::parse("roundup_power2_divisions:[256:8,>:2]").unwrap();
    let divs = cfg.roundup_power2_divisions.unwrap();
    assert_eq!(divs[..9], [8; 9]);
    assert_eq!(divs[9..], [2; 7]);
    // 300 MiB (interval 8): steps of 32 MiB above 256 MiB -> 320 MiB.
    assert_eq!(cfg.round_size(300 * MIB), 320 * MIB);
    // 600 MiB (interval 9): steps of 256 MiB above 512 MiB -> 768 MiB.
    assert_eq!(cfg.round_size(600 * MIB), 768 * MIB);

    // A leading '>' leaves interval 0 alone (PyTorch fills from
    // last_index + 1).
    let cfg = AllocatorConfig::parse("roundup_power2_divisions:[>:4]").unwrap();
    let divs = cfg.roundup_power2_divisions.unwrap();
    assert_eq!(divs[0], 0);
    assert_eq!(divs[1..], [4; 15]);

    // In the allocator: 5 MiB + 1 with 4 divisions -> a 6 MiB block.
    let mut a = alloc_with("roundup_power2_divisions:4");
    assert_eq!(a.malloc(1, 5 * MIB + 1), 6 * MIB);
    assert_eq!(a.stats().requested, 5 * MIB + 1);
}

#[test]
fn large_segment_size_option() {
    // large_segment_size_mb:32: a 3 MiB request gets a 32 MiB segment.
    let mut a = alloc_with("large_segment_size_mb:32");
    a.malloc(1, 3 * MIB);
    assert_eq!(a.stats().reserved, 32 * MIB);
    // 20 MiB splits the 29 MiB remainder (9 MiB left); 12 MiB
    // (>= kMinLargeAlloc) then gets its own 12 MiB segment.
    a.malloc(2, 20 * MIB);
    assert_eq!(a.stats().reserved, 32 * MIB); // fits in the 29 MiB remainder
    a.malloc(3, 12 * MIB);
    assert_eq!(a.stats().reserved, 44 * MIB);
    // max_split_size_mb must now be >= 32.
    assert!(AllocatorConfig::parse("large_segment_size_mb:32,max_split_size_mb:30").is_err());
    assert!(AllocatorConfig::parse("max_split_size_mb:30,large_segment_size_mb:32").is_err());
    assert!(AllocatorConfig::parse("large_segment_size_mb:32,max_split_size_mb:32").is_ok());
    check_invariants(&a);
}

#[test]
fn config_parses_good_strings() {
    assert_eq!(
        AllocatorConfig::parse("").unwrap(),
        AllocatorConfig::default()
    );
    assert_eq!(
        AllocatorConfig::parse("  ").unwrap(),
        AllocatorConfig::default()
    );
    let c = AllocatorConfig::parse(
        "max_split_size_mb:100, expandable_segments:True,garbage_collection_threshold:0.6,\
         roundup_power2_divisions:[64:8,256:4,1024:4,>:1],",
    )
    .unwrap();
    assert_eq!(c.max_split_size, Some(100 * MIB));
    assert!(c.expandable_segments);
    assert_eq!(c.garbage_collection_threshold, Some(0.6));
    let d = c.roundup_power2_divisions.unwrap();
    assert_eq!(d[..7], [8; 7]);
    assert_eq!(d[7..11], [0, 4, 0, 4]);
    assert_eq!(d[11..], [1; 5]);
    assert_eq!(
        c.not_modelled,
        vec!["garbage_collection_threshold".to_string()]
    );
    let c = AllocatorConfig::parse("max_split_size_mb:20").unwrap();
    assert_eq!(c.max_split_size, Some(20 * MIB));
    let c = AllocatorConfig::parse(
        "backend:native,expandable_segments:False,release_lock_on_cudamalloc:True,\
         pinned_use_cuda_host_register:True,pinned_num_register_threads:8,\
         per_process_memory_fraction:0.5,graph_capture_record_stream_reuse:True",
    )
    .unwrap();
    assert!(!c.expandable_segments);
    assert_eq!(c.per_process_memory_fraction, Some(0.5));
    assert_eq!(c.not_modelled.len(), 5);
    assert_eq!(c.max_non_split_rounding_bytes(), 20 * MIB);
}

#[test]
fn config_rejects_bad_strings() {
    let err = |s: &str| AllocatorConfig::parse(s).unwrap_err().to_string();
    assert_eq!(
        err("max_split_size_mb:abc"),
        "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb:abc is not a number"
    );
    assert!(err("max_split_size_mb:10").contains("must be >= 20"));
    assert!(err("max_split_size_mb:-5").contains("is not a number"));
    assert!(err("expandable_segments:true").contains("True or False"));
    assert!(err("foo:1").contains("unrecognized key 'foo'"));
    assert!(err("garbage_collection_threshold:1.5").contains("(0.0, 1.0)"));
    assert!(err("garbage_collection_threshold:0").contains("(0.0, 1.0)"));
    assert!(err("garbage_collection_threshold:x").contains("is not a number"));
    assert!(err("roundup_power2_divisions:3").contains("power of 2"));
    assert!(err("roundup_power2_divisions:0").contains("power of 2"));
    assert!(err("roundup_power2_divisions:[100:4]").contains("interval 100"));
    assert!(err("roundup_power2_divisions:[64:3]").contains("divisions 3"));
    assert!(err("roundup_power2_divisions:[64:4").contains("']'"));
    assert!(err("backend:cudaMallocAsync").contains("not modelled"));
    assert!(err("backend:other").contains("not a known allocator backend"));
    assert!(err("large_segment_size_mb:10").contains("must be > 10"));
    assert!(err("max_split_size_mb").contains("expected ':'"));
    assert!(err("max_split_size_mb:").contains("missing value"));
    assert!(err("max_split_size_mb:[1:2]").contains("single value"));
    assert!(err("max_split_size_mb:100 expandable_segments:True").contains("expected ','"));
    assert!(err("max_split_size_mb:12abc").contains("is not a number"));
    assert!(err("expandable_segments:True:False").contains("expected ','"));
    assert!(err("per_process_memory_fraction:2").contains("[0.0, 1.0]"));
    assert!(err("pinned_num_register_threads:256").contains("at most 128"));
    assert!(err(",").contains("expected a key"));
}

/// A long random trace: the bookkeeping stays consistent and freeing
/// everything returns allocated/requested to zero.
fn random_trace(conf: &str, events: usize, seed: u64) {
    let mut a = alloc_with(conf);
    let mut state = seed;
    let mut rand = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut live: Vec<u64> = Vec::new();
    let mut next_id = 0u64;
    for step in 0..events {
        if live.is_empty() || rand() % 100 < 55 {
            let bytes = match rand() % 10 {
                0..=4 => rand() % (64 * KIB) + 1,
                5..=6 => rand() % (2 * MIB) + 1,
                7..=8 => rand() % (24 * MIB) + 1,
                _ => rand() % (200 * MIB) + 1,
            };
            a.malloc(next_id, bytes);
            live.push(next_id);
            next_id += 1;
        } else {
            let i = (rand() as usize) % live.len();
            let id = live.swap_remove(i);
            a.free(id);
        }
        if step % 5000 == 0 {
            check_invariants(&a);
        }
        if step % 20011 == 0 {
            a.empty_cache();
        }
    }
    check_invariants(&a);
    for id in live {
        a.free(id);
    }
    let s = a.stats();
    assert_eq!((s.allocated, s.requested, s.allocations), (0, 0, 0));
    check_invariants(&a);
    a.empty_cache();
    assert_eq!(a.stats().reserved, 0);
    assert!(a.blocks.is_empty());
    assert_eq!(a.unknown_frees(), 0);
}

#[test]
fn random_traces_keep_invariants() {
    random_trace("", 100_000, 1);
    random_trace("max_split_size_mb:64", 100_000, 2);
    random_trace("expandable_segments:True", 100_000, 3);
    random_trace(
        "roundup_power2_divisions:[64:8,>:2],max_split_size_mb:128",
        50_000,
        4,
    );
}

#[test]
fn a_million_events_run_quickly() {
    let mut a = alloc();
    let start = std::time::Instant::now();
    for i in 0..500_000u64 {
        a.malloc(i, (i % 97 + 1) * 4096 + (i % 7) * 3 * MIB);
        if i >= 64 {
            a.free(i - 64);
        }
    }
    assert!(a.stats().peak_allocated > 0);
    assert!(start.elapsed().as_secs() < 20);
}

/// `segments()`: a 6 MiB request takes a 20 MiB segment (requests from 1 to 10 MiB share
/// one) and splits it; a 1 KiB one takes a 2 MiB small segment. Freed, the 6 MiB block
/// merges back: one free 20 MiB block.
#[test]
fn segments_show_how_each_is_cut_and_whose_blocks_it_holds() {
    let mut a = alloc();
    a.malloc(7, 6 * MIB);
    a.malloc(8, KIB);
    let mut cut = a.segments();
    cut.sort_by_key(|s| s.small);
    let seg = |small, size, allocated, free, live| SegmentState {
        small,
        stream: 0,
        size,
        allocated,
        free,
        largest_free: free,
        live,
    };
    assert_eq!(
        cut,
        [
            seg(false, 20 * MIB, 6 * MIB, 14 * MIB, vec![(7, 6 * MIB)]),
            seg(true, 2 * MIB, KIB, 2 * MIB - KIB, vec![(8, KIB)]),
        ]
    );
    a.free(7);
    let large: Vec<(u64, u64, u64)> = a
        .segments()
        .into_iter()
        .filter(|s| !s.small)
        .map(|s| (s.size, s.free, s.largest_free))
        .collect();
    assert_eq!(large, [(20 * MIB, 20 * MIB, 20 * MIB)]);
}

// ----- streams (`CUDACachingAllocator.cpp`: "Allocations are associated with a stream.
// Once freed, blocks can be re-allocated on the same stream, but not on any other
// stream."; `get_free_block` returns no block of another stream; a split's remainder
// keeps the block's stream; `release_cached_blocks` on the last retry and in
// `empty_cache`) -----

const A: u64 = 7;
const B: u64 = 9;

#[test]
fn a_block_freed_on_one_stream_is_not_reused_on_another() {
    let mut a = alloc();
    // 4 MiB: a 20 MiB segment for stream A, split.
    assert_eq!(a.malloc_on(1, 4 * MIB, A), 4 * MIB);
    a.free(1);
    // The same request on B: A's free 20 MiB are not B's; a second segment.
    a.malloc_on(2, 4 * MIB, B);
    assert_eq!(a.stats().reserved, 40 * MIB);
    // Back on A: A's segment again, nothing new.
    a.malloc_on(3, 4 * MIB, A);
    assert_eq!(a.stats().reserved, 40 * MIB);
    // The small pool keys by stream too: 100 B on A, then on B: two 2 MiB segments.
    a.malloc_on(4, 100, A);
    a.free(4);
    a.malloc_on(5, 100, B);
    assert_eq!(a.stats().reserved, 44 * MIB);
    check_invariants(&a);
}

#[test]
fn a_split_remainder_keeps_its_stream() {
    let mut a = alloc();
    // A's 4 MiB leaves 16 MiB free in A's segment.
    a.malloc_on(1, 4 * MIB, A);
    // 8 MiB on B does not take A's remainder: B's own 20 MiB segment.
    a.malloc_on(2, 8 * MIB, B);
    assert_eq!(a.stats().reserved, 40 * MIB);
    // 8 MiB on A fits A's remainder: nothing new.
    a.malloc_on(3, 8 * MIB, A);
    assert_eq!(a.stats().reserved, 40 * MIB);
    assert_eq!(
        a.live[&3],
        a.live[&1] + 4 * MIB,
        "in A's segment, after block 1"
    );
    check_invariants(&a);
}

#[test]
fn streams_reserve_the_sum_of_their_high_water_marks() {
    // The same 100 MiB, allocated and freed in turn on two streams: each stream keeps
    // its own segment, where one stream reuses one.
    let mut two = alloc();
    let mut one = alloc();
    for i in 0..4u64 {
        let stream = if i % 2 == 0 { A } else { B };
        two.malloc_on(i, 100 * MIB, stream);
        two.free(i);
        one.malloc(i, 100 * MIB);
        one.free(i);
    }
    assert_eq!(two.stats().peak_reserved, 200 * MIB);
    assert_eq!(one.stats().peak_reserved, 100 * MIB);
    // `malloc` is the default stream's.
    let mut d = alloc();
    d.malloc(1, 100 * MIB);
    d.free(1);
    d.malloc_on(2, 100 * MIB, DEFAULT_STREAM);
    assert_eq!(d.stats().peak_reserved, 100 * MIB);
    check_invariants(&two);
}

#[test]
fn empty_cache_releases_every_streams_cached_segments() {
    let mut a = alloc();
    a.malloc_on(1, 100 * MIB, A);
    a.malloc_on(2, 100 * MIB, B);
    a.malloc_on(3, 30 * MIB, B);
    a.free(1);
    a.free(2);
    a.empty_cache();
    // Only B's 30 MiB block, still allocated, keeps its segment.
    assert_eq!(a.stats().reserved, 30 * MIB);
    check_invariants(&a);
}

#[test]
fn the_last_retry_releases_other_streams_cached_segments() {
    // A device of 150 MiB: A caches 100 MiB; B's 100 MiB would take reserved to 200 MiB,
    // so the retry releases every stream's unsplit cached segments and allocates.
    let mut a = alloc().with_device_limit(150 * MIB);
    a.malloc_on(1, 100 * MIB, A);
    a.free(1);
    assert_eq!(a.malloc_on(2, 100 * MIB, B), 100 * MIB);
    let s = a.stats();
    assert_eq!((s.reserved, s.peak_reserved), (100 * MIB, 100 * MIB));
    assert_eq!(a.refused_requests(), 0);
    // A segment split by a live block is not released: A's 4 MiB keeps its 20 MiB
    // segment, and 140 MiB on B does not fit beside B's 100 MiB and it: refused.
    a.malloc_on(3, 4 * MIB, A);
    assert_eq!(a.malloc_on(4, 140 * MIB, B), 0);
    assert_eq!(a.refused_requests(), 1);
    assert_eq!(a.stats().reserved, 120 * MIB);
    // Without a limit the same run reserves both segments.
    let mut u = alloc();
    u.malloc_on(1, 100 * MIB, A);
    u.free(1);
    u.malloc_on(2, 100 * MIB, B);
    assert_eq!(u.stats().reserved, 200 * MIB);
    check_invariants(&a);
}

#[test]
fn with_max_split_size_the_first_retry_releases_the_streams_oversized_blocks() {
    // max_split_size_mb:100 on a 400 MiB device. A caches an oversized 300 MiB block,
    // B a 50 MiB one. 150 MiB on A: the 300 MiB block is >= 150 + 20 MiB, not taken;
    // a new 150 MiB segment would take reserved to 500 MiB. The first retry releases
    // A's smallest oversized block that covers the request (300 MiB) and allocates:
    // B's 50 MiB stay (the last retry, which would release them too, is not reached).
    let mut a = alloc_with("max_split_size_mb:100").with_device_limit(400 * MIB);
    a.malloc_on(1, 300 * MIB, A);
    a.malloc_on(2, 50 * MIB, B);
    a.free(1);
    a.free(2);
    assert_eq!(a.malloc_on(3, 150 * MIB, A), 150 * MIB);
    assert_eq!(a.stats().reserved, 200 * MIB);
    // No oversized block covers 350 MiB: the largest ones go, down while oversized,
    // until they add up to it; here none is left on A, so the last retry releases B's
    // 50 MiB, and 250 MiB beside A's live 150 MiB fits the 400 MiB.
    assert_eq!(a.malloc_on(4, 250 * MIB, A), 250 * MIB);
    assert_eq!(a.stats().reserved, 400 * MIB);
    check_invariants(&a);
}

#[test]
fn expandable_segments_are_one_per_stream() {
    let mut a = alloc_with("expandable_segments:True");
    // 3 MiB on A maps A's first 20 MiB page; 3 MiB on B cannot grow A's segment: B's
    // own segment, its own page.
    a.malloc_on(1, 3 * MIB, A);
    a.malloc_on(2, 3 * MIB, B);
    assert_eq!(a.expandable_segments.len(), 2);
    assert_eq!(a.stats().reserved, 40 * MIB);
    // A's free 17 MiB are not B's: 20 MiB more on B maps one more page of B's (its free
    // 17 MiB tail grows by 3 MiB into a second page).
    a.malloc_on(3, 20 * MIB, B);
    assert_eq!(a.stats().reserved, 60 * MIB);
    assert_eq!(
        a.live[&3],
        a.live[&2] + 3 * MIB,
        "B's segment grew in place"
    );
    // Under a device limit, pages that would exceed it are not mapped: refused after
    // the retries (nothing of A's is free whole to unmap).
    let mut l = alloc_with("expandable_segments:True").with_device_limit(40 * MIB);
    l.malloc_on(1, 3 * MIB, A);
    l.malloc_on(2, 3 * MIB, B);
    assert_eq!(l.malloc_on(3, 20 * MIB, B), 0);
    assert_eq!(l.refused_requests(), 1);
    check_invariants(&a);
    check_invariants(&l);
}

#[test]
fn a_segment_says_the_stream_it_was_made_for() {
    // A request on stream 3 that no free block of stream 3 fits gets a segment of its
    // own, for stream 3, beside stream 0's cached one.
    let mut a = alloc();
    a.malloc(1, 6 * MIB);
    a.free(1);
    a.malloc_on(2, 6 * MIB, 3);
    let mut streams: Vec<(u64, u64, u64)> = a
        .segments()
        .iter()
        .map(|s| (s.stream, s.allocated, s.free))
        .collect();
    streams.sort_unstable();
    assert_eq!(streams, [(0, 0, 20 * MIB), (3, 6 * MIB, 14 * MIB)]);
}
