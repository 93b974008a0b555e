//! ResNet-152, one forward and backward pass on random input, with the step timeline:
//! what `resnet_profile.py` of the Python ResNet Memory Profiler does with module hooks, measured
//! here from the allocator.
//!
//!     scripts/with-libtorch.sh cargo run --release --example resnet_profile -- --batch_size 2
//!
//! Options: `--batch_size N` (default 16), `--output PATH` (default
//! `resnet_results/memory_profile.png`; an SVG is written beside it), `--no_title`,
//! `--device cpu|cuda` (default: cuda if available, else cpu).
//!
//! Writes beside the plot: `memory_summary_bs<N>.txt`, `timeline.csv`, `layers.csv`.
//! Any tch model is profiled the same way: build the profiler with `.timeline_step(1)`,
//! run the step, call `record_stats()`, read `step_profile()`.

#[path = "common/args.rs"]
mod args;

use std::io::Write;
use std::path::{Path, PathBuf};

use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};
use tch_memprof::report::{plot_step, write_layers_csv, write_timeline_csv};
use tch_memprof::{Category, MemoryProfiler, StepProfile};

fn gb(bytes: u64) -> String {
    format!("{:.3} ({bytes} bytes)", bytes as f64 / 1e9)
}

fn write_summary(path: &Path, p: &StepProfile) -> std::io::Result<()> {
    let weights = p.category_max.get(Category::Param) + p.category_max.get(Category::Buffer);
    let mut f = std::fs::File::create(path)?;
    writeln!(f, "Max Weights Memory (GB): {}", gb(weights))?;
    writeln!(
        f,
        "Max Gradients Memory (GB): {}",
        gb(p.category_max.get(Category::Grad))
    )?;
    writeln!(
        f,
        "Max Feature Maps Memory (GB): {}",
        gb(p.category_max.get(Category::Act))
    )?;
    writeln!(f, "Total Peak Memory (GB): {}", gb(p.peak.bytes))?;
    writeln!(f)?;
    writeln!(
        f,
        "GB = 10^9 bytes. Weights: parameters and buffers. Feature maps: activations"
    )?;
    writeln!(
        f,
        "kept for backward (the input batch included). Total peak: all live bytes"
    )?;
    writeln!(
        f,
        "of the device at the iteration's highest point, temporaries included."
    )?;
    writeln!(
        f,
        "Peak reached during {} ({}, layer {}).",
        p.peak.op,
        p.peak.phase.map_or(tch_memprof::MISSING, |ph| ph.name()),
        p.peak.layer
    )?;
    writeln!(
        f,
        "FLOPs: forward {}, backward {}.",
        p.forward_flops, p.backward_flops
    )?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let batch = match args::arg("--batch_size") {
        None => 16,
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("--batch_size {v}: expected a positive integer").into()),
        },
    };
    let output = PathBuf::from(
        args::arg("--output").unwrap_or_else(|| "resnet_results/memory_profile.png".into()),
    );
    let device = args::device(Device::cuda_if_available())?;
    let dir = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    std::fs::create_dir_all(&dir)?;

    let vs = nn::VarStore::new(device);
    let net = tch::vision::resnet::resnet152(&vs.root(), 1000);
    let mut profiler = MemoryProfiler::builder(&vs)
        .timeline_step(1)
        .top_variables(5)
        .build()?;

    let x = Tensor::randn([batch, 3, 224, 224], (Kind::Float, device));
    let y = Tensor::randint(1000, [batch], (Kind::Int64, device));
    let loss = net.forward_t(&x, true).cross_entropy_for_logits(&y);
    loss.backward();
    drop((x, y, loss));
    profiler.record_stats();

    let p = profiler
        .step_profile()
        .ok_or("the step was not profiled (see the warnings above)")?;
    let title = format!("ResNet-152 memory over one forward and backward pass, batch size {batch}");
    let title = (!args::flag("--no_title")).then_some(title.as_str());
    plot_step(p, &output, title)?;
    let svg = output.with_extension("svg");
    plot_step(p, &svg, title)?;
    let summary = dir.join(format!("memory_summary_bs{batch}.txt"));
    write_summary(&summary, p)?;
    write_timeline_csv(p, &dir.join("timeline.csv"))?;
    write_layers_csv(p, &dir.join("layers.csv"))?;
    println!("wrote {}", output.display());
    println!("wrote {}", svg.display());
    println!("wrote {}", summary.display());
    println!("wrote {}", dir.join("timeline.csv").display());
    println!("wrote {}", dir.join("layers.csv").display());
    print!("{}", std::fs::read_to_string(&summary)?);
    Ok(())
}
