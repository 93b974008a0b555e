//! What the CLI's commands print, composed whole: `estimate`, `plan` (of a model and of
//! a recorded run), `replay` and `diff` hand their results here and write the text they
//! get back as it is, standard output and standard error apart. Their CSV goes through
//! [`csv_to_stdout`](super::estimate_text::csv_to_stdout), one row type each.

use std::fmt::Write as _;
use std::path::Path;

use super::estimate_text::{anatomy, budget_line, peak_lines_with, table};
use super::estimate_text::{
    describe_options, fit_thin_margin_line, host_memory_line, jit_fallback_line,
    kernel_workspace_line,
};
use super::replay_text;
use super::replay_text::{
    comparison_text, failing_request_line, fragmentation_line, peak_table, split_segments,
};
use crate::estimate::recorded::{Action, Peaks, RecordedRun, Recording};
use crate::estimate::{
    AllocatorConfig, Comparison, Estimate, Fit, Mode, Options, Plans, EAGER_ABOVE, NOT_MODELLED,
};
use crate::runs::diff::Diff;

/// A budget as the user gave it: its bytes and the words it was given in (`24GB`, `h100`).
#[derive(Debug, Clone, Copy)]
pub struct Budget<'a> {
    /// Its bytes.
    pub bytes: u64,
    /// What the user typed.
    pub spec: &'a str,
}

/// What `tch-memprof estimate` found, for its terminal text.
#[derive(Debug)]
pub struct EstimateOutput<'a> {
    /// The model's label.
    pub label: &'a str,
    /// The settings the estimates ran with.
    pub options: &'a Options,
    /// Inference or a training step.
    pub mode: Mode,
    /// One estimate per batch asked for, in order.
    pub rows: &'a [Estimate],
    /// The budget of `--memory`.
    pub budget: Option<Budget<'a>>,
    /// The largest batch that fits the budget.
    pub fit: Option<&'a Fit>,
    /// Every batch's idle line, also where freeing its idle blocks would not lower the peak.
    pub all_idle: bool,
    /// Layers listed in the anatomy of the last batch's step (0: none).
    pub top: usize,
    /// The last batch held to a recorded run (the recording's path).
    pub compared: Option<(&'a Path, &'a Comparison)>,
    /// The model is a file PyTorch wrote ([`Model::from_pytorch`]): the text says once
    /// how much more eager PyTorch took than such a file's estimate.
    ///
    /// [`Model::from_pytorch`]: crate::estimate::Model::from_pytorch
    pub pytorch_file: bool,
}

impl EstimateOutput<'_> {
    /// The terminal text: the settings, the table, the budget and the largest batch, where
    /// each batch peaked, the anatomy, the warnings, what is not modelled, the comparison.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let rows = self.rows;
        let _ = writeln!(
            out,
            "tch-memprof estimate: {}, {}",
            self.label,
            describe_options(self.options, self.mode)
        );
        let _ = writeln!(out, "{}", table(rows, self.budget.map(|b| b.bytes)));
        // The answer first: the budget and the largest batch under the table, then where
        // each batch peaked.
        if let Some(b) = self.budget {
            let _ = writeln!(out, "{}", budget_line(b.bytes, b.spec));
        }
        if let Some(f) = self.fit {
            let _ = writeln!(out, "{f}");
            if let Some(line) = fit_thin_margin_line(f) {
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = writeln!(
            out,
            "{}",
            peak_lines_with(rows, self.all_idle).trim_start_matches('\n')
        );
        if let Some(text) = rows
            .last()
            .filter(|_| self.top > 0)
            .and_then(|e| anatomy(e, self.top))
        {
            out.push_str(&text);
        }
        for e in rows
            .iter()
            .filter(|e| e.unknown_frees > 0 || e.refused_requests > 0)
        {
            let _ = writeln!(
                out,
                "warning: at batch {}: {} free(s) of blocks the trace never allocated, {} request(s) the allocator refuses",
                e.batch, e.unknown_frees, e.refused_requests
            );
        }
        for line in self.fallback_warnings() {
            let _ = writeln!(out, "{line}");
        }
        if let Some(line) = rows.last().and_then(kernel_workspace_line) {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "Not modelled (a CUDA run may add):");
        for n in NOT_MODELLED {
            let _ = writeln!(out, "- {}: {}", n.what, n.likely);
        }
        if self.pytorch_file {
            let _ = writeln!(out, "- {}", eager_line());
        }
        if let Some(line) = rows.last().and_then(host_memory_line) {
            let _ = writeln!(out, "{line}");
        }
        if let Some((path, c)) = self.compared {
            let _ = writeln!(out, "Compared with {}:", path.display());
            out.push_str(&comparison_text(c, self.top.max(1)));
        }
        out
    }

    /// A line for each batch whose TorchScript file ran unoptimized (with `--csv` they go
    /// to standard error, standard output staying CSV).
    pub fn fallback_warnings(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|e| e.jit_fallback.is_some())
            .map(|e| format!("warning: at batch {}: {}", e.batch, jit_fallback_line(e)))
            .collect()
    }
}

