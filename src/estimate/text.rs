//! Estimates as a person reads them: the terminal table of `tch-memprof estimate`, the
//! largest-batch line, the settings line, the plans of `tch-memprof plan`. Sizes in the crate's units (`1.50 MiB`).

use std::fmt;

use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};

use super::{AllocatorConfig, Estimate, Fit, Mode, Options, Plans};
use crate::format::bytes;
use crate::names::MISSING;
use crate::timeline::{IdleAtPeak, UNKNOWN_SITE};

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
            "\nbatch {}: allocated peaks in {} ({}, step {}{}); attention ran as {}",
            e.batch,
            e.peak_op,
            e.peak_phase.name(),
            e.peak_step,
            e.peak_layer
                .as_deref()
                .map(|l| format!(", layer {l}"))
                .unwrap_or_default(),
            e.attention.label()
        ));
        if let Some(idle) = e.idle().filter(|i| !i.blocks.is_empty()) {
            out.push_str(&idle_lines(idle));
        }
    }
    out
}

/// The anatomy of the predicted step, as `tch-memprof profile` shows a measured one:
/// the categories at the peak and their own maxima, the blocks idle at the peak, the
/// `top` layers by activations and by FLOPs. `None` when the dry run made no step.
pub fn anatomy(e: &Estimate, top: usize) -> Option<String> {
    let step = e.step.as_ref()?;
    Some(crate::report::terminal::render_step(
        step,
        &format!(
            "predicted at batch {}, in the bytes the caching allocator charges",
            e.batch
        ),
        top,
    ))
}

/// What a `drop` would save at the peak: the idle bytes, the peak had they been freed
/// after their last read, the largest groups (three at most).
fn idle_lines(idle: &IdleAtPeak) -> String {
    let mut out = format!(
        "\n  idle at the peak: {} in {} block(s) no op reads again; freed after their last \
         read, the peak would be {} (from {})",
        bytes(idle.bytes),
        idle.blocks.len(),
        bytes(idle.peak_if_dropped),
        bytes(idle.peak)
    );
    // The three largest, each at least 1% of the idle bytes.
    for g in idle
        .groups()
        .iter()
        .take(3)
        .filter(|g| g.bytes * 100 >= idle.bytes)
    {
        out.push_str(&format!(
            "\n    {} in {} block(s) made by {}{}{}, last read by {}: peak {} if dropped",
            bytes(g.bytes),
            g.blocks,
            g.op,
            match (g.layer.as_str(), g.layers) {
                (MISSING, _) => String::new(),
                (l, 1) => format!(" in {l}"),
                (l, n) => format!(" in {l} and {} more layers", n - 1),
            },
            if g.site == UNKNOWN_SITE {
                String::new()
            } else {
                format!(" at {}", g.site)
            },
            if g.last_read_op == MISSING {
                "(never read)"
            } else {
                &g.last_read_op
            },
            bytes(g.peak_if_dropped)
        ));
    }
    out
}

impl Options {
    /// One line: the mode, the autocast dtype if any, the GPU with its cuBLAS workspace
    /// and compute capability, the attention setting, the allocator settings.
    pub fn describe(&self, mode: Mode) -> String {
        let mut loop_words = match (mode, self.accumulate) {
            (Mode::Train(_), k) if k > 1 => format!(" ({k} micro-batches a step)"),
            _ => String::new(),
        };
        if let (Mode::Train(_), Some(k)) = (mode, self.checkpoint) {
            loop_words.push_str(&format!(", checkpointing {}", every_segment(k)));
        }
        if let (Mode::Train(_), true) = (mode, self.zero_grad_first) {
            loop_words.push_str(", gradients to none before the forward pass");
        }
        format!(
            "{}{loop_words}{}, GPU {} (cuBLAS workspace {}, compute capability {}.{}), attention {}, {}",
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

/// `every segment`, `every 2nd segment`, `every 3rd segment`, `every 4th segment`, ...
pub(super) fn every_segment(k: u32) -> String {
    let suffix = match (k % 10, k % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    match k {
        0 | 1 => "every segment".to_string(),
        k => format!("every {k}{suffix} segment"),
    }
}

impl fmt::Display for Plans {
    /// The plans that fit as a table (cheapest first) and the code of the first; or,
    /// when none fits, the smallest peak reached and what dominates it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for why in &self.skipped {
            writeln!(f, "skipped ({why})")?;
        }
        if let Some(line) = self.nothing_fits() {
            return writeln!(f, "{line}");
        }
        let mut t = Table::new();
        t.load_preset(UTF8_FULL)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(vec!["#", "plan", "peak reserved", "cost"]);
        // A lever per line, so that the table reads on a narrow terminal.
        for (i, p) in self.fits.iter().enumerate() {
            t.add_row(vec![
                (i + 1).to_string(),
                p.levers(self.optimizer).join("\n"),
                format!(
                    "{}\n{} left",
                    bytes(p.estimate.peak_reserved),
                    bytes(p.margin(self.memory))
                ),
                p.cost.describe().replace(", ", "\n"),
            ]);
        }
        for c in [0, 2] {
            if let Some(col) = t.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        writeln!(f, "{t}")?;
        writeln!(
            f,
            "{} plan(s) fit in {} ({} dry run(s)).",
            self.fits.len(),
            bytes(self.memory),
            self.dry_runs
        )?;
        let first = &self.fits[0];
        let others: Vec<String> = first
            .allocator_alternatives
            .iter()
            .filter(|(conf, _)| *conf != first.config.allocator_conf)
            .map(|(conf, reserved)| {
                let name = if conf.is_empty() {
                    "your settings"
                } else {
                    conf
                };
                format!("{name} {}", bytes(*reserved))
            })
            .collect();
        if !others.is_empty() {
            writeln!(
                f,
                "Plan 1's peak reserved under other allocator settings: {}.",
                others.join(", ")
            )?;
        }
        let code = first.code(self.optimizer);
        if code.is_empty() {
            writeln!(f, "Plan 1 is the step as it is: nothing to change.")
        } else {
            writeln!(f, "Plan 1 in a tch loop:")?;
            for line in code {
                writeln!(f, "    {line}")?;
            }
            Ok(())
        }
    }
}
