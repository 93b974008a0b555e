//! Pass 6 (with the step detail on): the blocks idle at the peak, and the peak the step
//! would have had with each of them (and all of them) freed right after its last read.
//!
//! A block is idle at the peak when it was made during the step, is live at the
//! allocation that reaches the step's peak, is not a weight gradient or optimizer state
//! (kept for the next step by design) nor a block the device takes for itself (a
//! predicted step's cuBLAS workspace), and the last op that read it (took it as an
//! input, itself or through an op nested in it, backward nodes included) returned before
//! that allocation; a block never read is idle once the op that made it returned.
//! The peak if dropped replays the step's live bytes with the block gone from the end of
//! that op to its real free (or the step's end).

use std::collections::HashMap;

use crate::events::{Event, EventKind};
use crate::names::{Names, MISSING};

use super::{layer_at, Births, Category, OpRec, Owner};
use crate::timeline::{IdleAtPeak, IdleBlock, IdleReplay, IdleSite, LiveCurve};

/// One idle block before its site is named.
struct Found {
    id: u32,
    /// Event index from which it could have been freed.
    drop_at: usize,
    /// Event index of its free (`events.len()`: it outlived the step).
    freed: usize,
    last_read: Option<i32>,
    freed_op: Option<i32>,
    site: i32,
}

/// The idle blocks of the step whose peak is reached at event `peak_at`, each site named
/// by `site_name` (an alloc event's `aux`: its site id + 1, 0 none).
#[allow(clippy::too_many_arguments)]
pub(super) fn idle_at_peak(
    events: &[Event],
    births: &Births,
    start_live: i64,
    slot: u8,
    ops: &[OpRec],
    op_layer: &[String],
    names: &mut Names,
    peak_at: Option<usize>,
    site_name: &mut dyn FnMut(i32) -> String,
) -> IdleAtPeak {
    let curve = curve_of(events, births, start_live, slot);
    let peak = curve.peak_with(&[]);
    let Some(peak_at) = peak_at else {
        return IdleAtPeak {
            peak,
            peak_if_dropped: peak,
            ..IdleAtPeak::default()
        };
    };
    let mut op_end: HashMap<i32, usize> = HashMap::new();
    let n = births.born.len();
    let (mut birth, mut freed) = (vec![usize::MAX; n], vec![events.len(); n]);
    let mut freed_op = vec![None; n];
    let mut site = vec![0i32; n];
    let mut last_read: Vec<Option<i32>> = vec![None; n];
    let mut live: HashMap<u64, u32> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match (e.kind, births.owner[i]) {
            (EventKind::Alloc { .. }, Owner::Born(id)) => {
                birth[id as usize] = i;
                site[id as usize] = e.aux;
                live.insert(e.ptr, id);
            }
            (EventKind::Free, Owner::Born(id)) => {
                freed[id as usize] = i;
                freed_op[id as usize] = Some(e.op);
                live.remove(&e.ptr);
            }
            (EventKind::Read, _) => {
                if let Some(&id) = live.get(&e.ptr) {
                    last_read[id as usize] = Some(e.op);
                }
            }
            (EventKind::OpEnd, _) => {
                op_end.insert(e.op, i);
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    for (id, b) in births.born.iter().enumerate() {
        let alive = birth[id] <= peak_at && peak_at < freed[id];
        if !alive || b.device_owned || matches!(b.cat, Some(Category::Grad | Category::Opt)) {
            continue;
        }
        let done = last_read[id].unwrap_or(b.op);
        let drop_at = match op_end.get(&done) {
            Some(&i) => i,
            None if done < 0 => birth[id],
            None => continue, // the op still runs at the end of the log
        };
        if drop_at < peak_at {
            found.push(Found {
                id: id as u32,
                drop_at,
                freed: freed[id],
                last_read: last_read[id],
                freed_op: freed_op[id],
                site: site[id],
            });
        }
    }
    let drop_of = |f: &Found| (f.drop_at, f.freed, births.born[f.id as usize].bytes);
    let mut op_name = |op: Option<i32>| match op {
        Some(o) if o >= 0 && (o as usize) < ops.len() => names.get(ops[o as usize].name),
        _ => MISSING.to_string(),
    };
    let blocks: Vec<IdleBlock> = found
        .iter()
        .map(|f| {
            let b = &births.born[f.id as usize];
            IdleBlock {
                bytes: b.bytes.max(0) as u64,
                op: op_name(Some(b.op)),
                layer: layer_at(op_layer, b.op),
                phase: b.phase,
                last_read_op: op_name(f.last_read),
                freed_at_op: op_name(f.freed_op),
                site: site_name(f.site),
                peak_if_dropped: curve.peak_with(&[drop_of(f)]),
            }
        })
        .collect();
    let mut by_site: HashMap<String, Vec<usize>> = HashMap::new();
    for (k, b) in blocks.iter().enumerate() {
        by_site.entry(b.site.clone()).or_default().push(k);
    }
    let mut sites: Vec<IdleSite> = by_site
        .into_iter()
        .map(|(site, ks)| IdleSite {
            bytes: ks.iter().map(|&k| blocks[k].bytes).sum(),
            blocks: ks.len(),
            peak_if_dropped: curve
                .peak_with(&ks.iter().map(|&k| drop_of(&found[k])).collect::<Vec<_>>()),
            site,
        })
        .collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    let all: Vec<_> = found.iter().map(drop_of).collect();
    let bytes = blocks.iter().map(|b| b.bytes).sum();
    let peak_if_dropped = curve.peak_with(&all);
    let mut pairs: Vec<_> = blocks.into_iter().zip(all).collect();
    pairs.sort_by(|(a, _), (b, _)| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    let (blocks, drops) = pairs.into_iter().unzip();
    IdleAtPeak {
        bytes,
        peak,
        peak_if_dropped,
        blocks,
        sites,
        replay: IdleReplay { curve, drops },
    }
}

/// After each row (its op-end event index in `row_at`, ascending): the bytes of the idle
/// blocks `drops` (from event, to event, bytes) past their last read and not yet freed,
/// the same interval [`LiveCurve::peak_with`] takes them out of.
pub(super) fn idle_by_row(row_at: &[usize], drops: &[(usize, usize, i64)]) -> Vec<u64> {
    let mut diff = vec![0i64; row_at.len() + 1];
    for &(from, to, bytes) in drops {
        let lo = row_at.partition_point(|&i| i < from);
        let hi = row_at.partition_point(|&i| i < to);
        if lo < hi {
            diff[lo] += bytes;
            diff[hi] -= bytes;
        }
    }
    let mut idle = 0i64;
    diff[..row_at.len()]
        .iter()
        .map(|d| {
            idle += d;
            idle.max(0) as u64
        })
        .collect()
}

/// The step's live bytes after each allocation and free of the profiled device.
fn curve_of(events: &[Event], births: &Births, start: i64, slot: u8) -> LiveCurve {
    let mut live = start;
    let mut points = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if !matches!(e.kind, EventKind::Alloc { .. } | EventKind::Free) || e.device != slot {
            continue;
        }
        if matches!(births.owner[i], Owner::None) {
            continue;
        }
        live += e.value;
        points.push((i, live, e.value > 0));
    }
    LiveCurve { start, points }
}
