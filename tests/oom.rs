//! Out-of-memory forensics on the CPU: an allocation that cannot succeed is reported
//! (by category, layer, largest blocks, with a snapshot) before the error reaches the
//! loop, the numbers add up to the allocator's counter, and the loop and the profiler go
//! on. (The CUDA path is the same report, fed by the caching allocator: unverified
//! without a GPU, see docs/gpu-validation.md.)

mod common;

use common::*;
use tch::{nn::Module, Device, Kind, Tensor};
use tch_memprof::Phase;

#[test]
fn a_failed_allocation_is_reported_and_the_loop_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let Mlp { vs, net, mut opt } = mlp_with_adam(1e-4);
    let mut profiler = quiet_csv(&vs, dir.path()).build().unwrap();
    train_step(&net, &mut opt); // gradients and Adam state exist from here on
    profiler.record_stats();
    assert!(profiler.last_oom().is_none());

    // Step 2: a forward pass holds its activations, then an impossible allocation
    // (2^46 floats = 256 TiB, beyond the address space).
    let b = batch();
    let logits = net.forward(&b.x);
    let live_before = tch_memprof::__private::cpu_live_bytes() as u64;
    let huge = Tensor::f_empty([1i64 << 46], (Kind::Float, Device::Cpu));
    assert!(huge.is_err(), "the allocation must fail");
    let r = profiler
        .last_oom()
        .expect("reported before the error returned");

    eprintln!("{}", r);
    assert_eq!(r.device, "cpu");
    assert_eq!(r.step, 2);
    assert_eq!(r.requested_bytes, 4 << 46);
    assert_eq!(r.allocated_bytes, live_before);
    assert_eq!(r.reserved_bytes, None);
    let total: u64 = r.by_category.iter().map(|(_, b)| b).sum();
    assert_eq!(total, r.allocated_bytes, "{}", r);
    let cat = |name: &str| {
        r.by_category
            .iter()
            .find(|(c, _)| c.label().starts_with(name))
            .map_or(0, |(_, b)| *b)
    };
    let w = mlp_weight_bytes();
    assert_eq!(cat("weights"), w, "{}", r);
    assert_eq!(cat("gradients"), w, "{}", r);
    assert_eq!(cat("after backward"), 2 * w, "Adam's two moments\n{}", r);
    // The batch, the ReLU output kept for backward, the logits.
    let relu = F32 * (B * HIDDEN) as u64;
    let logits_bytes = F32 * (B * OUT) as u64;
    assert_eq!(cat("forward"), batch_bytes() + relu + logits_bytes, "{}", r);
    // Largest blocks: 16 MiB each (l1's weight-sized gradient and Adam moments).
    let l1_weight = F32 * (IN * HIDDEN) as u64;
    assert_eq!(r.largest_blocks[0].bytes, l1_weight);
    let relu_block = r
        .largest_blocks
        .iter()
        .find(|b| b.op == "aten::relu")
        .expect("the ReLU output is among the largest blocks");
    assert_eq!(
        (
            relu_block.phase,
            relu_block.layer.as_str(),
            relu_block.iteration,
            relu_block.bytes
        ),
        (Phase::Forward, "l1", 2, relu)
    );
    assert_eq!(r.by_layer[0].0, "l1");
    let report = r.report_path.as_ref().expect("report file");
    assert!(std::fs::read_to_string(report)
        .unwrap()
        .contains("OUT OF MEMORY on cpu"));
    assert!(r.snapshot_path.as_ref().is_some_and(|p| p.exists()));
    assert!(report.starts_with(dir.path()));

    // The loop goes on, and the profiler with it.
    let loss = logits.cross_entropy_for_logits(&b.y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    drop((b, logits, loss));
    profiler.record_stats();
    train_step(&net, &mut opt);
    profiler.record_stats();
    assert_eq!(profiler.failures(), 0);
    let s = profiler.last_stats().unwrap();
    assert_eq!(s.step, 3);
    assert_eq!(s.feature_maps_bytes, mlp_feature_map_bytes());
}
