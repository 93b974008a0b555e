//! The terminal: tables on standard output, and the text of leak and OOM reports.

use std::io::Write;

use comfy_table::{Cell, ColumnConstraint, Width};

use crate::error::Result;
use crate::format;
use crate::leaks::LeakReport;
use crate::oom::OomReport;
use crate::stats::{EpochStats, IterationStats, VariableKind};
use crate::timeline::{Category, StepKind, StepProfile};

use super::{right, table, Report};

/// Prints tables to standard output.
pub(crate) struct TerminalReport {
    pub top_variables: usize,
    /// Layers listed in a step profile's tables.
    pub top_layers: usize,
}

impl Report for TerminalReport {
    fn iteration(&mut self, stats: &IterationStats) -> Result<()> {
        write_stdout(&render_iteration(stats, self.top_variables))
    }
    fn epoch(&mut self, stats: &EpochStats) -> Result<()> {
        write_stdout(&render_epoch(stats))
    }
    fn step_profile(&mut self, p: &StepProfile, kind: StepKind) -> Result<()> {
        let why = match kind {
            StepKind::Requested(_) => "the step asked for with timeline_step",
            StepKind::Peak => "the step with the run's highest peak so far",
            StepKind::PeakAtExit => return Ok(()),
        };
        write_stdout(&render_step(p, why, self.top_layers))
    }
    fn leaks(&mut self, report: &LeakReport) -> Result<()> {
        write_stdout(&report.to_string())
    }
    fn oom(&mut self, report: &OomReport) -> Result<()> {
        // Not through Rust's stdout lock: the thread that ran out of memory may be
        // the one holding it.
        crate::ffi::write_stdout_unlocked(&report.to_string())
    }
    fn name(&self) -> &'static str {
        "terminal"
    }
}

pub(crate) fn write_stdout(text: &str) -> Result<()> {
    // Not println!: it panics when stdout is closed.
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|source| crate::Error::Io {
            path: "<stdout>".into(),
            source,
        })
}

