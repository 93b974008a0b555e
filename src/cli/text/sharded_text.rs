//! A sharded estimate as a person reads it: each rank's peaks, then what each holds at
//! its peak by category.

use comfy_table::CellAlignment;

use crate::estimate::{Ddp, Fsdp, RankEstimate};
use crate::format::bytes;

/// The ranks' peaks and their categories at the peak, with what the estimate does not
/// see.
pub fn sharded(ranks: &[RankEstimate], fsdp: &Fsdp) -> String {
    let mut out = String::new();
    let mut t = crate::report::table();
    let mut header = vec!["".to_string()];
    header.extend(ranks.iter().map(|r| format!("rank {}", r.rank)));
    t.set_header(header);
    let mut row = |name: &str, f: &dyn Fn(&RankEstimate) -> u64| {
        let mut cells = vec![name.to_string()];
        cells.extend(ranks.iter().map(|r| bytes(f(r))));
        t.add_row(cells);
    };
    row("peak allocated", &|r| r.peak_allocated);
    row("peak reserved", &|r| r.peak_reserved);
    categories(ranks, &mut row);
    row("sharded params (requested)", &|r| r.sharded_parameter_bytes);
    row("optimizer state (requested)", &|r| r.optimizer_state_bytes);
    for c in 1..=ranks.len() {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    crate::report::keep_words(&mut t);
    let units = ranks.first().map_or(&[][..], |r| &r.units[..]);
    let unit_words = match units {
        [] => "none but the root".to_string(),
        [one] => format!("{one} and the root"),
        [first, .., last] => format!("{} ({first} to {last}) and the root", units.len()),
    };
    out.push_str(&format!(
        "FSDP2 over {} ranks ({}); units: {unit_words}; the categories are held at allocated's peak\n",
        fsdp.world,
        match (fsdp.reshard_after_forward, fsdp.reshard_root) {
            (true, true) => "resharded after forward, the root too",
            (true, false) => "resharded after forward, the root kept",
            _ => "kept unsharded until backward",
        },
    ));
    if units.is_empty() {
        out.push_str(
            "warning: the model has no repeated module list: it is one unit, the root, \
             gathered whole (name units with --fsdp-units)\n",
        );
    }
    out.push_str(&t.to_string());
    out.push('\n');
    out.push_str(
        "not counted: NCCL's own buffers (outside PyTorch's allocator; leave room for them)\n\
         unverified on a GPU: docs/estimate.md says what the sharded estimate was held to\n",
    );
    out
}

/// The categories at the peak, those some rank holds bytes of.
/// A table's row: its label, and a rank's bytes.
type Row<'a> = dyn FnMut(&str, &dyn Fn(&RankEstimate) -> u64) + 'a;

fn categories(ranks: &[RankEstimate], row: &mut Row<'_>) {
    if let Some(first) = ranks.first() {
        for (k, (cat, _)) in first.at_peak.iter().enumerate() {
            let bytes = |r: &RankEstimate| r.at_peak.get(k).map_or(0, |c| c.1);
            if ranks.iter().all(|r| bytes(r) == 0) {
                continue;
            }
            row(&format!("  {}", cat.name()), &bytes);
        }
    }
}

/// A DDP rank's peaks and what it holds at its peak.
pub fn replicated(rank: &RankEstimate, ddp: &Ddp) -> String {
    let mut t = crate::report::table();
    t.set_header(vec!["", "every rank"]);
    let ranks = std::slice::from_ref(rank);
    let mut row = |name: &str, f: &dyn Fn(&RankEstimate) -> u64| {
        t.add_row(vec![name.to_string(), bytes(f(rank))]);
    };
    row("peak allocated", &|r| r.peak_allocated);
    row("peak reserved", &|r| r.peak_reserved);
    categories(ranks, &mut row);
    if let Some(col) = t.column_mut(1) {
        col.set_cell_alignment(CellAlignment::Right);
    }
    crate::report::keep_words(&mut t);
    format!(
        "DDP over {} ranks (buckets of 25 MiB, gradients {}); the categories are held at allocated's peak\n{t}\n\
         not counted: NCCL's own buffers (outside PyTorch's allocator; leave room for them)\n\
         unverified on a GPU: docs/estimate.md says what the replicated estimate was held to\n",
        ddp.world,
        if ddp.gradient_as_bucket_view {
            "as views into them"
        } else {
            "copied into them"
        }
    )
}
