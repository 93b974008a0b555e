//! Step-time overhead of the profiler, and of the step timeline, on a CPU ResNet-18
//! training step (batch 8x3x64x64, Adam), as ratios measured in one run.
//!
//!     scripts/with-libtorch.sh cargo bench --bench overhead
//!
//! The baseline must not have the tracking allocator either, and that one is installed
//! when the library loads; so each measurement is a child process of this bench:
//! baseline children run with TCH_MEMPROF_DISABLE=1 and no profiler, profiled children
//! build a MemoryProfiler and call record_stats every step, timeline children do the
//! same with the step timeline on (every op's inputs, every allocation logged, the
//! peak step replayed). The order of the three rotates every round so that drifts of
//! the machine hit all alike; ratios are of the medians of all timed steps.
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
    Profiled,
    Timeline,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline",
            Mode::Profiled => "profiled",
            Mode::Timeline => "timeline",
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
        let mode = match mode.as_str() {
            "profiled" => Mode::Profiled,
            "timeline" => Mode::Timeline,
            _ => Mode::Baseline,
        };
        child(mode, steps);
        return;
    }
    let rounds = arg("--rounds", 4);
    let exe = std::env::current_exe().unwrap();
    let mut base = Vec::new();
    let mut prof = Vec::new();
    let mut tl = Vec::new();
    let modes = [Mode::Baseline, Mode::Profiled, Mode::Timeline];
    for round in 0..rounds {
        // Rotate: no mode always runs first.
        let order: Vec<Mode> = (0..3).map(|k| modes[(k + round) % 3]).collect();
        for mode in order {
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
            let times: Vec<f64> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.trim().parse::<f64>().ok())
                .map(|us| us / 1000.0)
                .collect();
            let mut t = times.clone();
            eprintln!(
                "round {} {:>8}: median {:.2} ms over {} steps",
                round + 1,
                mode.name(),
                median(&mut t),
                times.len()
            );
            match mode {
                Mode::Baseline => base.extend(times),
                Mode::Profiled => prof.extend(times),
                Mode::Timeline => tl.extend(times),
            }
        }
    }
    let (mb, mp, mt) = (median(&mut base), median(&mut prof), median(&mut tl));
    println!(
        "CPU ResNet-18 training step, batch 8x3x64x64, Adam, {} steps per mode",
        base.len()
    );
    println!("  baseline (no tracking allocator, no profiler): {mb:.2} ms median");
    println!("  with MemoryProfiler, record_stats every step:  {mp:.2} ms median");
    println!("  with the step timeline on as well:            {mt:.2} ms median");
    println!(
        "  overhead ratio, profiler: {:.4} ({:+.2}%)",
        mp / mb,
        (mp / mb - 1.0) * 100.0
    );
    println!(
        "  overhead ratio, profiler + timeline: {:.4} ({:+.2}%)",
        mt / mb,
        (mt / mb - 1.0) * 100.0
    );
}
