//! One op callback serves the profiled loop and the estimator's dry run, and each thread
//! records into one of them: an estimate made inside a profiled step, on the loop's own
//! thread, between its forward and backward passes, leaves that step's profile as it
//! is (the same ops, the same bytes after every op, the same peak and phases), and the
//! estimate is the one made outside any loop.

mod common;

use common::{batch, mlp};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind};
use tch_memprof::estimate::{Input, Mode, Model, Optimizer, Options};
use tch_memprof::{MemoryProfiler, StepProfile};

/// An estimate of a small model of its own (a dry run on the meta device).
fn estimate() -> u64 {
    let model = Model::build_on_meta(|p| {
        nn::seq()
            .add(nn::linear(p / "a", 64, 256, Default::default()))
            .add_fn(|x| x.relu())
            .add(nn::linear(p / "b", 256, 8, Default::default()))
    })
    .unwrap();
    model
        .estimate(
            &[Input::new(&[32, 64], Kind::Float)],
            Mode::Train(Optimizer::Adam),
            &Options::default(),
        )
        .unwrap()
        .peak_allocated
}

/// The profile of step 2 of the reference MLP's loop; with `inside`, an estimate runs
/// in that step, after the forward pass and before backward. Returns the profile and
/// the estimate's peak (0 without).
fn profiled(inside: bool) -> (StepProfile, u64) {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(2)
        .build()
        .unwrap();
    let mut predicted = 0;
    for step in 1..=2 {
        let b = batch();
        let loss = net.forward(&b.x).cross_entropy_for_logits(&b.y);
        if inside && step == 2 {
            predicted = estimate();
        }
        opt.zero_grad();
        loss.backward();
        opt.step();
        drop((loss, b));
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    (
        prof.step_profile().expect("step 2 profiled").clone(),
        predicted,
    )
}

#[test]
fn an_estimate_inside_a_profiled_step_leaves_its_profile_as_it_is() {
    let _serial = common::serial();
    let outside = estimate();
    let (plain, _) = profiled(false);
    let (with_estimate, predicted) = profiled(true);
    assert_eq!(predicted, outside, "the estimate made inside a loop");
    assert!(plain.complete && with_estimate.complete);
    let ops = |p: &StepProfile| -> Vec<(String, u64, String)> {
        p.rows
            .iter()
            .map(|r| (r.op.clone(), r.bytes.total(), r.phase.name().to_string()))
            .collect()
    };
    assert_eq!(ops(&with_estimate), ops(&plain));
    assert_eq!(with_estimate.peak.bytes, plain.peak.bytes);
    assert_eq!(with_estimate.peak.breakdown, plain.peak.breakdown);
    assert_eq!(with_estimate.forward_flops, plain.forward_flops);
    assert_eq!(with_estimate.backward_flops, plain.backward_flops);
}