/// The terminal report of a step profile: the peak and its split, each category's
/// maximum, the top layers by activation memory and by FLOPs, uncounted ops.
pub(crate) fn render_step(p: &StepProfile, why: &str, top: usize) -> String {
    let mut out = format!(
        "step {} anatomy (epoch {}, iteration {}, {}): {why}\n",
        p.step, p.epoch, p.iteration, p.device
    );
    if !p.complete {
        out.push_str("  warning: the step log overflowed or lost events; numbers are incomplete\n");
    }
    if !p.ops_recorded {
        out.push_str(
            "  warning: some of this step's ops are not known: it was unlike the steps \
             the profiler learned them from (another batch shape, a branch taken); the \
             peak and the categories are exact, the rows by op, layers and FLOPs are of \
             the ops it recorded\n",
        );
    }
    out.push_str(&format!(
        "  peak {} during {}\n",
        format::bytes(p.peak.bytes),
        p.peak.location()
    ));
    let mut t = table();
    t.set_header(vec![
        Cell::new("category"),
        right("at the peak".into()),
        right("own maximum".into()),
    ]);
    for c in Category::ALL {
        t.add_row(vec![
            Cell::new(c.label()),
            right(format::bytes(p.peak.breakdown.get(c))),
            right(format::bytes(p.category_max.get(c))),
        ]);
    }
    out.push_str(&t.to_string());
    out.push('\n');
    if let Some(idle) = &p.idle {
        out.push_str(&super::idle_text::render_idle(idle, top));
    }

    let mut by_act: Vec<_> = p.layers.iter().filter(|l| l.activation_bytes > 0).collect();
    by_act.sort_by_key(|l| std::cmp::Reverse(l.activation_bytes));
    if !by_act.is_empty() {
        out.push_str(&format!(
            "  top {} of {} layers by activations kept for backward\n",
            by_act.len().min(top),
            by_act.len()
        ));
        let mut t = table();
        t.set_header(vec![
            Cell::new("layer"),
            right("activations".into()),
            right("parameters".into()),
        ]);
        for l in by_act.iter().take(top) {
            t.add_row(vec![
                Cell::new(&l.layer),
                right(format::bytes(l.activation_bytes)),
                right(format::bytes(l.parameters_bytes)),
            ]);
        }
        out.push_str(&t.to_string());
        out.push('\n');
    }
    let mut by_flops: Vec<_> = p
        .layers
        .iter()
        .filter(|l| l.forward_flops + l.backward_flops > 0)
        .collect();
    by_flops.sort_by_key(|l| std::cmp::Reverse(l.forward_flops + l.backward_flops));
    if !by_flops.is_empty() {
        out.push_str(&format!(
            "  top {} of {} layers by FLOPs (forward + backward)\n",
            by_flops.len().min(top),
            by_flops.len()
        ));
        let mut t = table();
        t.set_header(vec![
            Cell::new("layer"),
            right("forward".into()),
            right("backward".into()),
        ]);
        for l in by_flops.iter().take(top) {
            t.add_row(vec![
                Cell::new(&l.layer),
                right(format::flops(l.forward_flops)),
                right(format::flops(l.backward_flops)),
            ]);
        }
        out.push_str(&t.to_string());
        out.push('\n');
    }
    out.push_str(&format!(
        "  FLOPs: forward {}, backward {}, optimizer {}\n",
        format::flops(p.forward_flops),
        format::flops(p.backward_flops),
        format::flops(p.optimizer_flops),
    ));
    if !p.uncounted_ops.is_empty() {
        let list: Vec<String> = p
            .uncounted_ops
            .iter()
            .take(8)
            .map(|u| format!("{} x{}", u.op, u.calls))
            .collect();
        let more = p.uncounted_ops.len().saturating_sub(8);
        out.push_str(&format!(
            "  not counted (no FLOP formula): {}{}\n",
            list.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    out
}

/// The terminal report of one iteration.
pub(crate) fn render_iteration(s: &IterationStats, top: usize) -> String {
    let on_cpu = s.device == "cpu";
    let mut t = table();
    t.set_header(vec![
        Cell::new("memory"),
        right("current".into()),
        right("peak".into()),
    ]);
    let reserved = if on_cpu {
        "resident (process RSS)"
    } else {
        "reserved (cached)"
    };
    t.add_row(vec![
        Cell::new(reserved),
        right(format::bytes(s.reserved_bytes)),
        right(format::bytes(s.peak_reserved_bytes)),
    ]);
    t.add_row(vec![
        Cell::new("allocated"),
        right(format::bytes(s.allocated_bytes)),
        right(format::bytes(s.peak_allocated_bytes)),
    ]);
    let nweights = s
        .variables
        .iter()
        .filter(|v| v.kind == VariableKind::Weight)
        .count();
    let nbuffers = s.variables.len() - nweights;
    let rows: [(String, u64, bool); 8] = [
        (
            format!("  weights ({nweights} parameters)"),
            s.weights_bytes - s.buffers_bytes,
            false,
        ),
        (format!("  buffers ({nbuffers})"), s.buffers_bytes, false),
        ("  weight gradients".into(), s.gradients_bytes, false),
        ("  optimizer state".into(), s.optimizer_state_bytes, false),
        ("  cuBLAS workspaces".into(), s.blas_workspaces_bytes, false),
        ("  other".into(), s.other_bytes, false),
        (
            "feature maps (at backward start)".into(),
            s.feature_maps_bytes,
            true,
        ),
        (
            if s.intermediate_gradients_exact {
                "intermediate gradients (backward)".into()
            } else {
                "intermediate gradients (backward, lower bound)".into()
            },
            s.intermediate_gradients_bytes,
            true,
        ),
    ];
    let on_cuda = s.device.starts_with("cuda");
    for (label, bytes, is_peak) in rows {
        // The workspaces are a CUDA line: a CPU run has none to name.
        if label == "  cuBLAS workspaces" && !on_cuda {
            continue;
        }
        let (cur, peak) = if is_peak {
            (String::new(), format::bytes(bytes))
        } else {
            (format::bytes(bytes), String::new())
        };
        t.add_row(vec![Cell::new(label), right(cur), right(peak)]);
    }
    let mut out = format!(
        "\ntch-memprof · epoch {} · iteration {} (step {}) · {}\n{t}\n",
        s.epoch, s.iteration, s.step, s.device
    );
    if !s.cuda_devices.is_empty() {
        out.push_str(&render_cuda(&s.cuda_devices));
        out.push('\n');
    }
    if top > 0 && !s.variables.is_empty() {
        out.push_str(&render_variables(s, top));
        out.push('\n');
    }
    out
}

/// The CUDA caching allocator's own statistics, one column pair per device.
fn render_cuda(devices: &[(usize, crate::cuda::CudaStats)]) -> String {
    let mut t = table();
    let mut header = vec![Cell::new("CUDA allocator")];
    for (i, _) in devices {
        header.push(right(format!("cuda:{i} current")));
        header.push(right("peak".into()));
    }
    t.set_header(header);
    type Pick = fn(&crate::cuda::CudaStats) -> (i64, Option<i64>);
    let rows: [(&str, Pick); 6] = [
        ("allocated", |c| {
            (c.allocated_current, Some(c.allocated_peak))
        }),
        ("reserved", |c| (c.reserved_current, Some(c.reserved_peak))),
        ("active", |c| (c.active_current, Some(c.active_peak))),
        ("requested", |c| {
            (c.requested_current, Some(c.requested_peak))
        }),
        ("device free", |c| (c.free_bytes, None)),
        ("device total", |c| (c.total_bytes, None)),
    ];
    for (label, pick) in rows {
        let mut row = vec![Cell::new(label)];
        for (_, c) in devices {
            let (cur, peak) = pick(c);
            row.push(right(format::bytes(cur.max(0) as u64)));
            row.push(right(
                peak.map_or(String::new(), |p| format::bytes(p.max(0) as u64)),
            ));
        }
        t.add_row(row);
    }
    let mut counts = vec![Cell::new("alloc retries / OOMs")];
    for (_, c) in devices {
        counts.push(right(format!("{} / {}", c.alloc_retries, c.ooms)));
        counts.push(right(String::new()));
    }
    t.add_row(counts);
    t.to_string()
}

/// Largest variables first; the rest summed in one row.
fn render_variables(s: &IterationStats, top: usize) -> String {
    let mut vars: Vec<_> = s.variables.iter().collect();
    vars.sort_by(|a, b| {
        (b.bytes + b.grad_bytes.unwrap_or(0))
            .cmp(&(a.bytes + a.grad_bytes.unwrap_or(0)))
            .then(a.name.cmp(&b.name))
    });
    let mut t = table();
    t.set_header(vec![
        Cell::new("variable"),
        Cell::new("shape"),
        right("weight".into()),
        right("gradient".into()),
    ]);
    for v in vars.iter().take(top) {
        // Buffers have no gradient: their gradient cell says what they are, which keeps
        // names whole on narrow terminals.
        let grad = match (v.kind, v.grad_bytes) {
            (_, Some(g)) => format::bytes(g),
            (VariableKind::Buffer, None) => "buffer".into(),
            (VariableKind::Weight, None) => crate::names::MISSING.into(),
        };
        t.add_row(vec![
            Cell::new(&v.name),
            Cell::new(format::shape(&v.shape)),
            right(format::bytes(v.bytes)),
            right(grad),
        ]);
    }
    if vars.len() > top {
        let rest = &vars[top..];
        let w: u64 = rest.iter().map(|v| v.bytes).sum();
        let g: u64 = rest.iter().filter_map(|v| v.grad_bytes).sum();
        t.add_row(vec![
            Cell::new(format!("… {} more", rest.len())),
            Cell::new(""),
            right(format::bytes(w)),
            right(format::bytes(g)),
        ]);
    }
    t.to_string()
}

/// The terminal summary of one epoch.
pub(crate) fn render_epoch(e: &EpochStats) -> String {
    let mut t = table();
    t.set_header(vec![
        Cell::new(format!("epoch {} summary", e.epoch)),
        right("bytes".into()),
    ]);
    let rows = [
        ("iterations", e.iterations.to_string()),
        ("peak allocated", format::bytes(e.peak_allocated_bytes)),
        (
            "peak reserved / resident",
            format::bytes(e.peak_reserved_bytes),
        ),
        (
            "largest feature maps",
            format::bytes(e.peak_feature_maps_bytes),
        ),
        (
            "largest intermediate gradients",
            format::bytes(e.peak_intermediate_gradients_bytes),
        ),
        ("allocated at epoch end", format::bytes(e.allocated_bytes)),
        (
            "change since previous epoch end",
            // The first epoch has none before it: its change (everything the loop set up,
            // the optimizer's state included) would read as a leak.
            if e.epoch <= 1 {
                "n/a (first epoch)".to_string()
            } else {
                format::signed_bytes(e.allocated_change_bytes)
            },
        ),
    ];
    for (k, v) in rows {
        t.add_row(vec![Cell::new(k), right(v)]);
    }
    format!("\n{t}\n")
}

/// The report as terminal text: the suspects and, if recognised, what they mean.
impl std::fmt::Display for LeakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render_leaks(self))
    }
}

