//! Recorded runs as a person reads them: the replays' peaks under each allocator
//! setting and which fits a budget (`tch-memprof replay`, and `plan` of a recorded run),
//! what the reserved peak is made of, and a prediction held to the recorded run it
//! predicted (`estimate --compare`). Sizes in the crate's units (`1.50 MiB`).

use std::collections::BTreeMap;

use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};

use crate::estimate::recorded::{PeakView, Peaks, RecordedRun};
use crate::estimate::{Comparison, SegmentState};
use crate::format::bytes;

/// Rows of the table by segment size before the rest are summed.
const SIZE_ROWS: usize = 8;

/// Segments of one pool and size: (count, allocated, free, largest free block).
type SizeRow = (u64, u64, u64, u64);

/// Requests shown per side of a divergence.
const SHOWN: usize = 4;

/// The first of `rows` (an allocator setting as `PYTORCH_CUDA_ALLOC_CONF` reads it, and
/// the peaks of the recorded run replayed under it; the run's own setting first, then
/// the others, the cheapest change first) whose peak reserved is within `budget`, in
/// words; `None` when none is.
pub fn cheapest_fit(rows: &[(String, Peaks)], budget: u64) -> (Option<usize>, String) {
    let fits = rows.iter().position(|(_, p)| p.reserved <= budget);
    let line = match fits {
        Some(0) => format!(
            "it fits {} as it ran: peak reserved {}, {} to spare",
            bytes(budget),
            bytes(rows[0].1.reserved),
            bytes(budget - rows[0].1.reserved)
        ),
        Some(i) => format!(
            "it fits {} with PYTORCH_CUDA_ALLOC_CONF={}: peak reserved {} (as it ran: {}), \
             {} to spare",
            bytes(budget),
            rows[i].0,
            bytes(rows[i].1.reserved),
            bytes(rows[0].1.reserved),
            bytes(budget - rows[i].1.reserved)
        ),
        None => {
            let best = rows
                .iter()
                .min_by_key(|(_, p)| p.reserved)
                .map_or((String::new(), 0), |(c, p)| (c.clone(), p.reserved));
            format!(
                "no allocator setting tried makes it fit {}: the smallest peak reserved is {} \
                 ({}); the allocated peak itself is {}",
                bytes(budget),
                bytes(best.1),
                if best.0.is_empty() {
                    "as it ran".to_string()
                } else {
                    best.0
                },
                bytes(rows.first().map_or(0, |(_, p)| p.allocated))
            )
        }
    };
    (fits, line)
}

/// `✓ 1.20 GiB left` or `✗ 300.00 MiB over`: a peak reserved against a budget.
pub fn fits_cell(peak_reserved: u64, budget: u64) -> String {
    if peak_reserved <= budget {
        format!("✓ {} left", bytes(budget - peak_reserved))
    } else {
        format!("✗ {} over", bytes(peak_reserved - budget))
    }
}

