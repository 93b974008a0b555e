//! Estimates as a person reads them: the terminal table of `tch-memprof estimate`, the
//! largest-batch line, the settings line. Sizes in the crate's units (`1.50 MiB`).

use std::fmt;

use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};

use super::{AllocatorConfig, Estimate, Fit, Mode, Options};
use crate::format::bytes;

/// The estimates as a table (batch, weights, baseline, peak allocated, peak reserved,
/// time; it wraps its cells to the terminal), then one line per batch naming the op,
/// phase and step where allocated peaked.
pub fn table(rows: &[Estimate]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec![
            "batch",
            "weights",
            "baseline",
            "peak allocated",
            "peak reserved",
            "time",
        ]);
    for e in rows {
        t.add_row(vec![
            e.batch.to_string(),
            bytes(e.weights_bytes),
            bytes(e.baseline_allocated),
            bytes(e.peak_allocated),
            bytes(e.peak_reserved),
            format!("{:.2} s", e.elapsed.as_secs_f64()),
        ]);
    }
    for c in 0..6 {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = t.to_string();
    for e in rows {
        out.push_str(&format!(
            "\nbatch {}: allocated peaks in {}{} ({}, step {}); attention ran as {}",
            e.batch,
            e.peak_op,
            e.peak_layer
                .as_deref()
                .map(|l| format!(" in module {l}"))
                .unwrap_or_default(),
            e.peak_phase.name(),
            e.peak_step,
            e.attention.label()
        ));
    }
    out
}

impl Options {
    /// One line: the mode, the autocast dtype if any, the GPU with its cuBLAS workspace
    /// and compute capability, the attention setting, the allocator settings.
    pub fn describe(&self, mode: Mode) -> String {
        let accumulate = match (mode, self.accumulate) {
            (Mode::Train(_), k) if k > 1 => format!(" ({k} micro-batches a step)"),
            _ => String::new(),
        };
        format!(
            "{}{accumulate}{}, GPU {} (cuBLAS workspace {}, compute capability {}.{}), attention {}, {}",
            mode.label(),
            match self.autocast {
                None => String::new(),
                Some(k) => format!(", autocast {}", super::autocast_name(Some(k))),
            },
            self.gpu.name,
            bytes(self.gpu.cublas_workspace),
            self.gpu.sm / 10,
            self.gpu.sm % 10,
            self.attention.name(),
            if self.allocator == AllocatorConfig::default() {
                "default allocator settings".to_string()
            } else {
                format!("PYTORCH_CUDA_ALLOC_CONF={:?}", self.allocator)
            }
        )
    }
}

impl fmt::Display for Fit {
    /// `largest batch that fits in 79.00 GiB: 428 (peak reserved ..., ... left); batch 429
    /// needs ...`, or that not even batch 1 fits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.fits, self.margin()) {
            (Some(e), Some(margin)) => {
                write!(
                    f,
                    "largest batch that fits in {}: {} (peak reserved {}, {} left)",
                    bytes(self.memory),
                    self.batch,
                    bytes(e.peak_reserved),
                    bytes(margin)
                )?;
                if let Some(t) = &self.too_big {
                    write!(f, "; batch {} needs {}", t.batch, bytes(t.peak_reserved))?;
                }
                Ok(())
            }
            _ => write!(
                f,
                "not even batch 1 fits in {}: it needs {} reserved",
                bytes(self.memory),
                self.too_big
                    .as_ref()
                    .map_or("?".to_string(), |t| bytes(t.peak_reserved))
            ),
        }
    }
}

impl Estimate {
    /// What the estimate cost the host, in one line, when its resident memory could be
    /// read.
    pub fn host_memory_line(&self) -> Option<String> {
        self.host_peak_rss.map(|rss| {
            format!(
                "This estimate's host memory: {} peak resident (the whole process).",
                bytes(rss)
            )
        })
    }
}