/// The report as terminal text.
impl std::fmt::Display for OomReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render_oom(self))
    }
}

fn render_oom(r: &OomReport) -> String {
    let mut out = format!(
        "OUT OF MEMORY on {} during step {}: an allocation of {} failed with {} \
         allocated\n",
        r.device,
        r.step,
        format::bytes(r.requested_bytes),
        format::bytes(r.allocated_bytes)
    );
    if let Some(reserved) = r.reserved_bytes {
        out.push_str(&format!(
            "  reserved {}: {} of it cached but free, in blocks the request did not fit \
             (fragmentation)\n",
            format::bytes(reserved),
            format::bytes(reserved.saturating_sub(r.allocated_bytes))
        ));
    }
    out.push_str("  live bytes by category:\n");
    for (c, b) in &r.by_category {
        out.push_str(&format!(
            "    {:<48} {:>12}\n",
            c.label(),
            format::bytes(*b)
        ));
    }
    out.push_str("  largest layers:\n");
    for (l, b) in &r.by_layer {
        out.push_str(&format!("    {l:<48} {:>12}\n", format::bytes(*b)));
    }
    out.push_str("  largest blocks: [category] op (phase, layer, iteration)\n");
    for b in &r.largest_blocks {
        out.push_str(&format!(
            "    {:>12}  [{}] {} ({}, {}, iteration {})\n",
            format::bytes(b.bytes),
            b.category.short(),
            b.op,
            b.phase.name(),
            b.layer,
            b.iteration
        ));
    }
    for (what, p) in [("report", &r.report_path), ("snapshot", &r.snapshot_path)] {
        if let Some(p) = p {
            out.push_str(&format!("  {what}: {}\n", p.display()));
        }
    }
    out
}

