//! The step timeline asks libtorch for op inputs only while it learns what the loop's ops
//! take from them (their layers and variables, the FLOPs of counted ops): the first two
//! iterations, every 64th, and after a step that parted from the learned ops. These tests
//! hold the steps in between, which look them up, to the steps that learned them and to
//! FLOPs computed by hand, where the ops stay the same and where the batch changes size.

mod common;

use common::*;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::{MemoryProfiler, StepProfile};

/// Trains the reference MLP one step a batch size of `batches`, with the timeline on and
/// step `step` profiled; that step's profile, and the ops of the run that took what they
/// needed from the learned ones.
fn run(batches: &[i64], step: u64) -> (StepProfile, u64) {
    let _guard = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(step)
        .build()
        .unwrap();
    let mut looked_up = 0;
    for &b in batches {
        let x = Tensor::randn([b, IN], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(OUT, [b], (Kind::Int64, Device::Cpu));
        let loss = net.forward(&x).cross_entropy_for_logits(&y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        drop((x, y, loss));
        // Read before record_stats: the count is the session's.
        looked_up = tch_memprof::__private::looked_up_ops();
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    let p = prof.step_profile().expect("the step was profiled").clone();
    (p, looked_up)
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

#[test]
fn a_batch_of_another_size_is_counted_from_its_own_inputs() {
    // Steps 3 to 5 look up the ops learned at batch B; step 6 runs the same ops on a
    // batch twice as large, whose FLOPs are twice as many.
    let (reference, _) = run(&[2 * B, 2 * B], 2);
    let (changed, n) = run(&[B, B, B, B, B, 2 * B], 6);
    assert!(n > 0, "steps 3 to 5 took nothing from the learned ops");
    assert_eq!(changed.forward_flops, forward_flops(2 * B));
    assert_eq!(shape(&changed), shape(&reference));
}

#[test]
fn flops_looked_up_for_an_op_that_then_allocates_other_sizes_are_not_counted() {
    // Steps 1 to 4 multiply 4 sequences of 64 by their transposes; step 5 multiplies 8
    // of 32: the same bytes in (the learned sizes before the product match), other
    // FLOPs, and an output of other size, which the product's end catches.
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
    assert!(
        p.uncounted_ops.iter().any(|u| u.op == "aten::bmm"),
        "uncounted: {:?}",
        p.uncounted_ops
    );
}
