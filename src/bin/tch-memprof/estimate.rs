//! `tch-memprof estimate` and `tch-memprof profile`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};
use tch::nn;
use tch::{Device, Kind, Tensor};
use tch_memprof::estimate::{
    format_bytes as bytes, gpu_memory, host_peak_rss, AllocatorConfig, Estimate, Gpu, Input, Mode,
    Model, Optimizer, Options,
};

/// Arguments of `tch-memprof estimate`.
#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// A TorchScript file (torch.jit.trace or torch.jit.script, saved with .save()).
    #[arg(required_unless_present = "model", conflicts_with = "model")]
    path: Option<PathBuf>,
    /// A built-in model instead of a file: alexnet, mobilenet_v3_small, resnet18,
    /// resnet50, resnet101, resnet152, vgg16.
    #[arg(long)]
    model: Option<String>,
    /// An input shape, batch first (1x3x224x224), with an optional dtype after a colon
    /// (8x128:i64); once per input of the model. Built-in models default to 1x3x224x224.
    #[arg(long = "input")]
    inputs: Vec<String>,
    /// Estimate one training step (forward, loss, backward, optimizer step) instead of
    /// inference. The loss is cross-entropy for a 2-D output, the mean otherwise.
    #[arg(long)]
    train: bool,
    /// The optimizer of --train: sgd, sgd-momentum, adam, adamw.
    #[arg(long, default_value = "adam")]
    optimizer: String,
    /// Batch sizes to estimate (they replace the first size of every input): 1,8,32.
    #[arg(long, value_delimiter = ',')]
    batch_sizes: Vec<i64>,
    /// The GPU (its cuBLAS workspace, and its memory for --memory): h100, a100-80gb,
    /// rtx4090, ... Default: a GPU before Hopper of unknown memory.
    #[arg(long)]
    gpu: Option<String>,
    /// Find the largest batch whose predicted peak reserved fits: a size (80GiB, 24GB)
    /// or a GPU name (its memory less 1 GiB for the CUDA context).
    #[arg(long)]
    memory: Option<String>,
    /// Training steps replayed (the peak is over all of them).
    #[arg(long, default_value_t = 2)]
    steps: u32,
    /// Print CSV to standard output:
    /// model,batch,mode,weights_bytes,peak_allocated_bytes,peak_reserved_bytes.
    #[arg(long)]
    csv: bool,
}

/// Arguments of `tch-memprof profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// A TorchScript file.
    path: PathBuf,
    /// An input shape, batch first, with an optional dtype after a colon; once per input.
    #[arg(long = "input", required = true)]
    inputs: Vec<String>,
    /// Profile a training step (forward, loss, backward) instead of inference.
    #[arg(long)]
    train: bool,
    /// cpu or cuda (cuda:N).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where the plot, the CSV files and the summary go.
    #[arg(long, default_value = "profile_results")]
    output_dir: PathBuf,
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("tch-memprof: {msg}");
    ExitCode::from(2)
}

fn parse_inputs(specs: &[String]) -> Result<Vec<Input>, String> {
    specs
        .iter()
        .map(|s| {
            let (shape, dtype) = match s.split_once(':') {
                Some((a, b)) => (a, Some(b)),
                None => (s.as_str(), None),
            };
            Input::parse(shape, dtype).map_err(|e| e.to_string())
        })
        .collect()
}

/// Panics of tch's panicking wrappers (a shape a layer rejects) become errors in the
/// library; their default report would print a trace first.
fn quiet_panics() {
    std::panic::set_hook(Box::new(|_| {}));
}

