//! The profiler's own memory over a long clean run: 100,000 iterations of a tiny model
//! with the default settings (leak hunting on), an epoch end every 1,000 iterations.
//! Prints, at checkpoints, the bytes the profiler holds (its buffers, the registry
//! entries and log events it has used; `RunStats::profiler_memory_bytes`) and the
//! process's resident memory.
//!
//!     scripts/with-libtorch.sh cargo bench --bench bounded_memory
//!
//! Options (after `--`): `--iterations N` (default 100000).

#[path = "../tests/common/mod.rs"]
mod common;

use tch::{nn, nn::OptimizerConfig, Device};

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iterations: u64 = args
        .iter()
        .position(|a| a == "--iterations")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    tch::set_num_threads(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = common::tiny_mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = tch_memprof::MemoryProfiler::builder(&vs)
        .print(false)
        .build()
        .unwrap();
    let checkpoints = [1_000, 10_000, 100_000, 1_000_000];
    println!(
        "{:>10}  {:>22}  {:>16}  {:>8}",
        "iteration", "profiler memory (B)", "process RSS", "suspects"
    );
    let t0 = std::time::Instant::now();
    for i in 1..=iterations {
        common::tiny_step(&net, &mut opt);
        profiler.record_stats();
        if i % 1_000 == 0 {
            profiler.epoch_end();
        }
        if checkpoints.contains(&i) || i == iterations {
            let s = profiler.stats();
            println!(
                "{i:>10}  {:>22}  {:>12.1} MiB  {:>8}",
                s.profiler_memory_bytes,
                rss_bytes() as f64 / (1 << 20) as f64,
                s.leaks.map_or(0, |l| l.suspects.len())
            );
        }
    }
    assert_eq!(profiler.failures(), 0);
    println!(
        "{iterations} iterations in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