/// The recorded peaks and the replays' as a table (a row per allocator setting, the
/// recorded one first), with a `fits` column against `budget`. `replays`: each setting
/// as `PYTORCH_CUDA_ALLOC_CONF` reads it with its replay's peaks, the run's own first
/// (named "replayed (as recorded: ...)"). `captured`: the history was captured without
/// a GPU, its own row has no segment (no fits mark).
pub fn table(
    recorded: Peaks,
    replays: &[(String, Peaks)],
    budget: Option<u64>,
    captured: bool,
) -> String {
    let mut t = Table::new();
    let mut header = vec!["allocator settings", "peak allocated", "peak reserved"];
    if budget.is_some() {
        header.push("fits");
    }
    t.load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    let named = replays.iter().enumerate().map(|(i, (conf, p))| {
        let name = match (i, conf.is_empty()) {
            (0, true) => "replayed (as recorded: default)".to_string(),
            (0, false) => format!("replayed (as recorded: {conf})"),
            _ => conf.clone(),
        };
        (name, *p)
    });
    let first = if captured {
        "captured (no segment, no workspace)"
    } else {
        "recorded"
    };
    let rows = std::iter::once((first.to_string(), recorded)).chain(named);
    for (i, (name, p)) in rows.enumerate() {
        let mut row = vec![name, bytes(p.allocated), bytes(p.reserved)];
        if let Some(b) = budget {
            row.push(if captured && i == 0 {
                "-".to_string()
            } else {
                fits_cell(p.reserved, b)
            });
        }
        t.add_row(row);
    }
    for c in 1..4 {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    crate::report::keep_words(&mut t);
    t.to_string()
}

/// What the reserved peak is made of, in one line: allocated, free inside the
/// segments by pool, the largest free block, and the request that made the last
/// segment.
pub(crate) fn fragmentation_line(run: &RecordedRun) -> Option<String> {
    let (p, request) = run.at_reserved_peak?;
    Some(format!(
        "at the peak reserved ({}): {} allocated, {} free inside segments (small pool \
         {}, large pool {}), the largest free block {}; the last segment was made for \
         a request of {}{}",
        bytes(p.reserved),
        bytes(p.allocated),
        bytes(p.free_small + p.free_large),
        bytes(p.free_small),
        bytes(p.free_large),
        bytes(p.largest_free),
        bytes(request),
        if request <= 1 << 20 {
            " (the small pool's, of 2 MiB segments)"
        } else {
            ""
        }
    ))
}

/// The segments by pool and size as a table: segments, allocated, free inside, the
/// largest free block (the large pool first, the sizes with the most free bytes
/// first; past eight sizes, the rest in one row).
pub(crate) fn peak_table(v: &PeakView) -> String {
    let mut by: BTreeMap<(bool, u64), SizeRow> = BTreeMap::new();
    for s in &v.segments {
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
    crate::report::keep_words(&mut table);
    table.to_string()
}

/// The segments at the peak reserved by the stream they were made for (`ids`: each
/// stream's recorded id, by the replay's index): what each stream holds, and the free
/// bytes in its segments, which no request on another stream can use. `None` for one
/// stream.
pub(crate) fn streams_table(v: &PeakView, ids: &[u64]) -> Option<String> {
    if ids.len() < 2 {
        return None;
    }
    // stream index -> (segments, reserved, allocated, free)
    let mut by: BTreeMap<u64, (u64, u64, u64, u64)> = BTreeMap::new();
    for s in &v.segments {
        let row = by.entry(s.stream).or_default();
        row.0 += 1;
        row.1 += s.size;
        row.2 += s.allocated;
        row.3 += s.free;
    }
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(["stream", "segments", "reserved", "allocated", "free"]);
    for (stream, (n, reserved, allocated, free)) in by {
        let name = match ids.get(stream as usize) {
            Some(0) => "default".to_string(),
            Some(id) => format!("{id:#x}"),
            None => stream.to_string(),
        };
        table.add_row([
            name,
            n.to_string(),
            bytes(reserved),
            bytes(allocated),
            bytes(free),
        ]);
    }
    for c in 1..5 {
        if let Some(col) = table.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    crate::report::keep_words(&mut table);
    Some(table.to_string())
}

/// The smallest request that needed a new segment at the peak, in words: more than
/// the largest free block (on a GPU with nothing left to reserve, it fails).
pub(crate) fn failing_request_line(v: &PeakView) -> String {
    format!(
        "a request over {} (the largest free block) needed a new segment then: on a \
         GPU with no memory left, it would have failed",
        bytes(v.pools.largest_free)
    )
}

/// The `top` segments with the most free bytes, each in words: its size, what is
/// allocated and free in it, and where the blocks that split it were asked for
/// (`sites`: [`Recording::sites`](crate::estimate::recorded::Recording::sites)).
pub(crate) fn split_segments(v: &PeakView, sites: &[String], top: usize) -> Vec<String> {
    let mut segs: Vec<&SegmentState> = v
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
                let site = v
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

/// The comparison in words: the counts and peaks, the first `top` divergences, the
/// ops where the bytes differ most.
pub(crate) fn comparison_text(c: &Comparison, top: usize) -> String {
    let mut out = String::new();
    let pct = |p: u64, r: u64| {
        if r == 0 {
            "n/a".to_string()
        } else {
            format!("{:+.2}%", (p as f64 / r as f64 - 1.0) * 100.0)
        }
    };
    out.push_str(&format!(
        "peak allocated: recorded {}, predicted {} ({})\n",
        bytes(c.recorded.allocated),
        bytes(c.predicted.allocated),
        pct(c.predicted.allocated, c.recorded.allocated)
    ));
    out.push_str(&format!(
        "peak reserved: recorded {}, predicted {} ({})\n",
        bytes(c.recorded.reserved),
        bytes(c.predicted.reserved),
        pct(c.predicted.reserved, c.recorded.reserved)
    ));
    out.push_str(&format!(
        "requests: {} recorded, {} predicted; {} the same size in the same order \
         (the {} weights' in any order); {} place(s) where they part\n",
        c.recorded_requests,
        c.predicted_requests,
        c.matched,
        c.weights_matched,
        c.divergences.len()
    ));
    for (i, d) in c.divergences.iter().take(top).enumerate() {
        out.push_str(&format!(
            "{}. at recorded request {}: {}{}\n",
            i + 1,
            d.recorded_at,
            if d.net_bytes() >= 0 { "+" } else { "-" },
            bytes(d.net_bytes().unsigned_abs())
        ));
        if !d.recorded.is_empty() {
            out.push_str(&format!("   recorded only: {}\n", list(&d.recorded)));
        }
        if !d.predicted.is_empty() {
            let sizes: Vec<u64> = d.predicted.iter().map(|(b, _)| *b).collect();
            out.push_str(&format!(
                "   predicted only: {} in {}\n",
                list(&sizes),
                d.predicted[0].1
            ));
        }
    }
    if c.divergences.len() > top {
        out.push_str(&format!(
            "({} more places where they part)\n",
            c.divergences.len() - top
        ));
    }
    let ops = c.by_op();
    if !ops.is_empty() {
        out.push_str("by op (predicted only / recorded only):\n");
        for (op, p, r) in ops.iter().take(top.max(1)) {
            out.push_str(&format!("   {op}: {} / {}\n", bytes(*p), bytes(*r)));
        }
    }
    out
}

/// Sizes as a short list: the first few, then how many more.
fn list(sizes: &[u64]) -> String {
    let mut parts: Vec<String> = sizes.iter().take(SHOWN).map(|b| bytes(*b)).collect();
    if sizes.len() > SHOWN {
        parts.push(format!("and {} more", sizes.len() - SHOWN));
    }
    parts.join(", ")
}

/// The streams of a history, said where there is more than one (`, on 3 CUDA
/// streams`): each is replayed with its own free blocks, as PyTorch keeps them.
pub(crate) fn on_streams(streams: usize) -> String {
    if streams > 1 {
        format!(", on {streams} CUDA streams")
    } else {
        String::new()
    }
}
