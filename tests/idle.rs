//! Blocks idle at the peak: a tensor kept alive after its last read is named with its
//! bytes, maker, last reader and source line, and freeing it there measures the peak the
//! report predicted; what the step still needs (saved for backward, gradients, optimizer
//! state, the batch read later) is never idle.

mod common;

use common::*;
use tch::nn::{self, Module, OptimizerConfig};
use tch::Kind;
use tch_memprof::{Category, IdleAtPeak, MemoryProfiler, Phase, StepProfile};

/// Step `step` of a loop over the reference MLP with SGD (or Adam), profiled with the
/// step detail on (and its CSV files in `csv`).
fn profile(
    adam: bool,
    step: u64,
    csv: Option<&std::path::Path>,
    body: impl Fn(&nn::Sequential, &mut nn::Optimizer),
) -> (StepProfile, IdleAtPeak) {
    let _serial = serial();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", IN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(
            vs.root() / "l2",
            HIDDEN,
            OUT,
            Default::default(),
        ));
    let mut opt = if adam {
        nn::Adam::default().build(&vs, 1e-3).unwrap()
    } else {
        nn::Sgd::default().build(&vs, 1e-2).unwrap()
    };
    let mut builder = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(step)
        .idle_at_peak(true);
    if let Some(dir) = csv {
        builder = builder.csv(true).csv_dir(dir);
    }
    let mut prof = builder.build().unwrap();
    for _ in 0..step {
        body(&net, &mut opt);
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    let p = prof.step_profile().expect("the step was profiled").clone();
    let idle = p.idle.clone().expect("the step detail was on");
    (p, idle)
}

fn show(idle: &IdleAtPeak) -> String {
    let mut s = format!(
        "peak {} -> {} ({} idle bytes)\n",
        idle.peak, idle.peak_if_dropped, idle.bytes
    );
    for b in &idle.blocks {
        s += &format!(
            "  {} {} ({:?}, {}) last read {} freed {} at {} -> {}\n",
            b.bytes,
            b.op,
            b.phase,
            b.layer,
            b.last_read_op,
            b.freed_at_op,
            b.site,
            b.peak_if_dropped
        );
    }
    s
}

/// The line of the `let` that holds the logging tensor, set by the loop.
static LOGGED_LINE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// One step that scales its input for logging, reads it once with a `mean` under
/// `no_grad`, and keeps the binding to the end of the step (or drops it after the mean).
fn logging_step(net: &nn::Sequential, opt: &mut nn::Optimizer, drop_it: bool) {
    let b = batch();
    let (logged, line) = (b.x.g_mul_scalar(2.0), line!());
    LOGGED_LINE.store(line, std::sync::atomic::Ordering::Relaxed);
    let mean = tch::no_grad(|| logged.mean(Kind::Float)).double_value(&[]);
    assert!(mean.is_finite());
    if drop_it {
        drop(logged);
    }
    opt.zero_grad();
    net.forward(&b.x).cross_entropy_for_logits(&b.y).backward();
    opt.step();
}

#[test]
fn a_tensor_kept_after_its_last_read_is_named_and_dropping_it_measures_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let (kept, idle) = profile(false, 2, Some(dir.path()), |n, o| logging_step(n, o, false));
    eprintln!("kept:\n{}", show(&idle));
    let x_bytes = F32 * (B * IN) as u64;
    let site = format!(
        "{}:{}",
        file!(),
        LOGGED_LINE.load(std::sync::atomic::Ordering::Relaxed)
    );
    let logged: Vec<_> = idle.blocks.iter().filter(|b| b.site == site).collect();
    assert_eq!(logged.len(), 1, "{}", show(&idle));
    let l = logged[0];
    assert_eq!(l.bytes, x_bytes);
    assert_eq!(l.op, "aten::mul");
    assert_eq!(l.last_read_op, "aten::mean");
    assert_eq!(l.phase, Phase::Forward);
    assert_eq!(idle.peak, kept.peak.bytes);
    assert!(l.peak_if_dropped < kept.peak.bytes, "{}", show(&idle));

    // The CSV file: one row per idle block, as the profile has them.
    let run = tch_memprof::runs::Run::open(dir.path()).unwrap();
    assert_eq!(run.idle.len(), idle.blocks.len());
    for (row, b) in run.idle.iter().zip(&idle.blocks) {
        assert_eq!(
            (
                row.bytes,
                &row.op,
                &row.last_read_op,
                &row.site,
                row.peak_if_dropped
            ),
            (b.bytes, &b.op, &b.last_read_op, &b.site, b.peak_if_dropped)
        );
    }

    let (dropped, idle_after) = profile(false, 2, None, |n, o| logging_step(n, o, true));
    eprintln!("dropped:\n{}", show(&idle_after));
    assert_eq!(dropped.peak.bytes, l.peak_if_dropped);
    assert!(
        idle_after
            .blocks
            .iter()
            .all(|b| b.site != site && b.bytes < x_bytes),
        "{}",
        show(&idle_after)
    );
}