/// What the estimate of a file PyTorch wrote is of, and how much more eager PyTorch took
/// ([`EAGER_ABOVE`]), in one line.
pub fn eager_line() -> String {
    let (inference, training) = EAGER_ABOVE;
    format!(
        "eager PyTorch running the original module: this is the file as tch (or PyTorch \
         running the exported program) runs it; on an H200, eager PyTorch took up to {:.0}% \
         more allocated in inference and {:.0}% in training than its files' estimates \
         (Python's locals, held until a module's forward returns, and transformers' \
         grouped-query attention on another kernel; docs/estimate.md)",
        100.0 * inference,
        100.0 * training
    )
}

/// The terminal text of `tch-memprof plan` of a model: the settings, the budget, the plans.
pub fn plan_text(label: &str, options: &Options, budget: Budget<'_>, plans: &Plans) -> String {
    let mut out = String::new();
    let optimizer = plans.optimizer;
    let _ = writeln!(
        out,
        "tch-memprof plan: {label}, training with {} at batch {}, {}",
        optimizer.name(),
        plans.batch,
        describe_options(options, Mode::Train(optimizer))
    );
    let _ = writeln!(out, "{}", budget_line(budget.bytes, budget.spec));
    let _ = write!(out, "{plans}");
    out
}

/// The terminal text of `tch-memprof plan` of a recorded run: the run replayed under its
/// own allocator settings (`own`) and under each the plan tries (`rows`), the cheapest
/// that fits.
pub fn plan_recorded_text(
    path: &Path,
    own: &str,
    budget: Budget<'_>,
    recorded: Peaks,
    recording: &Recording,
    rows: &[(String, Peaks)],
) -> String {
    let streams = recording.streams();
    let mut out = String::new();
    let _ = if recording.captured() {
        writeln!(
            out,
            "tch-memprof plan: {}, a run captured without a GPU{}: its lever is the \
             allocator's settings (with each thread's cuBLAS workspace as {} takes it)",
            path.display(),
            replay_text::on_streams(streams),
            recording.workspace_gpu().name
        )
    } else {
        writeln!(
            out,
            "tch-memprof plan: {}, a recorded run{}: its lever is the allocator's settings \
             (recorded with PYTORCH_CUDA_ALLOC_CONF={own:?})",
            path.display(),
            replay_text::on_streams(streams)
        )
    };
    let _ = writeln!(out, "{}", budget_line(budget.bytes, budget.spec));
    let _ = writeln!(
        out,
        "{}",
        replay_text::table(recorded, rows, Some(budget.bytes), recording.captured())
    );
    let _ = writeln!(out, "{}", replay_text::cheapest_fit(rows, budget.bytes).1);
    out
}

/// What `tch-memprof replay` found, for its terminal text.
#[derive(Debug)]
pub struct ReplayOutput<'a> {
    /// The recording's path.
    pub path: &'a Path,
    /// The device replayed.
    pub device: usize,
    /// The recorded run.
    pub recording: &'a Recording,
    /// The allocator settings it ran with (`PYTORCH_CUDA_ALLOC_CONF`).
    pub own: &'a str,
    /// Those settings, parsed.
    pub own_config: &'a AllocatorConfig,
    /// Each settings replayed (its own first) and the replay under them.
    pub runs: &'a [(String, RecordedRun)],
    /// Settings PyTorch takes that the model does not (replayed as if absent).
    pub unmodelled: &'a [String],
    /// The budget of `--memory`, in bytes.
    pub budget: Option<u64>,
    /// The split segments listed.
    pub top: usize,
}

