//! Memory optimizations measured side by side: a ResNet-style model trained a few steps
//! as the baseline, with gradient checkpointing, with mixed precision (bfloat16
//! autocast), and with both; each measured by the profiler (peak allocated, feature
//! maps, intermediate gradients) and timed (median step after warm-up). Prints the table,
//! writes `comparison.csv` and answers the questions of the exercise from the numbers.
//!
//!     scripts/with-libtorch.sh cargo run --release --example optimizations
//!
//! Options: `--batch-size N` (default 32), `--image N` (default 32: NxN inputs),
//! `--steps N` timed steps (default 8, after 2 warm-up steps), `--device cpu|cuda`
//! (default cpu), `--output PATH` (default optimization_results/comparison.csv).

#[path = "common/args.rs"]
mod args;

use std::path::PathBuf;
use std::time::Instant;

use tch::{nn, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::{autocast, Checkpointed, MemoryProfiler};

const WARMUP: usize = 2;
const CLASSES: i64 = 10;

fn conv_bn(p: &nn::Path, c_in: i64, c_out: i64, k: i64, stride: i64) -> nn::SequentialT {
    let cfg = nn::ConvConfig {
        stride,
        padding: k / 2,
        bias: false,
        ..Default::default()
    };
    nn::seq_t()
        .add(nn::conv2d(p / "conv", c_in, c_out, k, cfg))
        .add(nn::batch_norm2d(p / "bn", c_out, Default::default()))
}

/// A ResNet basic block: conv-bn-relu-conv-bn plus the shortcut, then relu.
fn basic_block(p: &nn::Path, c_in: i64, c_out: i64, stride: i64) -> impl ModuleT {
    let main = conv_bn(&(p / "a"), c_in, c_out, 3, stride)
        .add_fn(|x| x.relu())
        .add(conv_bn(&(p / "b"), c_out, c_out, 3, 1));
    let shortcut =
        (stride != 1 || c_in != c_out).then(|| conv_bn(&(p / "down"), c_in, c_out, 1, stride));
    nn::func_t(move |x, train| {
        let s = match &shortcut {
            Some(d) => d.forward_t(x, train),
            None => x.shallow_clone(),
        };
        (main.forward_t(x, train) + s).relu()
    })
}

/// Stem, three stages of two basic blocks (32, 64, 128 channels), head: one segment
/// each, so that checkpointing can recompute block by block.
fn resnet_segments(vs: &nn::VarStore) -> Vec<Box<dyn ModuleT>> {
    let r = vs.root();
    let mut s: Vec<Box<dyn ModuleT>> = vec![Box::new(
        conv_bn(&(&r / "stem"), 3, 32, 3, 1).add_fn(|x| x.relu()),
    )];
    let mut c_in = 32;
    for (i, c) in [32, 64, 128].into_iter().enumerate() {
        for j in 0..2 {
            let stride = if j == 0 && i > 0 { 2 } else { 1 };
            s.push(Box::new(basic_block(
                &(&r / format!("layer{}", i + 1) / j),
                c_in,
                c,
                stride,
            )));
            c_in = c;
        }
    }
    let fc = nn::linear(&r / "fc", 128, CLASSES, Default::default());
    s.push(Box::new(nn::func_t(move |x, _| {
        x.adaptive_avg_pool2d([1, 1]).flatten(1, -1).apply(&fc)
    })));
    s
}

#[derive(Clone, Copy, PartialEq)]
struct Config {
    name: &'static str,
    checkpointing: bool,
    mixed_precision: bool,
}

const CONFIGS: [Config; 4] = [
    Config {
        name: "baseline",
        checkpointing: false,
        mixed_precision: false,
    },
    Config {
        name: "checkpointing",
        checkpointing: true,
        mixed_precision: false,
    },
    Config {
        name: "mixed precision (bf16)",
        checkpointing: false,
        mixed_precision: true,
    },
    Config {
        name: "both",
        checkpointing: true,
        mixed_precision: true,
    },
];

struct Measured {
    config: Config,
    peak_allocated: u64,
    feature_maps: u64,
    intermediate: u64,
    ms_per_step: f64,
    final_loss: f64,
    peak_where: String,
}

struct Settings {
    batch: i64,
    image: i64,
    steps: usize,
    device: Device,
}

/// Trains a fresh model (same seed, same data for every configuration) for
/// `WARMUP + steps` steps; with `profile_step`, profiles that step's anatomy.
fn train(
    cfg: Config,
    s: &Settings,
    profile_step: Option<u64>,
) -> Result<(Measured, Vec<f64>), Box<dyn std::error::Error>> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(s.device);
    let segments = resnet_segments(&vs);
    let mut model = segments.iter().fold(Checkpointed::new(&vs), |c, m| {
        c.segment(move |x, train| m.forward_t(x, train))
    });
    if cfg.mixed_precision {
        model = model.mixed_precision(Kind::BFloat16);
    }
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;
    let mut builder = MemoryProfiler::builder(&vs).print(false);
    if let Some(n) = profile_step {
        builder = builder.timeline_step(n);
    }
    let mut profiler = builder.build()?;
    let mut times = Vec::new();
    let (mut peak, mut fm, mut inter, mut loss_value) = (0, 0, 0, 0.0);
    let n_steps = profile_step.map_or(WARMUP + s.steps, |n| n as usize);
    for step in 0..n_steps {
        let x = Tensor::randn([s.batch, 3, s.image, s.image], (Kind::Float, s.device));
        let y = Tensor::randint(CLASSES, [s.batch], (Kind::Int64, s.device));
        let t0 = Instant::now();
        opt.zero_grad();
        let loss = if cfg.checkpointing {
            model.forward_backward(&x, |out| out.cross_entropy_for_logits(&y))?
        } else {
            let out = model.forward_t(&x, true)?;
            let loss = match cfg.mixed_precision {
                true => autocast(s.device, Kind::BFloat16, || {
                    out.cross_entropy_for_logits(&y)
                })?,
                false => out.cross_entropy_for_logits(&y),
            };
            loss.backward();
            loss
        };
        opt.step();
        loss_value = loss.double_value(&[]);
        drop((x, y, loss));
        if let Device::Cuda(i) = s.device {
            tch::Cuda::synchronize(i as i64);
        }
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        profiler.record_stats();
        if step >= WARMUP {
            times.push(ms);
            let st = profiler.last_stats().expect("recorded");
            peak = peak.max(st.peak_allocated_bytes);
            fm = fm.max(st.feature_maps_bytes);
            inter = inter.max(st.intermediate_gradients_bytes);
        }
    }
    let peak_where = profiler
        .step_profile()
        .map(|p| format!("{} during {}", mib(p.peak.bytes), p.peak.location()))
        .unwrap_or_default();
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = if sorted.is_empty() {
        0.0
    } else {
        sorted[sorted.len() / 2]
    };
    Ok((
        Measured {
            config: cfg,
            peak_allocated: peak,
            feature_maps: fm,
            intermediate: inter,
            ms_per_step: median,
            final_loss: loss_value,
            peak_where,
        },
        times,
    ))
}

