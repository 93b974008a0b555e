//! Leak hunting: a training loop with each classic leak behind a flag, and the clean
//! loop without flags. The profiler names each leak within two epochs after the
//! warm-up epoch (terminal, log, `memory_csv_data/<run>_leaks.csv`).
//!
//!     scripts/with-libtorch.sh cargo run --release --example leak_hunt -- --graph
//!
//! Leaks (any combination; none: the clean loop):
//! - `--graph`: a validation loss computed outside `no_grad` and summed over the run.
//!   That pass never runs backward, so its graph keeps every activation it saved.
//! - `--outputs`: the logits of every iteration pushed into a Vec.
//! - `--cache`: normalised input batches cached by batch id and never evicted.
//!
//! Options: `--epochs N` (default 4), `--iterations N` per epoch (default 20),
//! `--snapshot PATH` (record the memory history and write a snapshot for PyTorch's
//! memory viewer at the end),
//! `--device cpu|cuda` (default cpu). Exits with status 1 when a requested leak was
//! not named, or a clean run raised a suspect.

#[path = "common/args.rs"]
mod args;

use std::collections::HashMap;

use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::{LeakPattern, MemoryProfiler};

const BATCH: i64 = 64;
const IN: i64 = 784;
const HIDDEN: i64 = 512;
const CLASSES: i64 = 10;

fn mlp(p: &nn::Path) -> impl Module {
    nn::seq()
        .add(nn::linear(p / "fc1", IN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc2", HIDDEN, CLASSES, Default::default()))
}

#[allow(clippy::assign_op_pattern)] // `total = total + loss`, as users write it
fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    for a in std::env::args().skip(1) {
        let known = [
            "--snapshot",
            "--graph",
            "--outputs",
            "--cache",
            "--epochs",
            "--iterations",
            "--device",
        ];
        if a.starts_with("--") && !known.contains(&a.as_str()) {
            return Err(format!("unknown option {a}; known: {}", known.join(" ")).into());
        }
    }
    let (graph, outputs, cache) = (
        args::flag("--graph"),
        args::flag("--outputs"),
        args::flag("--cache"),
    );
    let epochs = args::number("--epochs", 4)? as u64;
    let iterations = args::number("--iterations", 20)?;
    let device = args::device(Device::Cpu)?;
    let leaks: Vec<&str> = [(graph, "graph"), (outputs, "outputs"), (cache, "cache")]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
    println!(
        "leak_hunt: {} on {device:?}, {epochs} epochs of {iterations} iterations (epoch 1 is \
         the warm-up)",
        if leaks.is_empty() {
            "clean loop".to_string()
        } else {
            format!("leaks: {}", leaks.join(", "))
        }
    );

    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let net = mlp(&vs.root());
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;
    let mut profiler = MemoryProfiler::builder(&vs)
        .print_period(iterations as usize) // one iteration report per epoch
        .top_variables(0)
        .csv(true)
        .build()?;
    let snapshot = args::arg("--snapshot");
    if snapshot.is_some() {
        profiler.start_memory_history(1 << 20)?;
    }

    let opts = (Kind::Float, device);
    let val_x = Tensor::randn([BATCH, IN], opts);
    let val_y = Tensor::randint(CLASSES, [BATCH], (Kind::Int64, device));
    let mut val_total = Tensor::zeros([], opts); // --graph
    let mut history: Vec<Tensor> = Vec::new(); // --outputs
    let mut batch_cache: HashMap<i64, Tensor> = HashMap::new(); // --cache
    let mut named: Vec<(u64, LeakPattern)> = Vec::new();
    let mut batch_id = 0;
    for _epoch in 1..=epochs {
        for _ in 0..iterations {
            batch_id += 1;
            let x = Tensor::randn([BATCH, IN], opts);
            let y = Tensor::randint(CLASSES, [BATCH], (Kind::Int64, device));
            let x = if cache {
                // Normalised once per batch id, kept forever.
                batch_cache
                    .entry(batch_id)
                    .or_insert_with(|| tch::no_grad(|| (&x - x.mean(Kind::Float)) / x.std(true)))
                    .shallow_clone()
            } else {
                x
            };
            let logits = net.forward(&x);
            let loss = logits.cross_entropy_for_logits(&y);
            opt.backward_step(&loss);
            if graph {
                // The bug: no tch::no_grad, and the sum keeps every pass's graph.
                val_total = val_total + net.forward(&val_x).cross_entropy_for_logits(&val_y);
            }
            if outputs {
                history.push(logits); // the bug: tensors, not numbers
            }
            profiler.record_stats();
        }
        profiler.epoch_end();
        if let Some(r) = profiler.last_leaks() {
            if let Some(p) = r.pattern {
                named.push((r.epoch, p));
            }
        }
    }

    let first = named.first().map(|(e, _)| *e);
    let ok = if leaks.is_empty() {
        named.is_empty()
    } else {
        first.is_some_and(|e| e <= 3)
    };
    println!(
        "\nleak_hunt: {}",
        match (leaks.is_empty(), first) {
            (true, None) => "clean loop, no suspect raised".to_string(),
            (true, Some(e)) => format!("clean loop, but a suspect was raised at epoch {e}"),
            (false, Some(e)) => format!(
                "first named at the end of epoch {e} ({} after the warm-up); patterns: {:?}",
                if e == 2 { "one epoch" } else { "two epochs" },
                named.iter().map(|(_, p)| *p).collect::<Vec<_>>()
            ),
            (false, None) => "the leak was not named".to_string(),
        }
    );
    if let Some(p) = profiler
        .csv_paths()
        .iter()
        .find(|p| p.exists() && p.to_string_lossy().ends_with("_leaks.csv"))
    {
        println!("leak_hunt: suspects written to {}", p.display());
    }
    if let Some(path) = &snapshot {
        // What is alive now, each block with the op and layer that made it: open it in
        // https://pytorch.org/memory_viz.
        profiler.write_memory_snapshot(path)?;
        println!("leak_hunt: memory snapshot written to {path}");
        if device.is_cuda() {
            let allocator = format!("{path}.allocator.pickle");
            profiler.write_cuda_allocator_snapshot(&allocator)?;
            println!("leak_hunt: the CUDA allocator's snapshot written to {allocator}");
        }
    }
    drop((val_total, history, batch_cache));
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