/// The plain loop, gradients cleared before the forward pass.
fn plain_step(net: &nn::Sequential, opt: &mut nn::Optimizer) {
    let b = batch();
    opt.zero_grad();
    let loss = net.forward(&b.x).cross_entropy_for_logits(&b.y);
    loss.backward();
    opt.step();
}

/// Small blocks the loop's expressions hold to the statement's end, idle for real: the
/// logits (read last by log_softmax), the loss and the gradient seed (scalars).
fn only_expression_temporaries(idle: &IdleAtPeak) -> bool {
    idle.blocks
        .iter()
        .all(|b| b.bytes <= F32 * (B * OUT) as u64 && b.site != tch_memprof::UNKNOWN_SITE)
}

#[test]
fn tensors_saved_for_backward_are_not_idle_at_a_backward_peak() {
    let (p, idle) = profile(false, 2, None, plain_step);
    eprintln!("{}", show(&idle));
    // The peak is in backward. The inputs x were read in the forward pass only by the
    // first layer's addmm, which saved them for its AddmmBackward0: the backward node reads
    // them (through the mm it runs) at or after the peak.
    assert_eq!(p.peak.phase, Some(Phase::Backward), "{}", p.peak.location());
    let x = F32 * (B * IN) as u64;
    assert!(p.peak.breakdown.get(Category::Act) >= x);
    assert!(
        idle.blocks
            .iter()
            .all(|b| b.op != "aten::randn" && b.bytes < x),
        "{}",
        show(&idle)
    );
    assert!(only_expression_temporaries(&idle), "{}", show(&idle));
}

#[test]
fn gradients_and_optimizer_state_are_not_idle_at_an_optimizer_peak() {
    // Step 1 with Adam: the gradients are made by this step's backward and its state by
    // this step's optimizer, which updates one variable after another, so at its peak
    // the gradients and state of the variables updated first were read for the last time
    // in this step. They are kept for the next one.
    let (p, idle) = profile(true, 1, None, plain_step);
    eprintln!("{}", show(&idle));
    assert_eq!(
        p.peak.phase,
        Some(Phase::Optimizer),
        "{}",
        p.peak.location()
    );
    // Every gradient and the state made so far are live at the peak.
    assert_eq!(p.peak.breakdown.get(Category::Grad), mlp_weight_bytes());
    assert!(p.peak.breakdown.get(Category::Opt) > 0);
    assert!(
        idle.blocks
            .iter()
            .all(|b| b.phase != Phase::Optimizer && b.phase != Phase::Backward),
        "{}",
        show(&idle)
    );
}

#[test]
fn the_batch_read_after_the_peak_is_not_idle_and_the_part_read_before_it_is() {
    // At the backward peak the inputs x are still to be read by the first layer's
    // AddmmBackward0 (its weight gradient); the targets were read last by
    // NllLossBackward0, before the peak, and the loop holds them to its end.
    let (p, idle) = profile(false, 2, None, plain_step);
    eprintln!("{}", show(&idle));
    assert_eq!(p.peak.phase, Some(Phase::Backward), "{}", p.peak.location());
    let batch: Vec<_> = idle
        .blocks
        .iter()
        .filter(|b| b.op.starts_with("aten::rand"))
        .collect();
    assert_eq!(batch.len(), 1, "{}", show(&idle));
    assert_eq!(batch[0].op, "aten::randint");
    assert_eq!(batch[0].bytes, 8 * B as u64);
    assert_eq!(batch[0].last_read_op, "NllLossBackward0");
    assert!(
        batch[0].site.starts_with("tests/common/mod.rs:"),
        "{}",
        batch[0].site
    );
}

#[test]
fn idle_at_peak_needs_the_step_it_examines() {
    let _serial = serial();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let err = MemoryProfiler::builder(&vs)
        .idle_at_peak(true)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("idle_at_peak") && err.contains("timeline_step"),
        "{err}"
    );
}