fn pct(new: f64, base: f64) -> String {
    format!("{:+.1}%", (new / base - 1.0) * 100.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let device = args::device(Device::Cpu)?;
    let s = Settings {
        batch: args::number("--batch-size", 32)?,
        image: args::number("--image", 32)?,
        steps: args::number("--steps", 8)? as usize,
        device,
    };
    let output = PathBuf::from(
        args::arg("--output").unwrap_or_else(|| "optimization_results/comparison.csv".into()),
    );
    println!(
        "ResNet-style model (stem, 3 stages x 2 basic blocks, 32/64/128 channels), batch {}x3x{}x{}, \
         Adam, {device:?}; {WARMUP} warm-up steps, then {} timed steps",
        s.batch, s.image, s.image, s.steps
    );

    let mut results = Vec::new();
    for cfg in CONFIGS {
        // The anatomy of one step (timeline on: not timed), then the timed run.
        let (anatomy, _) = train(cfg, &s, Some(WARMUP as u64 + 1))?;
        let (mut m, _) = train(cfg, &s, None)?;
        m.peak_where = anatomy.peak_where;
        println!(
            "  {:<24} peak {:>11}  feature maps {:>11}  {:>8.1} ms/step",
            cfg.name,
            mib(m.peak_allocated),
            mib(m.feature_maps),
            m.ms_per_step
        );
        results.push(m);
    }

    let base = &results[0];
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_header(vec![
            "configuration",
            "peak allocated",
            "vs baseline",
            "feature maps",
            "intermediate grads",
            "ms/step",
            "vs baseline",
        ]);
    for m in &results {
        table.add_row(vec![
            m.config.name.to_string(),
            mib(m.peak_allocated),
            pct(m.peak_allocated as f64, base.peak_allocated as f64),
            mib(m.feature_maps),
            mib(m.intermediate),
            format!("{:.1}", m.ms_per_step),
            pct(m.ms_per_step, base.ms_per_step),
        ]);
    }
    println!("\n{table}");

    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut w = csv::Writer::from_path(&output)?;
    w.write_record([
        "configuration",
        "peak_allocated_bytes",
        "feature_maps_bytes",
        "ms_per_step",
    ])?;
    for m in &results {
        w.write_record([
            m.config.name.to_string(),
            m.peak_allocated.to_string(),
            m.feature_maps.to_string(),
            format!("{:.2}", m.ms_per_step),
        ])?;
    }
    w.flush()?;
    println!("wrote {}", output.display());

    let ck = &results[1];
    let amp = &results[2];
    let both = &results[3];
    println!("\nAnswers, from the measurements above:");
    println!(
        "1. Where does memory peak? Baseline: {}. With checkpointing: {}.",
        base.peak_where, ck.peak_where
    );
    println!(
        "2. How much does checkpointing save? Peak allocated {} -> {} ({}), feature maps \
         {} -> {} ({}).",
        mib(base.peak_allocated),
        mib(ck.peak_allocated),
        pct(ck.peak_allocated as f64, base.peak_allocated as f64),
        mib(base.feature_maps),
        mib(ck.feature_maps),
        pct(ck.feature_maps as f64, base.feature_maps as f64),
    );
    println!(
        "3. Its compute overhead: {:.1} -> {:.1} ms per step ({}): every block but the head \
         runs its forward pass twice.",
        base.ms_per_step,
        ck.ms_per_step,
        pct(ck.ms_per_step, base.ms_per_step)
    );
    println!(
        "4. Does mixed precision change the result? Loss after {} steps: {:.4} in float32, \
         {:.4} in bfloat16 (same data and initialisation); checkpointing alone: {:.4}.",
        WARMUP + s.steps,
        base.final_loss,
        amp.final_loss,
        ck.final_loss
    );
    let cut = 1.0 - both.peak_allocated as f64 / base.peak_allocated as f64;
    println!(
        "Both together cut peak allocated memory by {:.1}% ({} the 30% goal).",
        cut * 100.0,
        if cut > 0.30 { "beyond" } else { "short of" }
    );
    Ok(())
}

/// Bytes in MiB with two decimals, as the table shows them.
fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}