pub fn run_estimate(a: &EstimateArgs) -> ExitCode {
    quiet_panics();
    let mode = if a.train {
        match Optimizer::parse(&a.optimizer) {
            Ok(o) => Mode::Train(o),
            Err(e) => return fail(e),
        }
    } else {
        Mode::Inference
    };
    if a.steps == 0 {
        return fail("invalid steps = 0: at least one step");
    }
    if let Some(b) = a.batch_sizes.iter().find(|b| **b <= 0) {
        return fail(format!("invalid batch size {b}: must be positive"));
    }
    let mut inputs = match parse_inputs(&a.inputs) {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    let allocator = match AllocatorConfig::from_env() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let mut gpu = match a.gpu.as_deref().map(Gpu::named).transpose() {
        Ok(g) => g.unwrap_or_else(Gpu::generic),
        Err(e) => return fail(e),
    };
    let memory = match a.memory.as_deref() {
        None => None,
        Some(m) => match gpu_memory(m) {
            Ok((bytes, named)) => {
                if let (Some(g), None) = (named, &a.gpu) {
                    gpu = g;
                }
                Some(bytes)
            }
            Err(e) => return fail(e),
        },
    };
    let (label, model) = match (&a.path, &a.model) {
        (Some(p), _) => {
            if inputs.is_empty() {
                return fail(format!(
                    "{}: give the model's input shape with --input (1x3x224x224)",
                    p.display()
                ));
            }
            (
                p.file_name()
                    .map_or(p.display().to_string(), |f| f.to_string_lossy().into()),
                Model::torchscript(p),
            )
        }
        (None, Some(name)) => {
            if inputs.is_empty() {
                inputs.push(Input::new(&[1, 3, 224, 224], Kind::Float));
            }
            (name.clone(), Model::builtin(name))
        }
        (None, None) => return fail("give a TorchScript file or --model NAME"),
    };
    let model = match model {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let options = Options {
        gpu,
        allocator,
        steps: a.steps,
    };
    let batches: Vec<i64> = if a.batch_sizes.is_empty() {
        vec![inputs[0].batch()]
    } else {
        a.batch_sizes.clone()
    };
    let mut rows = Vec::new();
    for b in &batches {
        let xs: Vec<Input> = inputs.iter().map(|i| i.with_batch(*b)).collect();
        match model.estimate(&xs, mode, &options) {
            Ok(e) => rows.push(e),
            Err(e) => return fail(format!("{label} at batch {b}: {e}")),
        }
    }
    let fit = match memory {
        None => None,
        Some(m) => match model.largest_batch(&inputs, mode, &options, Some(m)) {
            Ok(f) => Some(f),
            Err(e) => return fail(format!("{label}: {e}")),
        },
    };
    if a.csv {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "model,batch,mode,weights_bytes,peak_allocated_bytes,peak_reserved_bytes"
        );
        let extra = fit.as_ref().and_then(|f| f.fits.clone());
        for e in rows.iter().chain(extra.iter()) {
            let _ = writeln!(
                out,
                "{label},{},{},{},{},{}",
                e.batch,
                e.mode.label(),
                e.weights_bytes,
                e.peak_allocated,
                e.peak_reserved
            );
        }
        return ExitCode::SUCCESS;
    }
    println!(
        "tch-memprof estimate: {label}, {}, GPU {} (cuBLAS workspace {}), {}",
        mode.label(),
        options.gpu.name,
        bytes(options.gpu.cublas_workspace),
        if options.allocator == AllocatorConfig::default() {
            "default allocator settings".to_string()
        } else {
            format!("PYTORCH_CUDA_ALLOC_CONF={:?}", options.allocator)
        }
    );
    println!("{}", table(&rows));
    if let Some(f) = &fit {
        match (&f.fits, f.margin()) {
            (Some(e), Some(margin)) => println!(
                "largest batch that fits in {}: {} (peak reserved {}, {} left){}",
                bytes(f.memory),
                f.batch,
                bytes(e.peak_reserved),
                bytes(margin),
                f.too_big.as_ref().map_or(String::new(), |t| format!(
                    "; batch {} needs {}",
                    t.batch,
                    bytes(t.peak_reserved)
                ))
            ),
            _ => println!(
                "not even batch 1 fits in {}: it needs {} reserved",
                bytes(f.memory),
                f.too_big
                    .as_ref()
                    .map_or("?".to_string(), |t| bytes(t.peak_reserved))
            ),
        }
    }
    println!("Not modelled (a CUDA run may add):");
    for n in tch_memprof::estimate::NOT_MODELLED {
        println!("- {}: {}", n.what, n.likely);
    }
    if let Some(rss) = host_peak_rss() {
        println!(
            "This estimate's host memory: {} peak resident (the whole process).",
            bytes(rss)
        );
    }
    ExitCode::SUCCESS
}

fn table(rows: &[Estimate]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec![
            "batch",
            "weights",
            "baseline",
            "peak allocated",
            "peak reserved",
            "peak during",
            "time",
        ]);
    for e in rows {
        t.add_row(vec![
            e.batch.to_string(),
            bytes(e.weights_bytes),
            bytes(e.baseline_allocated),
            bytes(e.peak_allocated),
            bytes(e.peak_reserved),
            format!("{} ({}, step {})", e.peak_op, e.peak_phase, e.peak_step),
            format!("{:.2} s", e.elapsed.as_secs_f64()),
        ]);
    }
    for c in [0usize, 1, 2, 3, 4, 6] {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

// ---------------------------------------------------------------------------------
// profile

fn random_input(i: &Input, device: Device) -> Tensor {
    match i.kind {
        Kind::Float | Kind::Half | Kind::BFloat16 | Kind::Double => {
            Tensor::randn(i.shape.as_slice(), (i.kind, device))
        }
        k => Tensor::zeros(i.shape.as_slice(), (k, device)),
    }
}

fn parse_device(s: &str) -> Result<Device, String> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Ok(Device::Cuda(i)),
            _ => Err(format!("invalid device {other:?}: cpu, cuda or cuda:N")),
        },
    }
}

