//! What a recorded run's reserved peak is made of: the segments the replay holds when
//! its reserved bytes first reach their peak, by pool and size, how much of each is
//! free, and which blocks (where they were asked for) kept the free bytes of a segment
//! from being returned or used for a larger request.

use std::collections::{BTreeMap, HashMap};

use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};

use super::{Action, Recording, NO_SITE};
use crate::estimate::{AllocatorConfig, CachingAllocator, PoolState, SegmentState};
use crate::format::bytes;

/// Rows of the table by segment size before the rest are summed.
const SIZE_ROWS: usize = 8;

/// Segments of one pool and size: (count, allocated, free, largest free block).
type SizeRow = (u64, u64, u64, u64);

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
        let replay = |until: usize, sites: &mut HashMap<u64, u32>| {
            let mut alloc = CachingAllocator::new(config.clone());
            let (mut peak, mut at) = (0, None);
            for (i, e) in self.events.iter().enumerate().take(until) {
                match e.action {
                    Action::Alloc => {
                        alloc.malloc(e.addr, e.size);
                        if e.site != NO_SITE {
                            sites.insert(e.addr, e.site);
                        } else {
                            sites.remove(&e.addr);
                        }
                    }
                    Action::FreeCompleted => {
                        alloc.free(e.addr);
                        sites.remove(&e.addr);
                    }
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

impl PeakView {
    /// The segments by pool and size as a table: segments, allocated, free inside, the
    /// largest free block (the large pool first, the sizes with the most free bytes
    /// first; past eight sizes, the rest in one row).
    pub fn table(&self) -> String {
        let mut by: BTreeMap<(bool, u64), SizeRow> = BTreeMap::new();
        for s in &self.segments {
            let row = by.entry((s.small, s.size)).or_default();
            row.0 += 1;
            row.1 += s.allocated;
            row.2 += s.free;
            row.3 = row.3.max(s.largest_free);
        }
        let mut rows: Vec<((bool, u64), SizeRow)> = by.into_iter().collect();
        rows.sort_by_key(|((small, size), (_, _, free, _))| {
            (*small, std::cmp::Reverse(*free), std::cmp::Reverse(*size))
        });
        let mut table = Table::new();
        table
            .load_preset(UTF8_FULL)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(["segment", "count", "allocated", "free", "largest free"]);
        let mut rest: Option<SizeRow> = None;
        for (i, ((small, size), (n, allocated, free, largest))) in rows.iter().enumerate() {
            if i >= SIZE_ROWS {
                let r = rest.get_or_insert((0, 0, 0, 0));
                r.0 += n;
                r.1 += allocated;
                r.2 += free;
                r.3 = r.3.max(*largest);
                continue;
            }
            let name = format!("{}{}", bytes(*size), if *small { " small" } else { "" });
            table.add_row([
                name,
                n.to_string(),
                bytes(*allocated),
                bytes(*free),
                bytes(*largest),
            ]);
        }
        if let Some((n, allocated, free, largest)) = rest {
            table.add_row([
                "other sizes".to_string(),
                n.to_string(),
                bytes(allocated),
                bytes(free),
                bytes(largest),
            ]);
        }
        for c in 1..5 {
            if let Some(col) = table.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        table.to_string()
    }

    /// The smallest request that needed a new segment at the peak, in words: more than
    /// the largest free block (on a GPU with nothing left to reserve, it fails).
    pub fn failing_request_line(&self) -> String {
        format!(
            "a request over {} (the largest free block) needed a new segment then: on a \
             GPU with no memory left, it would have failed",
            bytes(self.pools.largest_free)
        )
    }

    /// The `top` segments with the most free bytes, each in words: its size, what is
    /// allocated and free in it, and where the blocks that split it were asked for
    /// (`sites`: [`Recording::sites`]).
    pub fn split_segments(&self, sites: &[String], top: usize) -> Vec<String> {
        let mut segs: Vec<&SegmentState> = self
            .segments
            .iter()
            .filter(|s| s.free > 0 && s.allocated > 0)
            .collect();
        segs.sort_by_key(|s| std::cmp::Reverse(s.free));
        segs.into_iter()
            .take(top)
            .map(|s| {
                let mut by_site: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
                for (id, size) in &s.live {
                    let site = self
                        .sites
                        .get(id)
                        .and_then(|i| sites.get(*i as usize))
                        .map_or("(no frames recorded)", String::as_str);
                    let e = by_site.entry(site).or_default();
                    e.0 += 1;
                    e.1 += size;
                }
                let mut held: Vec<(&str, (u64, u64))> = by_site.into_iter().collect();
                held.sort_by_key(|(_, (_, b))| std::cmp::Reverse(*b));
                let held: Vec<String> = held
                    .iter()
                    .take(3)
                    .map(|(site, (n, b))| format!("{} in {n} block(s) from {site}", bytes(*b)))
                    .collect();
                format!(
                    "a {} segment{}: {} free (the largest block {}), split by {}{}",
                    bytes(s.size),
                    if s.small { " of the small pool" } else { "" },
                    bytes(s.free),
                    bytes(s.largest_free),
                    held.join("; "),
                    if s.live.len() > 3 { "; ..." } else { "" }
                )
            })
            .collect()
    }
}
