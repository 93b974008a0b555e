//! Step-time overhead of the profiler, and of the step timeline, on a CPU ResNet-18
//! training step (batch 8x3x64x64, Adam), as ratios measured in one run.
//!
//!     scripts/with-libtorch.sh cargo bench --bench overhead
//!
//! The baseline must not have the tracking allocator either, and that one is installed
//! when the library loads; so each measurement is a child process of this bench:
//! baseline children run with TCH_MEMPROF_DISABLE=1 and no profiler; the others build
//! a MemoryProfiler and call record_stats every step: core without leak hunting,
//! profiled with the default settings (leak hunting on), timeline with the step
//! timeline on as well (every op's inputs, every allocation logged, the peak step
//! replayed). The order of the modes rotates every round so that drifts of the machine
//! hit all alike; ratios are of the medians of all timed steps.
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

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Baseline,
    /// The profiler without leak hunting.
    Core,
    /// The default profiler (with leak hunting).
    Profiled,
    /// The default profiler with the step timeline.
    Timeline,
}

const MODES: [Mode; 4] = [Mode::Baseline, Mode::Core, Mode::Profiled, Mode::Timeline];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline",
            Mode::Core => "core",
            Mode::Profiled => "profiled",
            Mode::Timeline => "timeline",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline (no tracking allocator, no profiler)",
            Mode::Core => "profiler without leak hunting",
            Mode::Profiled => "profiler, default settings (leak hunting on)",
            Mode::Timeline => "profiler + step timeline",
        }
    }
}

/// Child: trains ResNet-18 and prints one step time per line, in microseconds.
fn child(mode: Mode, steps: usize) {
    let profiled = mode != Mode::Baseline;
    let vs = nn::VarStore::new(Device::Cpu);
    let net = tch::vision::resnet::resnet18(&vs.root(), 10);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = profiled.then(|| {
        tch_memprof::MemoryProfiler::builder(&vs)
            .print(false)
            .timeline(mode == Mode::Timeline)
            .leak_check(mode != Mode::Core)
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
    if let Ok(name) = std::env::var(MODE) {
        let mode = MODES
            .into_iter()
            .find(|m| m.name() == name)
            .unwrap_or(Mode::Baseline);
        child(mode, steps);
        return;
    }
    let rounds = arg("--rounds", 4);
    let exe = std::env::current_exe().unwrap();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        // Rotate: no mode always runs first.
        for k in 0..MODES.len() {
            let m = (k + round) % MODES.len();
            let mode = MODES[m];
            let mut cmd = Command::new(&exe);
            cmd.args(["--steps", &steps.to_string()]);
            cmd.env(MODE, mode.name());
            if mode == Mode::Baseline {
                cmd.env("TCH_MEMPROF_DISABLE", "1");
            }
            let out = cmd.output().expect("run child");
            assert!(
                out.status.success(),
                "child failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let t: Vec<f64> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.trim().parse::<f64>().ok())
                .map(|us| us / 1000.0)
                .collect();
            eprintln!(
                "round {} {:>8}: median {:.2} ms over {} steps",
                round + 1,
                mode.name(),
                median(&mut t.clone()),
                t.len()
            );
            times[m].extend(t);
        }
    }
    let medians: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    println!(
        "CPU ResNet-18 training step, batch 8x3x64x64, Adam, {} steps per mode",
        times[0].len()
    );
    for (mode, m) in MODES.iter().zip(&medians) {
        println!("  {:<48} {m:.2} ms median", mode.describe());
    }
    for (mode, m) in MODES.iter().zip(&medians).skip(1) {
        println!(
            "  overhead ratio, {}: {:.4} ({:+.2}%)",
            mode.describe(),
            m / medians[0],
            (m / medians[0] - 1.0) * 100.0
        );
    }
}