impl ReplayOutput<'_> {
    /// The terminal text: the recording, the peaks of each replay, the cheapest that
    /// fits, the segments at the peak reserved, how near the replay came.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let recording = self.recording;
        let first = &self.runs[0].1;
        let recorded = first.recorded;
        let allocations = recording
            .events
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .count();
        let _ = writeln!(
            out,
            "tch-memprof replay: {}, device {}, {} events ({allocations} allocations{}), {}",
            self.path.display(),
            self.device,
            recording.events.len(),
            replay_text::on_streams(first.streams),
            if recording.captured() {
                "captured without a GPU".to_string()
            } else {
                format!("recorded with PYTORCH_CUDA_ALLOC_CONF={:?}", self.own)
            }
        );
        if recording.captured() {
            let gpu = recording.workspace_gpu();
            let _ = writeln!(
                out,
                "the replayed rows add each thread's cuBLAS workspace as {} takes it ({}) and \
                 the staging buffers of its sums and means ({} multiprocessors); what other \
                 CUDA kernels take inside themselves (the attention kernels' backward, cuDNN) \
                 is not captured: the peaks can be higher on the GPU (docs/replay.md, a step \
                 captured without a GPU)",
                gpu.name,
                crate::format::bytes(gpu.cublas_workspace),
                gpu.multiprocessors
            );
        }
        if recording.segments_before > 0 {
            let _ = writeln!(
                out,
                "the history began after {} segment(s) were made: they are seeded from the \
                 snapshot's end state (with the blocks live at its end that the history never \
                 allocated)",
                recording.segments_before
            );
        }
        if !first.complete {
            let _ = writeln!(
                out,
                "{} free(s) of blocks the history never saw allocated: the peaks are those of \
                 the recorded part",
                first.unknown_frees
            );
        }
        let replays: Vec<(String, Peaks)> = self
            .runs
            .iter()
            .map(|(conf, run)| (conf.clone(), run.replayed))
            .collect();
        let _ = writeln!(
            out,
            "{}",
            replay_text::table(recorded, &replays, self.budget, recording.captured())
        );
        if !self.unmodelled.is_empty() {
            let _ = writeln!(
                out,
                "not modelled, replayed as if absent: {} (the rows with them may differ on the GPU)",
                self.unmodelled.join(", ")
            );
        }
        if let Some(b) = self.budget {
            let _ = writeln!(out, "{}", replay_text::cheapest_fit(&replays, b).1);
        }
        if let Some(line) = fragmentation_line(first) {
            let _ = writeln!(out, "{line}");
        }
        if let Some(view) = recording.at_reserved_peak(self.own_config) {
            let _ = writeln!(out, "the segments then, by size:");
            let _ = writeln!(out, "{}", peak_table(&view));
            if let Some(t) = replay_text::streams_table(&view, &recording.stream_ids()) {
                let _ = writeln!(
                    out,
                    "by the stream each segment was made for (its free bytes are that \
                     stream's alone):"
                );
                let _ = writeln!(out, "{t}");
            }
            let split = split_segments(&view, &recording.sites, self.top);
            if !split.is_empty() {
                let _ = writeln!(
                    out,
                    "the segments with the most free bytes, and the blocks that split them:"
                );
            }
            for line in split {
                let _ = writeln!(out, "- {line}");
            }
            let _ = writeln!(out, "{}", failing_request_line(&view));
        }
        if recording.captured() {
            // A capture reserves nothing of its own: nothing to hold the replay to.
        } else if first.replayed.reserved == recorded.reserved {
            let _ = writeln!(
                out,
                "the replay gives the recorded peak reserved to the byte"
            );
        } else {
            let off = 100.0 * (first.replayed.reserved as f64 / recorded.reserved as f64 - 1.0);
            let _ = writeln!(
                out,
                "the replay's peak reserved is {off:+.2}% off the recorded one"
            );
        }
        let _ = writeln!(
            out,
            "recorded allocated: the blocks' sizes as asked for (the allocator counts whole \
             blocks, a little more)"
        );
        out
    }
}

/// What `tch-memprof diff` prints: the text for standard output, and where a peak grew
/// by more than `max_increase` percent, the line for standard error (the command then
/// exits 1).
pub fn diff_text(d: &Diff, top: usize, max_increase: f64) -> (String, Option<String>) {
    let mut out = String::new();
    let _ = writeln!(out, "tch-memprof diff: {} -> {}", d.base, d.new);
    for n in &d.notes {
        let _ = writeln!(out, "note: {n}");
    }
    let _ = writeln!(out, "{}", d.table(top));
    let grew = d.regressions(max_increase);
    if grew.is_empty() {
        let _ = writeln!(out, "no peak grew by more than {max_increase}%");
        return (out, None);
    }
    let what: Vec<String> = grew.iter().take(5).map(|c| c.describe()).collect();
    let more = if grew.len() > 5 {
        format!(" and {} more", grew.len() - 5)
    } else {
        String::new()
    };
    let error = format!(
        "tch-memprof: {} peak(s) grew by more than {max_increase}%: {}{more}",
        grew.len(),
        what.join("; ")
    );
    (out, Some(error))
}
