//! The reference MLP of tests/common with Adam: every category against hand computation.

mod common;
use common::*;
use tch::{nn, nn::Module, nn::OptimizerConfig, Device};
use tch_memprof::{MemoryProfiler, VariableKind};

#[test]
fn adam_iteration_matches_hand_computed_bytes() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();

    for step in 1..=3u64 {
        let b = batch();
        let loss = net.forward(&b.x).cross_entropy_for_logits(&b.y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        profiler.record_stats();

        let s = profiler
            .last_stats()
            .expect("stats after record_stats")
            .clone();
        let w = mlp_weight_bytes();
        assert_eq!(s.step, step);
        assert_eq!(s.device, "cpu");
        assert_eq!(
            s.weights_bytes, w,
            "weights: 4 x (1024x4096 + 4096 + 4096x10 + 10)"
        );
        assert_eq!(s.buffers_bytes, 0);
        assert_eq!(
            s.gradients_bytes, w,
            "one gradient per parameter, same size"
        );
        assert_eq!(
            s.optimizer_state_bytes,
            2 * w,
            "Adam: exp_avg and exp_avg_sq"
        );
        assert_eq!(s.feature_maps_bytes, mlp_feature_map_bytes());
        assert_eq!(s.intermediate_gradients_bytes, mlp_intermediate_bytes());
        assert!(s.intermediate_gradients_exact);
        assert_eq!(s.backward_passes, 1);
        // Still held by this loop: the batch and the loss scalar.
        assert_eq!(s.other_bytes, batch_bytes() + F32);
        assert_eq!(
            s.allocated_bytes,
            s.weights_bytes + s.gradients_bytes + s.optimizer_state_bytes + s.other_bytes
        );
        assert_eq!(
            s.allocated_bytes,
            tch_memprof::__private::cpu_live_bytes() as u64
        );
        // At backward start, weights, optimizer state and feature maps were all live.
        assert!(s.peak_allocated_bytes >= s.allocated_bytes);
        assert!(s.peak_allocated_bytes >= w + s.optimizer_state_bytes + s.feature_maps_bytes);
        assert!(s.reserved_bytes > 0 && s.peak_reserved_bytes >= s.reserved_bytes);

        // Per variable.
        let names: Vec<&str> = s.variables.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["l1.bias", "l1.weight", "l2.bias", "l2.weight"]);
        for v in &s.variables {
            let elems: i64 = v.shape.iter().product();
            assert_eq!(v.kind, VariableKind::Weight);
            assert_eq!(v.dtype, "Float");
            assert_eq!(v.bytes, F32 * elems as u64, "{}", v.name);
            assert_eq!(v.grad_bytes, Some(v.bytes), "{}", v.name);
        }
    }
    assert_eq!(profiler.failures(), 0);
}
