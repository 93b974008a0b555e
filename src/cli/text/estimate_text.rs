//! Estimates and plans as a person reads them: the terminal table of `tch-memprof
//! estimate` and the predicted step's anatomy, the largest-batch line, the settings line,
//! the plans of `tch-memprof plan` with their levers in words and the code that applies
//! them. Sizes in the crate's units (`1.50 MiB`).

use std::fmt;

use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};

use super::plan_code::{pytorch_code, tch_code};
use super::replay_text::fits_cell;
use crate::estimate::Fit;
use crate::estimate::{
    autocast_name, breakdown, dtype_name, every_segment, is_size, lever_words, AllocatorConfig,
    Cost, Dominant, Estimate, Mode, Model, Optimizer, Options, Plan, Plans, CONTEXT_ALLOWANCE,
    THIN_MARGIN,
};
use crate::format::bytes;
use crate::names::MISSING;
use crate::timeline::{IdleAtPeak, UNKNOWN_SITE};

/// The estimates as a table (batch, weights, baseline, peak allocated, peak reserved,
/// time, and with a `budget` whether the peak reserved fits in it: `✓` and the bytes
/// left, or `✗` and the bytes over); it wraps its cells to the terminal.
pub fn table(rows: &[Estimate], budget: Option<u64>) -> String {
    let mut t = Table::new();
    let mut header = vec![
        "batch",
        "weights",
        "baseline",
        "peak allocated",
        "peak reserved",
        "time",
    ];
    if budget.is_some() {
        header.push("fits");
    }
    t.load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    for e in rows {
        let mut row = vec![
            batch_label(e, false),
            bytes(e.weights_bytes),
            bytes(e.baseline_allocated),
            bytes(e.peak_allocated),
            bytes(e.peak_reserved),
            format!("{:.2} s", e.elapsed.as_secs_f64()),
        ];
        if let Some(b) = budget {
            row.push(fits_cell(e.peak_reserved, b));
        }
        t.add_row(row);
    }
    for c in 0..7 {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    crate::report::keep_words(&mut t);
    t.to_string()
}

/// A warning in one line where `what` leaves less of the budget `memory` than the
/// estimate's measured error ([`THIN_MARGIN`]); `None` where it leaves more.
pub fn thin_margin_line(what: &str, margin: u64, memory: u64) -> Option<String> {
    let share = margin as f64 / memory as f64;
    (share < THIN_MARGIN).then(|| {
        format!(
            "warning: {what} leaves {} ({:.2}% of the budget), less than the estimate's \
             error as measured on a GPU (its peak reserved up to {:.1}% under the run's, \
             docs/estimate.md): it may not fit.",
            bytes(margin),
            100.0 * share,
            100.0 * THIN_MARGIN
        )
    })
}

/// The budget the table's `fits` column is against, and what it keeps for the CUDA
/// context: a GPU name keeps [`CONTEXT_ALLOWANCE`] out of its memory, a plain size none.
pub fn budget_line(budget: u64, spec: &str) -> String {
    if is_size(spec) {
        format!(
            "budget: peak reserved within {} (--memory {spec}, all of it for the caching \
             allocator: the CUDA context takes memory beside it, so keep {} out, or name the GPU)",
            bytes(budget),
            bytes(CONTEXT_ALLOWANCE)
        )
    } else {
        format!(
            "budget: peak reserved within {} (--memory {spec}: its memory less {} for the CUDA \
             context)",
            bytes(budget),
            bytes(CONTEXT_ALLOWANCE)
        )
    }
}

/// One line per estimate naming the op, phase and step where allocated peaked, and the
/// blocks idle there when freeing them would lower the peak.
pub fn peak_lines(rows: &[Estimate]) -> String {
    peak_lines_with(rows, false)
}

/// [`peak_lines`], with `all_idle`: the idle blocks also where freeing them would not
/// lower the peak by an amount the sizes show.
pub fn peak_lines_with(rows: &[Estimate], all_idle: bool) -> String {
    let mut out = String::new();
    for e in rows {
        out.push_str(&format!(
            "\n{}: allocated peaks in {} ({}, step {}{}); attention ran as {}",
            batch_label(e, true),
            e.peak_op,
            e.peak_phase.name(),
            e.peak_step,
            e.peak_layer
                .as_deref()
                .map(|l| format!(", layer {l}"))
                .unwrap_or_default(),
            e.attention.label()
        ));
        // Left out when dropping the idle blocks saves nothing the sizes show.
        if let Some(idle) = e
            .idle()
            .filter(|i| !i.blocks.is_empty() && (all_idle || saves(i.peak_if_dropped, i.peak)))
        {
            out.push_str(&idle_lines(idle));
        }
    }
    out
}

/// The batch of an estimate in a table cell (`8`), or in a line (`batch 8`); a user's
/// own step makes its own batch (`own step`).
fn batch_label(e: &Estimate, line: bool) -> String {
    match (e.mode, line) {
        (Mode::Steps, _) => "own step".to_string(),
        (_, true) => format!("batch {}", e.batch),
        (_, false) => e.batch.to_string(),
    }
}

/// The anatomy of the predicted step, as `tch-memprof profile` shows a measured one:
/// the categories at the peak and their own maxima, the blocks idle at the peak, the
/// `top` layers by activations and by FLOPs. `None` when the dry run made no step.
pub fn anatomy(e: &Estimate, top: usize) -> Option<String> {
    let step = e.step.as_ref()?;
    Some(crate::report::terminal::render_step(
        step,
        &format!(
            "predicted {}, in the bytes the caching allocator charges",
            match e.mode {
                Mode::Steps => "for your own step".to_string(),
                _ => format!("at batch {}", e.batch),
            }
        ),
        top,
    ))
}

/// Whether a peak of `after` instead of `before` is a saving one can read: the two print
/// differently.
fn saves(after: u64, before: u64) -> bool {
    after < before && bytes(after) != bytes(before)
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
    // The three largest, each at least 1% of the idle bytes, that would lower the peak
    // if dropped alone.
    for g in idle
        .groups()
        .iter()
        .filter(|g| saves(g.peak_if_dropped, idle.peak))
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

/// One line: the mode, the autocast dtype if any, the GPU with its cuBLAS workspace
/// and compute capability, the attention setting, the allocator settings.
pub(crate) fn describe_options(o: &Options, mode: Mode) -> String {
    let mut loop_words = match (mode, o.accumulate) {
        (Mode::Train(_), k) if k > 1 => format!(" ({k} micro-batches a step)"),
        _ => String::new(),
    };
    if let (Mode::Train(_), Some(k)) = (mode, o.checkpoint) {
        loop_words.push_str(&format!(", checkpointing {}", every_segment(k)));
    }
    if let (Mode::Train(_), true) = (mode, o.zero_grad_first) {
        loop_words.push_str(", gradients to none before the forward pass");
    }
    if !o.jit_optimize {
        loop_words.push_str(", TorchScript as written (executor optimization off)");
    }
    format!(
        "{}{loop_words}{}, GPU {} (cuBLAS workspace {}, compute capability {}.{}), attention {}, {}",
        mode.label(),
        match o.autocast {
            None => String::new(),
            Some(k) => format!(", autocast {}", autocast_name(Some(k))),
        },
        o.gpu.name,
        bytes(o.gpu.cublas_workspace),
        o.gpu.sm / 10,
        o.gpu.sm % 10,
        o.attention.name(),
        if o.allocator == AllocatorConfig::default() {
            "default allocator settings".to_string()
        } else {
            format!("PYTORCH_CUDA_ALLOC_CONF={:?}", o.allocator)
        }
    )
}

/// A note in one line where a training step holds an exported program's frozen
/// parameters (a fine-tune's base weights) without gradients: so the user sees they were
/// told apart.
pub(crate) fn frozen_line(m: &Model) -> Option<String> {
    m.frozen_parameter_bytes().map(|(n, bytes)| {
        format!(
            "note: {n} parameter(s) of {} ({}) were saved with requires_grad=False: held \
             without gradient or optimizer state (counted with the buffers), sharded like \
             the others under --fsdp",
            m.label(),
            crate::format::bytes(bytes)
        )
    })
}

/// A warning in one line where a training step of an exported program trains
/// parameters it was saved with frozen: all of them were (exported for inference).
pub(crate) fn all_frozen_line(m: &Model) -> Option<String> {
    m.all_parameters_frozen().then(|| {
        format!(
            "warning: every parameter of {} was saved with requires_grad=False (exported              for inference?): the training step trains them all; for a fine-tune, export              it with the parameters that train requiring grad",
            m.label()
        )
    })
}

/// A warning in one line where the file was traced on the CPU and names it as a
/// device ([`Model::cpu_device_ops`]): a GPU run of it stops.
pub(crate) fn cpu_device_line(m: &Model) -> Option<String> {
    let ops = m.cpu_device_ops();
    if ops.is_empty() {
        return None;
    }
    Some(format!(
        "warning: {} was traced on the CPU: its {} make tensors on the CPU, so a GPU run of \
         this file stops (\"Expected all tensors to be on the same device\"). The \
         estimate is not changed by it: it is of the file as traced on a GPU (those ops \
         on the GPU). No GPU is needed to estimate it; the file a GPU job runs must be \
         traced on a GPU",
        m.label(),
        ops.join(", ")
    ))
}

/// Why a TorchScript file was estimated as written, and what that may miss, in one
/// line (empty when it was not: [`Estimate::jit_fallback`]).
pub(crate) fn jit_fallback_line(e: &Estimate) -> String {
    let Some(why) = &e.jit_fallback else {
        return String::new();
    };
    let what = match e.mode {
        Mode::Inference => "",
        _ => {
            " (in training it keeps more for backward: on an H200 a traced Swin-T's \
             training peak was 29% above its estimate as written)"
        }
    };
    // The failing op, without the advice meant for a model that fails as written.
    let why = why.lines().next().unwrap_or_default().trim();
    let why = why.rsplit("failed: ").next().unwrap_or(why);
    let why = match why.split_once(" depends on the values of its input") {
        Some((op, _)) => format!("{op} needs a tensor's value, which meta tensors lack"),
        None => why.to_string(),
    };
    format!(
        "the TorchScript executor's optimized graph, which tch runs by default, failed in \
         the dry run ({why}), so the file was estimated as written{what}; the peak may be \
         low, unless the program calls tch::jit::set_graph_executor_optimize(false)"
    )
}

/// The kernels' workspaces charged, in one line; `None` when the run has none.
pub(crate) fn kernel_workspace_line(e: &Estimate) -> Option<String> {
    (e.kernel_workspaces > 0).then(|| {
        let (n, mut bounded) = (e.bounded_kernel_workspaces, String::new());
        let whose = if n == 1 { "convolution's" } else { "convolutions'" };
        if n > 0 {
            bounded = format!("; {n} {whose} not measured on a GPU like this one, at the larger plausible size (where the peak is inside one, the estimate errs high)");
        }
        format!(
            "Kernel workspaces (cuDNN convolutions, attention, the buffers of CUDA's \
             sums): {} charged at batch {}, the largest {}{bounded}",
            e.kernel_workspaces,
            e.batch,
            bytes(e.largest_kernel_workspace)
        )
    })
}

/// What the estimate cost the host, in one line, when its resident memory could be
/// read.
pub(crate) fn host_memory_line(e: &Estimate) -> Option<String> {
    e.host_peak_rss.map(|rss| {
        format!(
            "This estimate's host memory: {} peak resident (the whole process).",
            bytes(rss)
        )
    })
}

impl fmt::Display for Plans {
    /// The plans that fit as a table (cheapest first) and the code of the first; or,
    /// when none fits, the smallest peak reached and what dominates it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        answer(self, f)?;
        if let Some(line) = skipped_line(self) {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// The configurations left out of the search, in one line: how many, and each reason
/// with its count (`tch-memprof plan --verbose` lists them one by one).
pub(crate) fn skipped_line(plans: &Plans) -> Option<String> {
    if plans.skipped.is_empty() {
        return None;
    }
    // "4 x micro-batch 1: invalid input "1x3x32x32": the program ..." -> the reason,
    // less the configuration and the sizes it asked for.
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for s in &plans.skipped {
        let why = s.split_once(": ").map_or(s.as_str(), |(_, w)| w);
        let why = match why.strip_prefix("invalid input \"") {
            Some(rest) => rest.split_once("\": ").map_or(why, |(_, w)| w),
            None => why,
        };
        match reasons.iter_mut().find(|(r, _)| r == why) {
            Some((_, n)) => *n += 1,
            None => reasons.push((why.to_string(), 1)),
        }
    }
    let said: Vec<String> = reasons
        .iter()
        .map(|(why, n)| format!("{n} because {why}"))
        .collect();
    Some(format!(
        "Left out of the search: {} configuration(s) whose dry run failed, {} \
         (tch-memprof plan --verbose lists them).",
        plans.skipped.len(),
        said.join("; ")
    ))
}

/// Each configuration left out of the search and why, a line each.
pub(crate) fn skipped_lines(plans: &Plans) -> Vec<String> {
    plans
        .skipped
        .iter()
        .map(|s| format!("skipped ({s})"))
        .collect()
}

fn answer(plans: &Plans, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    // The answer first: the step as it is against the budget.
    writeln!(
        f,
        "As it is: peak reserved {}, {} the {} budget.",
        bytes(plans.as_is),
        if plans.as_is <= plans.memory {
            format!("{} within", bytes(plans.memory - plans.as_is))
        } else {
            format!("{} over", bytes(plans.as_is - plans.memory))
        },
        bytes(plans.memory)
    )?;
    if let Some(line) = nothing_fits(plans) {
        return writeln!(f, "{line}");
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec!["#", "plan", "peak reserved", "cost"]);
    // A lever per line, so that the table reads on a narrow terminal.
    for (i, p) in plans.fits.iter().enumerate() {
        t.add_row(vec![
            (i + 1).to_string(),
            levers(p, plans.optimizer).join("\n"),
            format!(
                "{}\n{} left",
                bytes(p.estimate.peak_reserved),
                bytes(p.margin(plans.memory))
            ),
            describe_cost(&p.cost).replace(", ", "\n"),
        ]);
    }
    for c in [0, 2] {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    crate::report::keep_words(&mut t);
    writeln!(f, "{t}")?;
    writeln!(
        f,
        "{} plan(s) fit in {} ({} dry run(s)).",
        plans.fits.len(),
        bytes(plans.memory),
        plans.dry_runs
    )?;
    let first = &plans.fits[0];
    if let Some(line) = thin_margin_line("plan 1", first.margin(plans.memory), plans.memory) {
        writeln!(f, "{line} A plan below it leaves more room.")?;
    }
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
    let code = tch_code(first, plans.optimizer);
    if code.is_empty() {
        writeln!(f, "Plan 1 is the step as it is: nothing to change.")
    } else {
        if plans.pytorch_file {
            writeln!(
                f,
                "Plan 1 in PyTorch (a loop over the module the file was made from):"
            )?;
            for line in pytorch_code(first, plans.optimizer) {
                writeln!(f, "    {line}")?;
            }
        }
        writeln!(f, "Plan 1 in a tch loop:")?;
        for line in code {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// The plans as a person reads them and as code to apply.

/// The levers this plan pulls, in words: `bf16 autocast`, `2 x micro-batch 4`, ...
pub(crate) fn levers(plan: &Plan, asked: Optimizer) -> Vec<String> {
    let mut out = lever_words(&plan.config, plan.micro_batch, asked, &plan.cost);
    if !plan.config.allocator_conf.is_empty() {
        out.push(plan.config.allocator_conf.clone());
    }
    if out.is_empty() {
        out.push("as is".to_string());
    }
    out
}

impl fmt::Display for Dominant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dominant::Weights => "weights",
            Dominant::Gradients => "gradients",
            Dominant::OptimizerState => "optimizer state",
            Dominant::Activations => "activations",
        })
    }
}

/// In words: `free`, `2 steps per batch`, `+33% FLOPs`, `changes training`, ...
pub(crate) fn describe_cost(cost: &Cost) -> String {
    let mut parts = Vec::new();
    if cost.changes_training {
        parts.push("changes training".to_string());
    }
    if cost.recompute > 0.0 {
        parts.push(format!("+{:.0}% FLOPs recomputed", 100.0 * cost.recompute));
    }
    if cost.accumulate > 1 {
        parts.push(format!("{} steps per batch", cost.accumulate));
    }
    if let Some(k) = cost.lower_precision {
        parts.push(format!("{} numerics", dtype_name(k)));
    }
    if parts.is_empty() {
        parts.push("free".to_string());
    }
    parts.join(", ")
}

/// When no plan fits: one line with the smallest peak reserved any plan reached, its
/// levers and what dominates its peak allocated (weights, gradients, optimizer state,
/// activations). `None` when a plan fits.
pub(crate) fn nothing_fits(plans: &Plans) -> Option<String> {
    use crate::format::bytes;

    if !plans.fits.is_empty() {
        return None;
    }
    let mut line = format!("nothing fits in {}", bytes(plans.memory));
    if let Some(p) = &plans.smallest {
        let parts = breakdown(p);
        let (what, _) = parts
            .iter()
            .max_by_key(|(_, b)| *b)
            .copied()
            .unwrap_or((Dominant::Activations, 0));
        let list: Vec<String> = parts
            .iter()
            .map(|(d, b)| format!("{d} {}", bytes(*b)))
            .collect();
        line.push_str(&format!(
            ": the smallest peak reserved of any plan is {} ({}), dominated by {what} ({} of {} allocated)",
            bytes(p.estimate.peak_reserved),
            levers(p, plans.optimizer).join(", "),
            list.join(", "),
            bytes(p.estimate.peak_allocated)
        ));
    }
    Some(line)
}

// ---------------------------------------------------------------------------------
// The rows of `--csv` (the one schema: `runs::schema`).

/// Writes `rows` as CSV to standard output, a header first (the rows of
/// `tch-memprof estimate`, `plan` and `replay --csv`: `runs::schema`).
pub fn csv_to_stdout<R: serde::Serialize>(
    rows: impl IntoIterator<Item = R>,
) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_writer(std::io::stdout().lock());
    for row in rows {
        w.serialize(row)?;
    }
    w.flush()?;
    Ok(())
}

/// Its row of `tch-memprof estimate --csv`: `model` names it, `largest_batch` marks
/// the largest batch that fits.
pub(crate) fn estimate_row(
    e: &Estimate,
    model: &str,
    largest_batch: bool,
) -> crate::runs::schema::EstimateRow {
    crate::runs::schema::EstimateRow {
        model: model.to_string(),
        batch: e.batch,
        mode: e.mode.label(),
        weights_bytes: e.weights_bytes,
        peak_allocated_bytes: e.peak_allocated,
        peak_reserved_bytes: e.peak_reserved,
        largest_batch,
        attention: e.attention.label(),
        autocast: autocast_name(e.autocast).to_string(),
        idle_bytes: e.idle().map_or(0, |i| i.bytes),
        peak_if_dropped_bytes: e.idle().map_or(e.peak_allocated, |i| i.peak_if_dropped),
    }
}

/// The rows of `tch-memprof plan --csv` of `model`: a row per plan that fits, the
/// cheapest first.
pub(crate) fn plan_rows(plans: &Plans, model: &str) -> Vec<crate::runs::schema::PlanRow> {
    plans
        .fits
        .iter()
        .enumerate()
        .map(|(i, p)| crate::runs::schema::PlanRow {
            model: model.to_string(),
            rank: i + 1,
            levers: levers(p, plans.optimizer).join("; "),
            batch: plans.batch,
            micro_batch: p.micro_batch,
            accumulate: p.config.accumulate,
            autocast: autocast_name(p.config.autocast).to_string(),
            optimizer: p.config.optimizer.name().to_string(),
            checkpoint: p
                .config
                .checkpoint
                .map_or("off".to_string(), |k| k.to_string()),
            recompute: (p.cost.recompute * 1e4).round() / 1e4,
            zero_grad_first: p.config.zero_grad_first,
            pytorch_cuda_alloc_conf: p.config.allocator_conf.clone(),
            peak_allocated_bytes: p.estimate.peak_allocated,
            peak_reserved_bytes: p.estimate.peak_reserved,
            margin_bytes: p.margin(plans.memory),
            changes_training: p.cost.changes_training,
        })
        .collect()
}

/// A warning in one line where the batch that fits leaves less of the memory than the
/// estimate's measured error ([`thin_margin_line`]).
pub(crate) fn fit_thin_margin_line(fit: &Fit) -> Option<String> {
    let margin = fit.margin()?;
    let what = if fit.fixed_batch() {
        format!("the program's batch {}", fit.batch)
    } else {
        format!("batch {}", fit.batch)
    };
    thin_margin_line(&what, margin, fit.memory)
}

/// One estimate as `tch-memprof estimate` prints a batch of it: its row of the table
/// (peak allocated and reserved, by category), where the step peaked, and the anatomy
/// of its three largest layers where the step has layers.
impl fmt::Display for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = std::slice::from_ref(self);
        write!(f, "{}{}", table(rows, None), peak_lines(rows))?;
        if let Some(a) = anatomy(self, 3) {
            write!(f, "\n{a}")?;
        }
        Ok(())
    }
}
