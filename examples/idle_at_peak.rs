//! The blocks idle at a training step's peak: a loop that scales its batch for logging,
//! reads it once, and keeps the binding to the end of the step. Prints the step's anatomy
//! with the idle section, and writes `<run>_idle.csv` and `<run>_report.html` (the step's
//! chart with the idle bytes as a hatched band) into `idle_results/`.
//!
//!     scripts/with-libtorch.sh cargo run --example idle_at_peak

use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 1024, 4096, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 4096, 10, Default::default()));
    let mut opt = nn::Sgd::default().build(&vs, 1e-2)?;
    let mut profiler = MemoryProfiler::builder(&vs)
        .print_period(2)
        .timeline_step(2)
        .idle_at_peak(true)
        .csv(true)
        .csv_dir("idle_results")
        .html(true)
        .build()?;
    for _ in 0..2 {
        let x = Tensor::randn([256, 1024], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [256], (Kind::Int64, Device::Cpu));
        let scaled = &x * 2.0;
        let mean = tch::no_grad(|| scaled.mean(Kind::Float)).double_value(&[]);
        println!("input mean (scaled): {mean:.4}");
        opt.zero_grad();
        let loss = net.forward(&x).cross_entropy_for_logits(&y);
        loss.backward();
        opt.step();
        profiler.record_stats();
    }
    Ok(())
}
