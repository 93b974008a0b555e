//! Blocks idle at the peak: a tensor kept alive after its last read is named with its
//! bytes, maker, last reader and source line, and freeing it there measures the peak the
//! report predicted; what the step still needs (saved for backward, gradients, optimizer
//! state, the batch read later) is never idle.

mod common;

use common::*;
use tch::nn::{self, Module, OptimizerConfig};
use tch::Kind;
use tch_memprof::{IdleAtPeak, MemoryProfiler, Phase, StepProfile};

/// Step 2 of a loop over the reference MLP with `opt`, profiled with the step detail on.
fn profile_step2(
    adam: bool,
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
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(2)
        .idle_at_peak(true)
        .build()
        .unwrap();
    for _ in 0..2 {
        body(&net, &mut opt);
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    let p = prof.step_profile().expect("step 2 was profiled").clone();
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
    let (kept, idle) = profile_step2(false, |n, o| logging_step(n, o, false));
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

    let (dropped, idle_after) = profile_step2(false, |n, o| logging_step(n, o, true));
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
