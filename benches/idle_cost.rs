//! Cost of the idle-at-peak detail: the step it examines (every op's input storages
//! logged, the call stack of every allocation taken) against the same step profiled with
//! the timeline alone, on a CPU ResNet-50 training step (batch 4x3x112x112, SGD).
//!
//!     scripts/with-libtorch.sh cargo bench --bench idle_cost
//!
//! Each round builds one profiler per mode (the order alternates every round), runs
//! three steps and times step 2, the profiled one, from the loop's side (forward,
//! backward, optimizer) and the `record_stats` that ends it (where the detailed step's
//! call stacks are symbolised). Prints the medians and their ratio, and fails when the
//! detailed step costs more than twice the plain one.
//!
//! Options (after `--`): `--rounds N` (default 6).

use std::time::{Duration, Instant};

use tch::{nn, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

fn rounds() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

/// The time of step 2 (the loop's work and the `record_stats` that ends it).
fn profiled_step(idle: bool) -> (Duration, Duration) {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = tch::vision::resnet::resnet50(&vs.root(), 10);
    let mut opt = nn::Sgd::default().build(&vs, 1e-2).expect("optimizer");
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(2)
        .idle_at_peak(idle)
        .build()
        .expect("profiler");
    let x = Tensor::randn([4, 3, 112, 112], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(10, [4], (Kind::Int64, Device::Cpu));
    let mut timed = (Duration::ZERO, Duration::ZERO);
    for step in 1..=3 {
        let t = Instant::now();
        opt.zero_grad();
        let loss = net.forward_t(&x, true).cross_entropy_for_logits(&y);
        loss.backward();
        opt.step();
        let work = t.elapsed();
        let t = Instant::now();
        prof.record_stats();
        if step == 2 {
            timed = (work, t.elapsed());
        }
    }
    assert_eq!(prof.failures(), 0);
    assert_eq!(
        prof.step_profile().map(|p| p.idle.is_some()),
        Some(idle),
        "the detail is on exactly when asked for"
    );
    timed
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let (mut plain, mut detail) = (Vec::new(), Vec::new());
    for round in 0..rounds() {
        for idle in [round % 2 == 1, round % 2 == 0] {
            let (work, end) = profiled_step(idle);
            if idle {
                detail.push((work, end));
            } else {
                plain.push((work, end));
            }
        }
    }
    let total = |v: &[(Duration, Duration)]| median(v.iter().map(|(w, e)| *w + *e).collect());
    let ends = |v: &[(Duration, Duration)]| median(v.iter().map(|(_, e)| *e).collect());
    let (p, d) = (total(&plain), total(&detail));
    let ratio = d.as_secs_f64() / p.as_secs_f64();
    println!(
        "ResNet-50 CPU step 2, median of {} rounds: timeline {:.1} ms (record_stats {:.1} ms), \
         with the idle detail {:.1} ms (record_stats {:.1} ms): ratio {ratio:.3}",
        plain.len(),
        p.as_secs_f64() * 1e3,
        ends(&plain).as_secs_f64() * 1e3,
        d.as_secs_f64() * 1e3,
        ends(&detail).as_secs_f64() * 1e3,
    );
    if ratio > 2.0 {
        eprintln!("the detailed step costs more than twice the timeline's: ratio {ratio:.3}");
        std::process::exit(1);
    }
}
