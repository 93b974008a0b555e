//! The CUDA estimate beside the reference: five models at batch 1, 3x224x224,
//! inference, predicted without a GPU, next to the peaks PyTorch's CUDA allocator
//! measured and to the static analyzer's estimate (both quoted from the README of
//! PyTorch Static Peak Memory Analyzer (TorchScript IR), a Python and C++ tool; MB =
//! 2^20 bytes), with the time each of our estimates took (building the model on the
//! CPU, moving it to the meta device, the dry run and the replay).
//!
//!     scripts/with-libtorch.sh cargo run --release --example estimate_reference
//!
//! The reference does not say on which GPU it was measured, and the GPU's generation
//! sets the cuBLAS workspace (8 MiB + 128 KiB before Hopper, 32 MiB on Hopper): each row
//! shows both, a GPU before Hopper (`Gpu::generic()`) and an H100 (`Gpu::named("h100")`),
//! each with its difference from the measured figure. Last, tch's own ResNet-50
//! (`tch::vision`), to show what its chained expressions keep alive.

use std::time::Instant;

use tch::Kind;
use tch_memprof::estimate::{Gpu, Input, Mode, Model, Options};

/// (model, measured baseline, measured peak, measured peak reserved, the static
/// analyzer's total peak).
const REFERENCE: [(&str, f64, f64, f64, f64); 5] = [
    ("alexnet", 234.03, 242.22, 246.00, 466.162415),
    ("mobilenet_v3_small", 10.38, 18.51, 28.00, 19.493118),
    ("resnet50", 98.30, 109.37, 142.00, 195.387428),
    ("resnet101", 171.23, 181.98, 196.00, 340.687622),
    ("vgg16", 529.62, 566.51, 578.00, 1055.584290),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpus = [
        Options::for_gpu(Gpu::generic()),
        Options::for_gpu(Gpu::named("h100")?),
    ];
    let input = [Input::new(&[1, 3, 224, 224], Kind::Float)];
    let mb = |b: u64| b as f64 / (1u64 << 20) as f64;
    let pct = |ours: f64, theirs: f64| 100.0 * (ours - theirs) / theirs;
    println!(
        "| model | measured peak allocated | static analyzer | ours, before Hopper | off | ours, H100 | off | measured peak reserved | ours, before Hopper | off | ours, H100 | off | time |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, _baseline, peak, reserved, analyzer) in REFERENCE {
        let start = Instant::now();
        let model = Model::builtin(name)?;
        let [pre, h100] = [&gpus[0], &gpus[1]].map(|o| model.estimate(&input, Mode::Inference, o));
        let (pre, h100) = (pre?, h100?);
        let took = start.elapsed();
        let cell =
            |ours: u64, theirs: f64| format!("{:.2} | {:+.1}%", mb(ours), pct(mb(ours), theirs));
        println!(
            "| {name} | {peak:.2} | {analyzer:.2} | {} | {} | {reserved:.2} | {} | {} | {:.2} s |",
            cell(pre.peak_allocated, peak),
            cell(h100.peak_allocated, peak),
            cell(pre.peak_reserved, reserved),
            cell(h100.peak_reserved, reserved),
            took.as_secs_f64()
        );
    }
    // tch's own ResNet-50 (tch::vision): the same architecture, written as chained
    // expressions whose intermediates live until the end of their statement.
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let net = tch::vision::resnet::resnet50(&vs.root(), 1000);
    let model = Model::from_module(vs, net)?;
    let e = model.estimate(&input, Mode::Inference, &gpus[0])?;
    println!(
        "\ntch::vision::resnet::resnet50 (tch's own code), before Hopper: peak allocated {:.2} MB, peak reserved {:.2} MB",
        mb(e.peak_allocated),
        mb(e.peak_reserved)
    );
    Ok(())
}
