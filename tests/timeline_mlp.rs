//! The step timeline of the reference MLP with Adam (tests/common), checked against
//! the allocator's own counter and against sizes and FLOPs computed by hand.

mod common;

use std::sync::OnceLock;

use common::*;
use tch::nn::{self, OptimizerConfig};
use tch_memprof::{Category, IterationStats, MemoryProfiler, Phase, StepProfile};

/// Step 3 (Adam state exists, gradients of step 2 are alive when it begins), profiled
/// once for all tests of this file, with the iteration report of the same step.
fn profiled() -> &'static (StepProfile, IterationStats) {
    static CELL: OnceLock<(StepProfile, IterationStats)> = OnceLock::new();
    CELL.get_or_init(|| {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let net = mlp(&vs);
        let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
        let mut prof = MemoryProfiler::builder(&vs)
            .print(false)
            .timeline_step(3)
            .build()
            .unwrap();
        for _ in 0..3 {
            train_step(&net, &mut opt);
            prof.record_stats();
        }
        assert_eq!(prof.failures(), 0);
        let p = prof.step_profile().expect("step 3 was profiled").clone();
        let s = prof.last_stats().unwrap().clone();
        assert_eq!(s.step, 3);
        (p, s)
    })
}

fn rows_in(p: &StepProfile, phase: Phase) -> impl Iterator<Item = &tch_memprof::StepRow> {
    p.rows.iter().filter(move |r| r.phase == phase)
}

#[test]
fn categories_add_up_to_the_allocators_live_bytes_after_every_op() {
    let (p, _) = profiled();
    assert!(p.complete);
    assert!(p.rows.len() > 20, "only {} ops", p.rows.len());
    for r in &p.rows {
        assert_eq!(
            r.bytes.total(),
            r.allocated_bytes,
            "op {} {}: categories {:?}",
            r.op_index,
            r.op,
            r.bytes
        );
    }
}

#[test]
fn the_peak_is_the_allocators_peak_of_the_iteration() {
    let (p, s) = profiled();
    assert_eq!(p.peak.bytes, s.peak_allocated_bytes);
    assert_eq!(p.peak.breakdown.total(), p.peak.bytes);
    assert!(p.peak.op_index.is_some());
}

#[test]
fn weights_gradients_and_adam_state_match_hand_sizes() {
    let (p, s) = profiled();
    let w = mlp_weight_bytes();
    for r in &p.rows {
        assert_eq!(r.bytes.get(Category::Param), w, "op {}", r.op);
        assert_eq!(r.bytes.get(Category::Buffer), 0);
        assert_eq!(
            r.bytes.get(Category::Opt),
            2 * w,
            "Adam: exp_avg + exp_avg_sq"
        );
    }
    // Gradients of step 2 are alive when step 3 begins; zero_grad frees them before
    // backward; backward makes new ones.
    assert_eq!(p.rows.first().unwrap().bytes.get(Category::Grad), w);
    let first_bwd = rows_in(p, Phase::Backward).next().unwrap();
    assert_eq!(first_bwd.bytes.get(Category::Grad), 0);
    assert_eq!(p.rows.last().unwrap().bytes.get(Category::Grad), w);
    assert_eq!(s.gradients_bytes, w);
}

#[test]
fn activations_at_backward_start_are_the_feature_maps() {
    let (p, s) = profiled();
    let fm = mlp_feature_map_bytes();
    assert_eq!(p.category_max.get(Category::Act), fm);
    assert_eq!(s.feature_maps_bytes, fm);
    let last_fwd = rows_in(p, Phase::Forward).last().unwrap();
    assert_eq!(last_fwd.bytes.get(Category::Act), fm);
}

#[test]
fn phases_come_in_order_forward_backward_optimizer() {
    let (p, _) = profiled();
    let rank = |ph: Phase| match ph {
        Phase::Forward => 0,
        Phase::Backward => 1,
        Phase::Optimizer => 2,
    };
    let ranks: Vec<u8> = p.rows.iter().map(|r| rank(r.phase)).collect();
    assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "{ranks:?}");
    let (bwd, opt) = p.phase_boundaries();
    let (bwd, opt) = (bwd.unwrap(), opt.unwrap());
    assert!(p.rows[bwd].op.ends_with("Backward0"), "{}", p.rows[bwd].op);
    assert!(bwd < opt);
}

#[test]
fn layers_own_their_parameters_and_activations() {
    let (p, _) = profiled();
    let layer = |name: &str| {
        p.layers
            .iter()
            .find(|l| l.layer == name)
            .unwrap_or_else(|| panic!("no layer {name}: {:?}", p.layers))
    };
    let (b, i, h, o) = (B as u64, IN as u64, HIDDEN as u64, OUT as u64);
    assert_eq!(layer("l1").parameters_bytes, F32 * (i * h + h));
    assert_eq!(layer("l2").parameters_bytes, F32 * (h * o + o));
    // l1's ops made the ReLU output; l2's the log-softmax output, the loss, NLL's
    // total_weight and the gradient seed; the batch came before any layer.
    assert_eq!(layer("l1").activation_bytes, F32 * b * h);
    assert_eq!(layer("l2").activation_bytes, F32 * b * o + 3 * F32);
    assert_eq!(layer("(none)").activation_bytes, batch_bytes());
    let sum: u64 = p.layers.iter().map(|l| l.activation_bytes).sum();
    assert_eq!(sum, mlp_feature_map_bytes());
}

#[test]
fn flops_match_hand_formulas() {
    let (p, _) = profiled();
    let (b, i, h, o) = (B as u64, IN as u64, HIDDEN as u64, OUT as u64);
    let layer = |name: &str| p.layers.iter().find(|l| l.layer == name).unwrap().clone();
    // Forward: addmm 2*B*IN*H, ReLU 1 per element | addmm 2*B*H*O, log_softmax 5/elt,
    // NLL 1 per element of its input (the B x O log-probabilities).
    assert_eq!(layer("l1").forward_flops, 2 * b * i * h + b * h);
    assert_eq!(layer("l2").forward_flops, 2 * b * h * o + 5 * b * o + b * o);
    // Backward: l1: weight gradient (the input needs none), bias gradient (a sum),
    // ReLU backward. l2: input and weight gradients, bias sum, log_softmax backward, NLL
    // backward (1 per element of the B x O log-probabilities).
    assert_eq!(layer("l1").backward_flops, 2 * b * i * h + b * h + b * h);
    assert_eq!(
        layer("l2").backward_flops,
        2 * (2 * b * h * o) + b * o + 5 * b * o + b * o
    );
    assert_eq!(
        p.forward_flops,
        layer("l1").forward_flops + layer("l2").forward_flops
    );
    // NLL has its formula now: not among the uncounted ops.
    assert!(
        p.uncounted_ops
            .iter()
            .all(|u| !u.op.starts_with("aten::nll_loss")),
        "{:?}",
        p.uncounted_ops
    );
}

#[test]
fn optimizer_ops_belong_to_the_variable_they_update() {
    let (p, _) = profiled();
    // Adam's temporaries for l1.weight are the only 16 MiB TEMP blocks of the
    // optimizer phase.
    let big = F32 * (IN * HIDDEN) as u64;
    let rows: Vec<_> = rows_in(p, Phase::Optimizer)
        .filter(|r| r.bytes.get(Category::Temp) >= big)
        .collect();
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!(r.layer, "l1", "{} at op {}", r.op, r.op_index);
    }
}
