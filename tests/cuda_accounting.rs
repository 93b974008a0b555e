//! The CUDA accounting path, run on the CPU. On CUDA the profiler learns of a block only
//! from the caching allocator's reports, which start when its session does: the model's
//! variables (moved to the GPU before the profiler is built) were never reported born.
//! `cpu_reports_only_after_start` makes the CPU accounting see the same (every CPU block
//! born before the session unknown, the counters from zero), so CI runs the path a GPU
//! takes. The step timeline, the per-iteration report and the timeline's files must
//! show the weights, buffers and gradients at the bytes the ordinary CPU accounting
//! shows, which knows every block since the library loaded.
//!
//! The mode lasts for the process: this file is its own test binary, one test.

mod common;

use tch::nn::{self, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::{Category, IterationStats, MemoryProfiler, StepProfile};

/// Conv(3->8, 3x3) -> batch norm (running mean and variance: buffers) -> ReLU ->
/// Linear(8*8*8 -> 10), on batches of 4 images of 3x8x8.
fn net(vs: &nn::VarStore) -> impl ModuleT {
    let conv_cfg = nn::ConvConfig {
        padding: 1,
        ..Default::default()
    };
    let conv = nn::conv2d(vs.root() / "conv", 3, 8, 3, conv_cfg);
    let bn = nn::batch_norm2d(vs.root() / "bn", 8, Default::default());
    let fc = nn::linear(vs.root() / "fc", 8 * 8 * 8, 10, Default::default());
    nn::seq_t()
        .add(conv)
        .add(bn)
        .add_fn(|x| x.relu().flatten(1, -1))
        .add(fc)
}

/// Parameters by hand, f32: conv weight and bias, batch-norm weight and bias, linear
/// weight and bias. Buffers: running mean and running variance (f32; tch keeps no
/// count of batches seen).
const PARAM_BYTES: u64 = 4 * ((8 * 3 * 3 * 3 + 8) + (8 + 8) + (512 * 10 + 10));
const BUFFER_BYTES: u64 = 4 * (8 + 8);

fn step(net: &impl ModuleT, opt: &mut nn::Optimizer, seed: i64) {
    tch::manual_seed(seed);
    let x = Tensor::randn([4, 3, 8, 8], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(10, [4], (Kind::Int64, Device::Cpu));
    let loss = net.forward_t(&x, true).cross_entropy_for_logits(&y);
    opt.zero_grad();
    loss.backward();
    opt.step();
}

/// A model built and given gradients (one backward pass) before the profiler, then two
/// profiled Adam steps: step 1's timeline (the gradients from before the session freed
/// by its zero_grad) and the peak step's (Adam's state born in step 1 alive).
fn run(cuda_like: bool, dir: &std::path::Path) -> ([StepProfile; 2], IterationStats) {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = net(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    // Gradients that exist before the session: the first zero_grad frees them.
    let x = Tensor::randn([4, 3, 8, 8], (Kind::Float, Device::Cpu));
    net.forward_t(&x, true).sum(Kind::Float).backward();
    drop(x);
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(1)
        .csv(true)
        .csv_dir(dir)
        .cpu_reports_only_after_start(cuda_like)
        .build()
        .unwrap();
    for i in 0..2 {
        step(&net, &mut opt, i);
        prof.record_stats();
    }
    assert_eq!(prof.failures(), 0);
    let p = prof.step_profile().expect("step 1 was profiled").clone();
    let peak = prof.peak_step_profile().expect("a peak step").clone();
    let s = prof.last_stats().unwrap().clone();
    ([p, peak], s)
}

#[test]
fn the_cuda_accounting_shows_the_weights_born_before_the_session() {
    let _serial = common::serial();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The ordinary CPU accounting first: the mode below lasts for the process.
    let (cpu_steps, cpu_stats) = run(false, a.path());
    let (cuda_steps, cuda_stats) = run(true, b.path());
    for (cpu, cuda_like) in cpu_steps.iter().zip(&cuda_steps) {
        same_step(cpu, cuda_like);
    }
    // The per-iteration report: weights, buffers, gradients, optimizer state alike.
    assert_eq!(cpu_stats.weights_bytes, PARAM_BYTES + BUFFER_BYTES);
    assert_eq!(cuda_stats.weights_bytes, cpu_stats.weights_bytes);
    assert_eq!(cuda_stats.buffers_bytes, cpu_stats.buffers_bytes);
    assert_eq!(cuda_stats.gradients_bytes, cpu_stats.gradients_bytes);
    assert_eq!(
        cuda_stats.optimizer_state_bytes,
        cpu_stats.optimizer_state_bytes
    );
    assert_eq!(cuda_stats.feature_maps_bytes, cpu_stats.feature_maps_bytes);
}

fn same_step(cpu: &StepProfile, cuda_like: &StepProfile) {
    println!(
        "step {}: CPU accounting peak {} B {:?}; CUDA-like peak {} B {:?}",
        cpu.step,
        cpu.peak.bytes,
        cpu.peak.breakdown,
        cuda_like.peak.bytes,
        cuda_like.peak.breakdown
    );
    for p in [cpu, cuda_like] {
        assert!(p.complete, "the replay lost track of a block");
        assert_eq!(p.category_max.get(Category::Param), PARAM_BYTES);
        assert_eq!(p.category_max.get(Category::Buffer), BUFFER_BYTES);
    }
    // Row by row, the categories the tensors make known are the same bytes.
    assert_eq!(cpu.rows.len(), cuda_like.rows.len());
    for (r, q) in cpu.rows.iter().zip(&cuda_like.rows) {
        for c in [
            Category::Param,
            Category::Buffer,
            Category::Grad,
            Category::Opt,
            Category::Act,
            Category::Temp,
        ] {
            assert_eq!(
                r.bytes.get(c),
                q.bytes.get(c),
                "op {} {}: {c:?}",
                r.op_index,
                r.op
            );
        }
    }
    for c in [
        Category::Param,
        Category::Buffer,
        Category::Grad,
        Category::Opt,
    ] {
        assert_eq!(
            cpu.peak.breakdown.get(c),
            cuda_like.peak.breakdown.get(c),
            "{c:?}"
        );
    }
    // What stays unknown on CUDA is "other": blocks of neither the model nor the step
    // (the CPU accounting knows every block since the library loaded).
    assert_eq!(cpu.step, cuda_like.step);
    assert!(cuda_like.peak.bytes <= cpu.peak.bytes);
    assert_eq!(
        cpu.peak.bytes - cuda_like.peak.bytes,
        cpu.peak.breakdown.get(Category::Other) - cuda_like.peak.breakdown.get(Category::Other)
    );
}
