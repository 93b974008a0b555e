//! Step-time overhead of the profiler on a CPU ResNet-18 training step
//! (batch 8x3x64x64, Adam), as a ratio measured in one run.
//!
//!     scripts/with-libtorch.sh cargo bench --bench overhead
//!
//! The baseline must not have the tracking allocator either, and that one is installed
//! when the library loads; so each measurement is a child process of this bench:
//! baseline children run with TCH_MEMPROF_DISABLE=1 and no profiler, profiled children
//! build a MemoryProfiler and call record_stats every step. Children alternate
//! (A B B A A B ...) so that drifts of the machine hit both alike; the ratio is of the
//! medians of all timed steps.
//!
//! Options (after `--`): `--rounds N` (default 4), `--steps N` timed steps per child
//! (default 20).

use std::process::Command;
use std::time::Instant;

use tch::{nn, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};

const MODE: &str = "TCH_MEMPROF_BENCH_MODE";
const WARMUP: usize = 5;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Child: trains ResNet-18 and prints one step time per line, in microseconds.
fn child(profiled: bool, steps: usize) {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = tch::vision::resnet::resnet18(&vs.root(), 10);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = profiled.then(|| {
        tch_memprof::MemoryProfiler::builder(&vs)
            .print(false)
            .build()
            .expect("profiler")
    });
    for i in 0..WARMUP + steps {
        let t0 = Instant::now();
        let x = Tensor::randn([8, 3, 64, 64], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [8], (Kind::Int64, Device::Cpu));
        let loss = net.forward_t(&x, true).cross_entropy_for_logits(&y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        if let Some(p) = profiler.as_mut() {
            p.record_stats();
        }
        let us = t0.elapsed().as_micros();
        if i >= WARMUP {
            println!("{us}");
        }
    }
    if let Some(p) = profiler {
        assert_eq!(p.failures(), 0);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let steps = arg("--steps", 20);
    if let Ok(mode) = std::env::var(MODE) {
        child(mode == "profiled", steps);
        return;
    }
    let rounds = arg("--rounds", 4);
    let exe = std::env::current_exe().unwrap();
    let mut base = Vec::new();
    let mut prof = Vec::new();
    for round in 0..rounds {
        // A B, then B A: neither mode always runs first.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for profiled in order {
            let mut cmd = Command::new(&exe);
            cmd.args(["--steps", &steps.to_string()]);
            cmd.env(MODE, if profiled { "profiled" } else { "baseline" });
            if !profiled {
                cmd.env("TCH_MEMPROF_DISABLE", "1");
            }
            let out = cmd.output().expect("run child");
            assert!(
                out.status.success(),
                "child failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let times: Vec<f64> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.trim().parse::<f64>().ok())
                .map(|us| us / 1000.0)
                .collect();
            let mut t = times.clone();
            eprintln!(
                "round {} {:>8}: median {:.2} ms over {} steps",
                round + 1,
                if profiled { "profiled" } else { "baseline" },
                median(&mut t),
                times.len()
            );
            if profiled {
                prof.extend(times)
            } else {
                base.extend(times)
            }
        }
    }
    let (mb, mp) = (median(&mut base), median(&mut prof));
    println!(
        "CPU ResNet-18 training step, batch 8x3x64x64, Adam, {} steps per mode",
        base.len()
    );
    println!("  baseline (no tracking allocator, no profiler): {mb:.2} ms median");
    println!("  with MemoryProfiler, record_stats every step:  {mp:.2} ms median");
    println!(
        "  overhead ratio: {:.4} ({:+.2}%)",
        mp / mb,
        (mp / mb - 1.0) * 100.0
    );
}