pub fn run_profile(a: &ProfileArgs) -> ExitCode {
    quiet_panics();
    let inputs = match parse_inputs(&a.inputs) {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    let device = match parse_device(&a.device) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    if let Device::Cuda(i) = device {
        if !tch::Cuda::is_available() || i >= tch::Cuda::device_count() as usize {
            return fail(format!("device {} is not available here", a.device));
        }
    }
    if !a.path.is_file() {
        return fail(format!("{}: no such file", a.path.display()));
    }
    match std::panic::catch_unwind(|| profile(a, &inputs, device)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => fail(e),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into());
            fail(format!(
                "{}: {}",
                a.path.display(),
                msg.lines().next().unwrap_or("failed")
            ))
        }
    }
}

fn profile(a: &ProfileArgs, inputs: &[Input], device: Device) -> Result<(), String> {
    let vs = nn::VarStore::new(device);
    let module = tch::TrainableCModule::load(&a.path, vs.root())
        .map_err(|e| format!("{}: cannot load as TorchScript: {e}", a.path.display()))?;
    let mut module = module;
    if a.train {
        module.set_train();
    } else {
        module.set_eval();
    }
    std::fs::create_dir_all(&a.output_dir)
        .map_err(|e| format!("{}: {e}", a.output_dir.display()))?;
    let mut profiler = tch_memprof::MemoryProfiler::builder(&vs)
        .timeline_step(1)
        .csv(true)
        .csv_dir(&a.output_dir)
        .build()
        .map_err(|e| e.to_string())?;
    let xs: Vec<Tensor> = inputs.iter().map(|i| random_input(i, device)).collect();
    let run = || -> Result<(), String> {
        let out = module
            .forward_ts(&xs)
            .map_err(|e| format!("the model's forward pass failed: {e}"))?;
        if a.train {
            let loss = if out.dim() == 2 {
                let y = Tensor::zeros([out.size()[0]], (Kind::Int64, device));
                out.cross_entropy_for_logits(&y)
            } else {
                out.mean(out.kind())
            };
            loss.backward();
        }
        Ok(())
    };
    if a.train {
        run()?;
    } else {
        tch::no_grad(run)?;
    }
    profiler.record_stats();
    let p = profiler
        .step_profile()
        .ok_or("the step was not profiled (see the warnings above)")?;
    let stem = a.output_dir.join("step");
    let title = format!(
        "{} {}",
        a.path.file_name().unwrap_or_default().to_string_lossy(),
        if a.train {
            "training step"
        } else {
            "inference"
        }
    );
    p.plot(&stem.with_extension("png"), Some(&title))
        .map_err(|e| e.to_string())?;
    p.plot(&stem.with_extension("svg"), Some(&title))
        .map_err(|e| e.to_string())?;
    p.write_timeline_csv(&a.output_dir.join("timeline.csv"))
        .map_err(|e| e.to_string())?;
    p.write_layers_csv(&a.output_dir.join("layers.csv"))
        .map_err(|e| e.to_string())?;
    let summary = a.output_dir.join("summary.txt");
    write_summary(&summary, p).map_err(|e| format!("{}: {e}", summary.display()))?;
    for f in [
        "step.png",
        "step.svg",
        "timeline.csv",
        "layers.csv",
        "summary.txt",
    ] {
        println!("wrote {}", a.output_dir.join(f).display());
    }
    Ok(())
}

fn write_summary(path: &Path, p: &tch_memprof::StepProfile) -> std::io::Result<()> {
    use tch_memprof::Category;
    let mut f = std::fs::File::create(path)?;
    let c = &p.category_max;
    writeln!(f, "device: {}", p.device)?;
    writeln!(
        f,
        "peak: {} during {}",
        bytes(p.peak.bytes),
        p.peak.location()
    )?;
    for cat in [
        Category::Param,
        Category::Buffer,
        Category::Grad,
        Category::Act,
        Category::Temp,
        Category::Opt,
        Category::Other,
    ] {
        writeln!(f, "max {}: {}", cat.label(), bytes(c.get(cat)))?;
    }
    writeln!(
        f,
        "FLOPs: forward {}, backward {}",
        p.forward_flops, p.backward_flops
    )?;
    Ok(())
}
