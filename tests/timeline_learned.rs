//! The step timeline records ops only in the iterations that learn them (the first two,
//! every 64th, and after a step that parted from the learned ones); a step in between
//! records its blocks alone and takes its op events from the last learning step's log
//! where its blocks are the same (src/profiler/template.rs). These tests hold such
//! steps to the same step with every op recorded and to FLOPs computed by hand, where
//! the ops stay the same, where the batch changes size and where a free moves.

mod common;

use common::*;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::{MemoryProfiler, StepProfile};

/// Trains the reference MLP one step a batch size of `batches`, with the timeline on and
/// step `step` profiled (with its detail, every op recorded, when `detail`); that step's
/// profile, the blocks of the run that took what they needed from the learned ones, and
/// whether libtorch recorded every op in that step.
fn run_with(batches: &[i64], step: u64, detail: bool) -> (StepProfile, u64, bool) {
    let _guard = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(step)
        .idle_at_peak(detail)
        .build()
        .unwrap();
    let mut looked_up = 0;
    let mut recorded = true;
    for (k, &b) in batches.iter().enumerate() {
        let x = Tensor::randn([b, IN], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(OUT, [b], (Kind::Int64, Device::Cpu));
        let loss = net.forward(&x).cross_entropy_for_logits(&y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        drop((x, y, loss));
        // Read before record_stats: the count is the session's.
        looked_up = tch_memprof::__private::looked_up_ops();
        if k as u64 + 1 == step {
            recorded = tch_memprof::__private::records_every_op();
        }
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    let p = prof.step_profile().expect("the step was profiled").clone();
    (p, looked_up, recorded)
}

fn run(batches: &[i64], step: u64) -> (StepProfile, u64) {
    let (p, n, _) = run_with(batches, step, false);
    (p, n)
}

/// Forward FLOPs of the MLP at batch `b`, by hand as in `timeline_mlp.rs`: the two
/// matrix products (2 per multiply-add), ReLU 1 per element, log_softmax 5 and NLL 1 per
/// element of the b x OUT log-probabilities.
fn forward_flops(b: i64) -> u64 {
    (2 * b * IN * HIDDEN + b * HIDDEN + 2 * b * HIDDEN * OUT + 6 * b * OUT) as u64
}

/// What a profile says of the step's ops, FLOPs and layers, as text: each op with its
/// layer, the FLOPs of each phase, the uncounted ops and the layer table.
fn shape(p: &StepProfile) -> String {
    let rows: Vec<(&str, &str)> = p.rows.iter().map(|r| (&*r.op, &*r.layer)).collect();
    let flops = [p.forward_flops, p.backward_flops, p.optimizer_flops];
    let uncounted: Vec<&str> = p.uncounted_ops.iter().map(|u| &*u.op).collect();
    format!("{rows:?}\n{flops:?}\n{uncounted:?}\n{:?}", p.layers)
}

#[test]
fn a_step_that_looks_its_ops_up_profiles_as_the_step_that_learned_them() {
    let (learned, _) = run(&[B, B], 2);
    let (looked_up, n) = run(&[B; 5], 5);
    assert!(n > 0, "steps 3 to 5 took nothing from the learned ops");
    assert_eq!(shape(&looked_up), shape(&learned));
    assert_eq!(looked_up.forward_flops, forward_flops(B));
    assert!(looked_up.backward_flops > 0);
    assert!(looked_up
        .layers
        .iter()
        .any(|l| l.layer == "l1" && l.forward_flops > 0));
}

/// Everything a profile says of its step but the step's number and the detail's idle
/// blocks, a line each.
fn whole(p: &StepProfile) -> Vec<String> {
    let mut lines: Vec<String> = shape(p).lines().map(String::from).collect();
    lines.extend(p.rows.iter().map(|r| {
        format!(
            "{} {} {:?} {} {:?} {} {}",
            r.op_index, r.op, r.phase, r.layer, r.bytes, r.allocated_bytes, r.peak_bytes
        )
    }));
    lines.push(format!("{:?}", p.peak));
    lines.push(format!(
        "{:?} {} {}",
        p.category_max, p.start_bytes, p.complete
    ));
    lines
}

/// The first line where two profiles differ, if any.
fn first_difference(a: &[String], b: &[String]) -> Option<String> {
    if let Some((x, y)) = a.iter().zip(b).find(|(x, y)| x != y) {
        return Some(format!("{x}\n   vs\n{y}"));
    }
    (a.len() != b.len()).then(|| format!("{} lines vs {}", a.len(), b.len()))
}

#[test]
fn a_step_without_op_records_profiles_as_the_same_step_with_them() {
    // Step 5 records no op (steps 1 and 2 learned them); with its detail on, the same
    // step records every op with its inputs, as every step did before the ops were
    // learned. The two profiles are the same, op by op and byte for byte.
    let (templated, _, recorded) = run_with(&[B; 5], 5, false);
    assert!(
        !recorded,
        "step 5 recorded every op: nothing was taken from the learned step"
    );
    assert!(templated.ops_recorded);
    let (detailed, _, recorded) = run_with(&[B; 5], 5, true);
    assert!(recorded, "step 5 with its detail did not record its ops");
    assert!(detailed.idle.is_some());
    assert_eq!(
        first_difference(&whole(&templated), &whole(&detailed)),
        None
    );
    assert!(templated.rows.len() > 10, "{} rows", templated.rows.len());
}

#[test]
fn a_batch_of_another_size_records_its_ops_from_where_it_parts() {
    // Steps 3 to 5 take their ops from the ones learned at batch B; step 6 runs them on
    // a batch twice as large. Its first allocation (the batch) is of another size: every
    // op after it is recorded with its own inputs, whose FLOPs are twice as many; the
    // op that made the batch is not known as such.
    let (reference, _) = run(&[2 * B, 2 * B], 2);
    let (changed, n) = run(&[B, B, B, B, B, 2 * B], 6);
    assert!(n > 0, "steps 3 to 5 took nothing from the learned ops");
    assert!(!changed.ops_recorded);
    assert!(reference.ops_recorded);
    assert_eq!(changed.forward_flops, forward_flops(2 * B));
    assert_eq!(changed.backward_flops, reference.backward_flops);
    assert_eq!(changed.peak.bytes, reference.peak.bytes);
    assert_eq!(changed.category_max, reference.category_max);
    let ops = |p: &StepProfile| -> Vec<String> {
        p.rows
            .iter()
            .map(|r| format!("{} {}", r.op, r.layer))
            .collect()
    };
    // The batch's op parted inside it, where it fills the batch: that op is recorded
    // as an op of its own, every one after it as in the reference.
    assert_eq!(ops(&reference)[0], "aten::randn (none)");
    assert_eq!(ops(&changed)[0], "aten::normal_ (none)");
    assert_eq!(ops(&changed)[1..], ops(&reference)[1..]);
}

#[test]
fn a_step_whose_frees_move_has_no_ops_and_the_next_learns() {
    // The same allocations every step, but at step 5 a block made at its start is
    // freed before backward, not after the optimizer: its blocks match the learned ones
    // to the end, the log does not. Step 5 has no ops, and says so, with its peak and
    // categories exact (the same step with every op recorded); step 6 learns again.
    let steps = |profiled: u64, detail: bool| {
        let _guard = serial();
        let vs = nn::VarStore::new(Device::Cpu);
        let net = mlp(&vs);
        let mut opt = nn::Sgd::default().build(&vs, 1e-3).unwrap();
        let mut prof = MemoryProfiler::builder(&vs)
            .print(false)
            .timeline_step(profiled)
            .idle_at_peak(detail)
            .build()
            .unwrap();
        let mut recorded = Vec::new();
        for step in 1..=6u64 {
            let extra = Tensor::zeros([4096], (Kind::Float, Device::Cpu));
            let x = Tensor::randn([B, IN], (Kind::Float, Device::Cpu));
            let y = Tensor::randint(OUT, [B], (Kind::Int64, Device::Cpu));
            let loss = net.forward(&x).cross_entropy_for_logits(&y);
            let mut extra = Some(extra);
            if step == 5 {
                extra = None;
            }
            opt.zero_grad();
            loss.backward();
            opt.step();
            drop((x, y, loss, extra));
            recorded.push(tch_memprof::__private::records_every_op());
            prof.record_stats();
        }
        assert_eq!(prof.failures(), 0);
        (prof.step_profile().expect("profiled").clone(), recorded)
    };
    let (moved, recorded) = steps(5, false);
    assert_eq!(recorded, [true, true, false, false, false, true]);
    assert!(!moved.ops_recorded);
    assert!(moved.rows.is_empty());
    assert_eq!(moved.forward_flops, 0);
    let (detailed, _) = steps(5, true);
    assert!(detailed.ops_recorded);
    assert_eq!(moved.peak.bytes, detailed.peak.bytes);
    assert_eq!(moved.peak.breakdown, detailed.peak.breakdown);
    assert_eq!(moved.category_max, detailed.category_max);
    let (after, _) = steps(6, false);
    assert!(after.ops_recorded);
    assert!(!after.rows.is_empty());
}

#[test]
fn flops_learned_for_other_sizes_are_never_claimed() {
    // Steps 1 to 4 multiply 4 sequences of 64 by their transposes; step 5 multiplies 8
    // of 32: the same bytes in (the learned blocks before the product match), other
    // FLOPs, and an output of other size, where step 5 parts from the learned ones,
    // inside the product. Its FLOPs are not the learned ones, and it says its ops are
    // not all known.
    let _guard = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(5)
        .build()
        .unwrap();
    let _no_grad = tch::no_grad_guard();
    let mut looked_up = 0;
    for step in 1..=5 {
        let (b, l) = if step < 5 { (4, 64) } else { (8, 32) };
        let x = Tensor::randn([b, l, 32], (Kind::Float, Device::Cpu));
        drop(x.bmm(&x.transpose(1, 2)));
        looked_up = tch_memprof::__private::looked_up_ops();
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    assert!(looked_up > 0, "step 5 took nothing from the learned ops");
    let p = prof.step_profile().expect("step 5 was profiled");
    let learned = 2 * 4 * 64 * 64 * 32;
    assert_ne!(
        p.forward_flops, learned,
        "step 5 kept the FLOPs of steps 1 to 4"
    );
    assert_eq!(p.forward_flops, 0);
    assert!(!p.ops_recorded);
}