fn render_leaks(r: &LeakReport) -> String {
    let mut t = table();
    let width = t.width().map_or(100, usize::from).clamp(40, 100);
    let mut out = textwrap::fill(
        &format!(
            "LEAK SUSPECTS at the end of epoch {}: memory outside weights and gradients grew \
             by {} since the previous epoch end",
            r.epoch,
            format::signed_bytes(r.growth_bytes)
        ),
        width,
    );
    out.push('\n');
    if !r.complete {
        out.push_str(
            "  warning: more blocks were live than the registry holds; groups are incomplete\n",
        );
    }
    if let Some(g) = r.reserved_growth_bytes {
        out.push_str(&format!("  CUDA reserved: {}\n", format::signed_bytes(g)));
    }
    if !r.suspects.is_empty() {
        out.push_str("  live blocks by origin, largest growth first\n");
        t.set_header(vec![
            Cell::new("op\n(phase, layer)"),
            Cell::new("iters"),
            right("blocks".into()),
            right("bytes".into()),
            right("growth".into()),
        ]);
        // Op names and counts stay whole on a narrow terminal; units may go to the next
        // line, and so may the layer.
        let longest_op = r.suspects.iter().map(|g| g.op.len()).max().unwrap_or(2);
        t.set_constraints(vec![
            ColumnConstraint::LowerBoundary(Width::Fixed(longest_op.min(40) as u16 + 2)),
            ColumnConstraint::ContentWidth,
            ColumnConstraint::ContentWidth,
        ]);
        for g in &r.suspects {
            t.add_row(vec![
                Cell::new(format!("{}\n({}, {})", g.op, g.phase.name(), g.layer)),
                Cell::new(format!("{}..={}", g.first_iteration, g.last_iteration)),
                right(g.count.to_string()),
                right(format::bytes(g.bytes)),
                right(format::signed_bytes(g.growth_bytes)),
            ]);
        }
        out.push_str(&t.to_string());
        out.push('\n');
    }
    if let Some(p) = r.pattern {
        let text = format!("what it looks like: {}", p.explanation());
        let opts = textwrap::Options::new(width)
            .initial_indent("  ")
            .subsequent_indent("  ");
        out.push_str(&textwrap::fill(&text, opts));
        out.push('\n');
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::stats::VariableStats;
    use crate::timeline::{LayerProfile, UncountedOp};

    #[test]
    fn step_report_ranks_layers_and_lists_uncounted_ops() {
        let layer = |name: &str, act: u64, fwd: u64| LayerProfile {
            layer: name.into(),
            activation_bytes: act,
            forward_flops: fwd,
            ..LayerProfile::default()
        };
        let p = StepProfile {
            layers: vec![
                layer("small", 10, 5_000),
                layer("big", 4096, 10),
                layer("none", 0, 0),
            ],
            uncounted_ops: vec![UncountedOp {
                op: "aten::cumsum".into(),
                calls: 3,
            }],
            complete: true,
            ops_recorded: true,
            ..StepProfile::default()
        };
        let text = render_step(&p, "test", 10);
        let (big, small) = (text.find("big").unwrap(), text.find("small").unwrap());
        assert!(big < small, "activations table: largest first\n{text}");
        assert!(text.contains("top 2 of 2 layers by activations"), "{text}");
        let flops_table = &text[text.find("by FLOPs").unwrap()..];
        assert!(flops_table.find("small").unwrap() < flops_table.find("big").unwrap());
        assert!(text.contains("aten::cumsum x3"), "{text}");
        assert!(
            !text.contains("warning"),
            "complete profiles carry no warning"
        );
        let unknown = StepProfile {
            ops_recorded: false,
            ..p.clone()
        };
        let text = render_step(&unknown, "test", 10);
        assert!(
            text.contains("warning: some of this step's ops are not known"),
            "{text}"
        );
    }

    /// An iteration of `n` variables (`layer1` a buffer), every other number 0.
    pub(crate) fn stats(n: u64) -> IterationStats {
        let variables = (1..=n)
            .map(|i| VariableStats {
                name: format!("layer{i}.weight"),
                kind: if i == 1 {
                    VariableKind::Buffer
                } else {
                    VariableKind::Weight
                },
                dtype: "Float".into(),
                shape: vec![i as i64],
                bytes: 1024 * i,
                grad_bytes: (i != 1).then_some(1024 * i),
            })
            .collect();
        IterationStats {
            epoch: 1,
            iteration: 2,
            step: 2,
            device: "cpu".into(),
            allocated_bytes: 0,
            peak_allocated_bytes: 0,
            reserved_bytes: 0,
            peak_reserved_bytes: 0,
            weights_bytes: 0,
            buffers_bytes: 0,
            gradients_bytes: 0,
            feature_maps_bytes: 0,
            intermediate_gradients_bytes: 0,
            intermediate_gradients_exact: true,
            optimizer_state_bytes: 0,
            blas_workspaces_bytes: 0,
            other_bytes: 0,
            backward_passes: 1,
            variables,
            cuda: None,
            cuda_devices: Vec::new(),
        }
    }

    pub(crate) fn cuda_stats(allocated: i64) -> crate::cuda::CudaStats {
        crate::cuda::CudaStats {
            allocated_current: allocated,
            allocated_peak: 2 * allocated,
            reserved_current: 4 * allocated,
            reserved_peak: 8 * allocated,
            active_current: allocated,
            active_peak: 2 * allocated,
            requested_current: allocated - 100,
            requested_peak: 2 * allocated - 100,
            alloc_retries: 3,
            ooms: 1,
            free_bytes: 1 << 30,
            total_bytes: 80 << 30,
        }
    }

    #[test]
    fn cuda_runs_show_the_allocators_statistics_for_every_device_in_use() {
        let mut s = stats(2);
        s.device = "cuda:0".into();
        s.cuda = Some(cuda_stats(1 << 20));
        s.cuda_devices = vec![(0, cuda_stats(1 << 20)), (1, cuda_stats(2 << 20))];
        s.blas_workspaces_bytes = 65 << 20;
        let text = render_iteration(&s, 0);
        for needle in [
            "cuda:0 current",
            "cuda:1 current",
            "reserved (cached)",
            "3 / 1",
            "cuBLAS workspaces",
            "65.00 MiB",
        ] {
            assert!(text.contains(needle), "{needle:?} missing:\n{text}");
        }
        let cuda_table = &text[text.find("CUDA allocator").unwrap()..];
        let reserved = cuda_table
            .lines()
            .find(|l| l.contains("│ reserved "))
            .unwrap();
        // cuda:0 reserved 4 MiB (peak 8), cuda:1 8 MiB (peak 16).
        for v in ["4.00 MiB", "8.00 MiB", "16.00 MiB"] {
            assert!(reserved.contains(v), "{v} missing: {reserved}");
        }
        assert!(text.contains("80.00 GiB"), "{text}");
        let cpu = render_iteration(&stats(2), 0);
        assert!(
            !cpu.contains("CUDA allocator") && !cpu.contains("cuBLAS"),
            "{cpu}"
        );
    }

    #[test]
    fn largest_variables_first_and_the_rest_summed() {
        let text = render_variables(&stats(12), 3);
        let l12 = text.find("layer12.weight").unwrap();
        let l11 = text.find("layer11.weight").unwrap();
        let l10 = text.find("layer10.weight").unwrap();
        assert!(l12 < l11 && l11 < l10, "{text}");
        assert!(!text.contains("layer9.weight"), "{text}");
        // The other 9: weights 1..=9 KiB sum to 45 KiB; gradients skip the buffer (1 KiB).
        assert!(text.contains("… 9 more"), "{text}");
        assert!(
            text.contains("45.00 KiB") && text.contains("44.00 KiB"),
            "{text}"
        );
    }

    #[test]
    fn buffers_are_named_in_the_gradient_column() {
        let text = render_variables(&stats(2), 10);
        let row = text.lines().find(|l| l.contains("layer1.weight")).unwrap();
        assert!(row.contains("buffer"), "{row}");
    }

    #[test]
    fn zero_top_hides_the_variable_table() {
        let text = render_iteration(&stats(3), 0);
        assert!(!text.contains("layer1.weight"));
        assert!(text.contains("epoch 1 · iteration 2 (step 2) · cpu"));
    }
}
