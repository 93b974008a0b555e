//! Inference peak memory at deployment: for each model, one forward pass at batch 1
//! (3x224x224, eval mode, no_grad), measured by the profiler: allocated before the pass
//! (weights and the input: the baseline), the peak during it, their difference (the
//! activations and temporaries), and on CUDA the caching allocator's peak reserved.
//! The reference table (measured with PyTorch's CUDA caching allocator by PyTorch Static
//! Peak Memory Analyzer (TorchScript IR), a Python and C++ tool, quoted from its README) is
//! printed beside it.
//!
//!     scripts/with-libtorch.sh cargo run --release --example deployment_peak
//!
//! Options: `--device cpu|cuda` (default cpu), `--models a,b,...` (default alexnet,
//! mobilenet_v2,resnet50,resnet101,vgg16), `--output PATH` (default
//! deployment_results/deployment_peak.csv), `--explain` (profile the pass op by op and
//! print where each peak happens).

#[path = "common/args.rs"]
mod args;

use std::path::PathBuf;

use tch::{nn, nn::ModuleT, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

const MODELS: [&str; 5] = ["alexnet", "mobilenet_v2", "resnet50", "resnet101", "vgg16"];

/// The reference (MB = 2^20 bytes): baseline allocated, peak allocated, peak delta,
/// peak reserved, measured with PyTorch's CUDA allocator at batch 1, 224x224.
/// Its MobileNet is v3-small, which tch does not have; ours is v2.
fn reference(model: &str) -> Option<(f64, f64, f64, f64)> {
    match model {
        "alexnet" => Some((234.03, 242.22, 8.19, 246.00)),
        "mobilenet_v3_small" => Some((10.38, 18.51, 8.14, 28.00)),
        "resnet50" => Some((98.30, 109.37, 11.07, 142.00)),
        "resnet101" => Some((171.23, 181.98, 10.75, 196.00)),
        "vgg16" => Some((529.62, 566.51, 36.89, 578.00)),
        _ => None,
    }
}

fn build(name: &str, p: &nn::Path) -> Result<Box<dyn ModuleT>, String> {
    Ok(match name {
        "alexnet" => Box::new(tch::vision::alexnet::alexnet(p, 1000)),
        "mobilenet_v2" => Box::new(tch::vision::mobilenet::v2(p, 1000)),
        "resnet50" => Box::new(tch::vision::resnet::resnet50(p, 1000)),
        "resnet101" => Box::new(tch::vision::resnet::resnet101(p, 1000)),
        "vgg16" => Box::new(tch::vision::vgg::vgg16(p, 1000)),
        other => {
            return Err(format!(
                "unknown model {other}; known: {}",
                MODELS.join(", ")
            ))
        }
    })
}

struct Row {
    model: String,
    baseline: u64,
    peak: u64,
    peak_reserved: Option<u64>,
    weights: u64,
    peak_where: Option<String>,
}

fn measure(name: &str, device: Device, explain: bool) -> Result<Row, Box<dyn std::error::Error>> {
    if device.is_cuda() {
        // Each model from a clean allocator, as in a process of its own: the cuBLAS
        // workspaces the previous model's matrix products took released (as
        // torch._C._cuda_clearCublasWorkspaces() does), the cache returned to the driver.
        // A libtorch without the call carries the workspaces over; say so, go on.
        if let Err(e) = tch_memprof::cuda::clear_cublas_workspaces() {
            eprintln!("deployment_peak: the cuBLAS workspaces stay from the model before: {e}");
        }
        tch_memprof::cuda::empty_cache()?;
    }
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = build(name, &vs.root())?;
    let x = Tensor::randn([1, 3, 224, 224], (Kind::Float, device));
    let mut builder = MemoryProfiler::builder(&vs).print(false).leak_check(false);
    if explain {
        builder = builder.timeline_step(2);
    }
    let mut profiler = builder.build()?;
    profiler.record_stats(); // step 1: the model and the input, nothing else
    let before = profiler.last_stats().expect("measured").clone();
    if let Device::Cuda(i) = device {
        tch_memprof::cuda::reset_peak_stats(i)?; // peak reserved of the pass alone
    }
    let y = tch::no_grad(|| model.forward_t(&x, false));
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
    drop(y);
    profiler.record_stats(); // step 2: the forward pass
    let pass = profiler.last_stats().expect("measured");
    Ok(Row {
        model: name.to_string(),
        baseline: before.allocated_bytes,
        peak: pass.peak_allocated_bytes,
        peak_reserved: pass.cuda.map(|c| c.reserved_peak.max(0) as u64),
        weights: before.weights_bytes,
        peak_where: profiler.step_profile().map(|p| p.peak.location()),
    })
}

fn mb(b: u64) -> String {
    format!("{:.2}", b as f64 / (1u64 << 20) as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let device = args::device(Device::Cpu)?;
    let models: Vec<String> = match args::arg("--models") {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => MODELS.iter().map(|s| s.to_string()).collect(),
    };
    let output = PathBuf::from(
        args::arg("--output").unwrap_or_else(|| "deployment_results/deployment_peak.csv".into()),
    );
    println!("Inference at batch 1, 3x224x224, eval mode, no_grad, on {device:?}; MB = 2^20 bytes");
    if device.is_cuda() {
        println!(
            "Each model from a clean allocator: the cuBLAS workspaces of the model before \
             released and the cache emptied; its own workspaces count in its peak"
        );
    }

    let mut rows = Vec::new();
    for m in &models {
        let r = measure(m, device, args::flag("--explain"))?;
        match &r.peak_where {
            Some(at) => println!("  {m}: peak during {at}"),
            None => println!("  {m}: measured"),
        }
        rows.push(r);
    }

    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_header(vec![
            "model",
            "baseline allocated (MB)",
            "peak allocated (MB)",
            "peak delta (MB)",
            "peak reserved (MB)",
            "reference (CUDA): baseline / peak / delta / reserved",
        ]);
    for r in &rows {
        let reference_name = if r.model == "mobilenet_v2" {
            "mobilenet_v3_small"
        } else {
            r.model.as_str()
        };
        let refs = reference(reference_name).map_or("-".into(), |(b, p, d, res)| {
            let note = if reference_name != r.model {
                " (v3-small)"
            } else {
                ""
            };
            format!("{b:.2} / {p:.2} / {d:.2} / {res:.2}{note}")
        });
        t.add_row(vec![
            r.model.clone(),
            mb(r.baseline),
            mb(r.peak),
            mb(r.peak.saturating_sub(r.baseline)),
            r.peak_reserved.map_or("n/a (CPU)".into(), mb),
            refs,
        ]);
    }
    println!("\n{t}");

    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut w = csv::Writer::from_path(&output)?;
    w.write_record([
        "model",
        "device",
        "weights_bytes",
        "baseline_allocated_bytes",
        "peak_allocated_bytes",
        "peak_delta_bytes",
        "peak_reserved_bytes",
    ])?;
    for r in &rows {
        w.write_record([
            r.model.clone(),
            format!("{device:?}").to_lowercase(),
            r.weights.to_string(),
            r.baseline.to_string(),
            r.peak.to_string(),
            r.peak.saturating_sub(r.baseline).to_string(),
            r.peak_reserved.map_or(String::new(), |b| b.to_string()),
        ])?;
    }
    w.flush()?;
    println!("wrote {}", output.display());
    Ok(())
}
