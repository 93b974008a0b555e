//! The main job: a small CNN trained on synthetic image batches with Adam, with the four
//! profiler lines inserted. Runs on CUDA when one is present, else on the CPU.
//!
//!     scripts/with-libtorch.sh cargo run --release --example quickstart
//!
//! Options: `--epochs N` (default 3), `--iterations N` per epoch (default 20),
//! `--batch-size N` (default 32), `--device cpu|cuda` (default: cuda if available),
//! `--label TEXT` (what `tch-memprof report` and `diff` call the run; default: its folder),
//! `--html` (also the run's offline HTML report, with step 2 examined op by op and the
//! blocks idle at its peak; `scripts/readme-pictures.sh` draws the README's picture of it).

#[path = "common/args.rs"]
mod args;

use tch::{nn, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};

fn cnn(p: &nn::Path, classes: i64) -> impl ModuleT {
    let conv = |p: nn::Path, i, o| {
        nn::conv2d(
            p,
            i,
            o,
            3,
            nn::ConvConfig {
                padding: 1,
                bias: false,
                ..Default::default()
            },
        )
    };
    nn::seq_t()
        .add(conv(p / "conv1", 3, 32))
        .add(nn::batch_norm2d(p / "bn1", 32, Default::default()))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(conv(p / "conv2", 32, 64))
        .add(nn::batch_norm2d(p / "bn2", 64, Default::default()))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add_fn(|x| x.flatten(1, -1))
        .add(nn::linear(p / "fc1", 64 * 8 * 8, 256, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc2", 256, classes, Default::default()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let epochs = args::number("--epochs", 3)?;
    let iterations = args::number("--iterations", 20)?;
    let batch = args::number("--batch-size", 32)?;
    let device = args::device(Device::cuda_if_available())?;
    let device_name = match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_string(),
    };
    let plural = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    println!(
        // Lines of at most 60 columns: a narrow terminal shows them whole.
        "quickstart: a small CNN trained with Adam on {device_name}\n  {} x {}, batch {batch}",
        plural(epochs, "epoch", "epochs"),
        plural(iterations, "iteration", "iterations")
    );

    let vs = nn::VarStore::new(device);
    let net = cnn(&vs.root(), 10);
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;

    let mut builder = tch_memprof::MemoryProfiler::builder(&vs)
        .print_period(10)
        .csv(true);
    if let Some(label) = args::arg("--label") {
        builder = builder.label(label);
    }
    if args::flag("--html") {
        builder = builder.html(true).timeline_step(2).idle_at_peak(true);
    }
    let mut profiler = builder.build()?;

    for _epoch in 0..epochs {
        for _ in 0..iterations {
            // Synthetic 32x32 RGB images and labels.
            let images = Tensor::randn([batch, 3, 32, 32], (Kind::Float, device));
            let labels = Tensor::randint(10, [batch], (Kind::Int64, device));
            let loss = net
                .forward_t(&images, true)
                .cross_entropy_for_logits(&labels);
            opt.zero_grad();
            loss.backward();
            opt.step();
            profiler.record_stats();
        }
        profiler.epoch_end();
    }

    // Which file answers what (docs/csv.md has every column): the epochs first.
    let what = |p: &std::path::Path| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match name.rsplit('_').next().unwrap_or("") {
            "epochs.csv" => "open first: one row an epoch, its peaks",
            "summary.csv" => "one row a report, every category",
            "parameters.csv" => "every variable's row, again when one changes or an epoch begins",
            "run.csv" => "versions and settings",
            _ => "",
        }
    };
    println!("\nCSV files:");
    let mut paths: Vec<_> = profiler.csv_paths().iter().filter(|p| p.exists()).collect();
    paths.sort_by_key(|p| !what(p).starts_with("open first"));
    for p in paths {
        println!("  {}", p.display());
        let w = what(p);
        if !w.is_empty() {
            println!("    {w}");
        }
    }
    if let Some(page) = profiler.html_path() {
        println!("\nHTML report:\n  {}", page.display());
    }
    if profiler.failures() > 0 {
        println!(
            "profiler failures: {} (see the warnings above)",
            profiler.failures()
        );
    }
    Ok(())
}
