//! The files of an out-of-memory report: `<run>_oom<N>.txt` (the report's text) and
//! `<run>_oom<N>.pickle` (a memory snapshot PyTorch's viewer opens), written from the
//! failing allocation so that they exist even when the loop dies right after.

use std::path::Path;

use crate::oom::{Forensics, OomReport};

/// Writes the report's files into `dir` and records their paths in the report (a file
/// that could not be written is left out). `index`/`slot`: the device's position in
/// the snapshot and its native slot.
pub(crate) fn write(
    dir: &Path,
    stem: &str,
    count: u32,
    slot: usize,
    report: &mut OomReport,
    f: &mut Forensics,
) {
    if crate::fs::create_dir_all(dir).is_err() {
        return;
    }
    let base = dir.join(format!("{stem}_oom{count}"));
    let snapshot = base.with_extension("pickle");
    let index = slot.saturating_sub(1);
    if super::snapshot::write(
        &snapshot,
        index,
        &f.blocks,
        &f.history,
        slot as u8,
        &mut f.names,
    )
    .is_ok()
    {
        report.snapshot_path = Some(snapshot);
    }
    let text = base.with_extension("txt");
    report.report_path = Some(text.clone());
    if crate::fs::write_atomic(&text, report.to_string().as_bytes()).is_err() {
        report.report_path = None;
    }
}
