//! SGD: no optimizer state without momentum, one buffer per parameter with it; buffers
//! (batch-norm statistics) counted among the weights and apart.

mod common;
use common::*;
use tch::{nn, nn::Module, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::{MemoryProfiler, VariableKind};

fn train_once(momentum: f64) -> tch_memprof::IterationStats {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = mlp(&vs);
    let mut opt = nn::Sgd {
        momentum,
        ..Default::default()
    }
    .build(&vs, 1e-2)
    .unwrap();
    let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    let mut last = None;
    for _ in 0..2 {
        train_step(&net, &mut opt);
        profiler.record_stats();
        last = profiler.last_stats().cloned();
    }
    assert_eq!(profiler.failures(), 0);
    last.unwrap()
}

#[test]
fn sgd_state_is_zero_without_momentum_and_one_buffer_per_parameter_with_it() {
    let w = mlp_weight_bytes();

    let plain = train_once(0.0);
    assert_eq!(plain.weights_bytes, w);
    assert_eq!(plain.gradients_bytes, w);
    assert_eq!(plain.optimizer_state_bytes, 0);
    assert_eq!(plain.feature_maps_bytes, mlp_feature_map_bytes());
    assert_eq!(plain.intermediate_gradients_bytes, mlp_intermediate_bytes());
    // The batch and loss were dropped before record_stats.
    assert_eq!(plain.other_bytes, 0);

    let momentum = train_once(0.9);
    assert_eq!(
        momentum.optimizer_state_bytes, w,
        "one momentum buffer per parameter"
    );
    assert_eq!(momentum.other_bytes, 0);

    // Buffers: batch norm's running mean and variance.
    let vs = nn::VarStore::new(Device::Cpu);
    let features = 64i64;
    let bn = nn::batch_norm1d(vs.root() / "bn", features, Default::default());
    let fc = nn::linear(vs.root() / "fc", features, 1, Default::default());
    let mut opt = nn::Sgd::default().build(&vs, 1e-2).unwrap();
    let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    let x = Tensor::randn([32, features], (Kind::Float, Device::Cpu));
    let loss = fc.forward(&bn.forward_t(&x, true)).mean(Kind::Float);
    opt.zero_grad();
    loss.backward();
    opt.step();
    profiler.record_stats();
    let s = profiler.last_stats().unwrap();
    let f = F32 * features as u64;
    let buffers = 2 * f; // running_mean, running_var
    let params = 2 * f + (f + F32); // bn weight+bias, fc weight+bias
    assert_eq!(s.buffers_bytes, buffers);
    assert_eq!(s.weights_bytes, params + buffers);
    assert_eq!(s.gradients_bytes, params, "buffers have no gradient");
    let buffer_names: Vec<&str> = s
        .variables
        .iter()
        .filter(|v| v.kind == VariableKind::Buffer)
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(buffer_names, ["bn.running_mean", "bn.running_var"]);
}
