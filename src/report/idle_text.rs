//! The terminal section of a step's blocks idle at the peak: the source lines that hold
//! them, largest first, and the largest blocks with their maker and last reader.

use comfy_table::Cell;

use crate::format;
use crate::names::MISSING;
use crate::timeline::{IdleAtPeak, UNKNOWN_SITE};

use super::{right, table};

/// The section, or a line saying that nothing was idle.
pub(crate) fn render_idle(idle: &IdleAtPeak, top: usize) -> String {
    if idle.blocks.is_empty() {
        return "  idle at the peak: nothing (every block live at the peak is read later)\n".into();
    }
    let mut out = format!(
        "  idle at the peak (not read again): {} in {} blocks\n  \
         freed after their last reads: peak {} -> {}\n",
        format::bytes(idle.bytes),
        idle.blocks.len(),
        format::bytes(idle.peak),
        format::bytes(idle.peak_if_dropped),
    );
    // No source line known for any block (a built-in model, a model file, code built
    // without debug information): one line says so instead of a table of `(unknown)`.
    let lines_known = idle.sites.iter().any(|s| s.site != UNKNOWN_SITE);
    if lines_known {
        out.push_str(&format!(
            "  top {} of {} lines holding them\n",
            idle.sites.len().min(top),
            idle.sites.len()
        ));
        let mut t = table();
        t.set_header(vec![
            Cell::new("line"),
            right("idle".into()),
            right("peak if\ndropped".into()),
        ]);
        for s in idle.sites.iter().take(top) {
            t.add_row(vec![
                Cell::new(&s.site),
                right(format!("{} ({})", format::bytes(s.bytes), s.blocks)),
                right(format::bytes(s.peak_if_dropped)),
            ]);
        }
        out.push_str(&t.to_string());
        out.push('\n');
    } else {
        out.push_str(
            "  their source lines are unknown (a built-in or file model, or no debug info)\n",
        );
    }
    out.push_str(&format!(
        "  top {} of {} idle blocks\n",
        idle.blocks.len().min(top),
        idle.blocks.len()
    ));
    let mut t = table();
    let mut header = vec![right("bytes".into()), Cell::new("made by\n-> last read by")];
    if lines_known {
        header.push(Cell::new("line"));
    }
    t.set_header(header);
    for b in idle.blocks.iter().take(top) {
        let layer = if b.layer == MISSING {
            String::new()
        } else {
            format!(" ({})", b.layer)
        };
        let mut row = vec![
            right(format::bytes(b.bytes)),
            Cell::new(format!("{}{layer}\n-> {}", b.op, b.last_read_op)),
        ];
        if lines_known {
            row.push(Cell::new(&b.site));
        }
        t.add_row(row);
    }
    out.push_str(&t.to_string());
    out.push('\n');
    out
}
