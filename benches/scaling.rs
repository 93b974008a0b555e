//! How the profiler's own calls grow with the work they see: `record_stats` and
//! `epoch_end` against 100, 1,000, 10,000 and 100,000 variables, and `epoch_end` (the
//! leak hunt) against 10,000 and 1,000,000 live blocks in the leak registry; and the
//! CUDA accounting's cost a report (the caching allocator's reports of fake blocks
//! driven through the reporter on the CPU, on the training thread and on another).
//!
//!     scripts/with-libtorch.sh cargo bench --bench scaling
//!
//! Each variable is a 16-float parameter with a gradient. `record_stats` is timed in the
//! state a training loop calls it in (nothing printed, no CSV: a non-reporting call):
//! back to back (the variables and their gradients kept), and after an optimizer's
//! `zero_grad` and a backward pass (every gradient a new block, as in a tch loop: only
//! the `record_stats` call is timed, at most 20 rounds, 5 at 100,000 variables); and
//! once more reporting (a CSV row every call, the terminal off). Every figure is the
//! median of the timed calls (a reporting call writes a row per variable: at 100,000
//! variables it is timed over at most 10 calls). The last lines give the ratio of the
//! per-variable costs at 10,000 and 1,000 variables. Options (after `--`):
//! `--calls N` (default 200).

use std::time::{Duration, Instant};

use tch::{nn, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A store of `n` parameters of 16 floats, each with a gradient.
fn store(n: usize) -> nn::VarStore {
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    for i in 0..n {
        let _ = (&root / format!("layer{}", i / 4)).var(
            &format!("p{}", i % 4),
            &[16],
            nn::Init::Const(1.0),
        );
    }
    backward(&vs);
    vs
}

/// A backward pass that gives every parameter of `vs` a gradient.
fn backward(vs: &nn::VarStore) {
    let loss = vs
        .trainable_variables()
        .iter()
        .fold(Tensor::zeros([], (Kind::Float, Device::Cpu)), |acc, p| {
            acc + p.sum(Kind::Float)
        });
    loss.backward();
}

/// Lets the C allocator tidy what the backward pass freed (its graph: hundreds of
/// thousands of small blocks) before the timed call: glibc merges freed small chunks at
/// the next large request, which in a training loop is the next forward pass's first
/// tensor, whether or not a profiler runs; timed, it would be charged to `record_stats`.
fn settle() {
    drop(std::hint::black_box(vec![0u8; 1 << 20]));
}

/// The median of `f` over `rounds`, each after an untimed `setup`.
fn time_after(rounds: usize, mut setup: impl FnMut(), mut f: impl FnMut()) -> Duration {
    median(
        (0..rounds)
            .map(|_| {
                setup();
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn time_calls(calls: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..calls.min(10) {
        f();
    }
    median(
        (0..calls)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let calls = arg("--calls", 200);
    let dir = tempfile::tempdir().expect("a scratch folder");
    println!("tch-memprof scaling bench: median of {calls} calls each (CPU)");
    println!();
    println!(
        "| variables | record_stats | per variable | after zero_grad + backward | per variable \
         | record_stats, CSV row | epoch_end |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut per_variable = Vec::new();
    for n in [100usize, 1_000, 10_000, 100_000] {
        let vs = store(n);
        let (quiet, fresh) = {
            let mut p = MemoryProfiler::builder(&vs)
                .print(false)
                .csv(false)
                .build()
                .expect("profiler");
            let t = time_calls(calls, || p.record_stats());
            assert_eq!(p.failures(), 0);
            assert_eq!(p.last_stats().map(|s| s.variables.len()), Some(n));
            let mut opt = nn::Sgd::default().build(&vs, 0.0).expect("optimizer");
            let rounds = if n >= 100_000 { 5 } else { calls.min(20) };
            let fresh = time_after(
                rounds,
                || {
                    // libtorch's zero_grad sets the gradients to none: new blocks each time.
                    opt.zero_grad();
                    backward(&vs);
                    settle();
                },
                || p.record_stats(),
            );
            assert_eq!(p.failures(), 0);
            let s = p.last_stats().expect("stats");
            assert_eq!(
                s.gradients_bytes,
                16 * 4 * n as u64,
                "every gradient counted"
            );
            (t, fresh)
        };
        let (csv, epoch) = {
            let mut p = MemoryProfiler::builder(&vs)
                .print(false)
                .csv(true)
                .csv_dir(dir.path())
                .build()
                .expect("profiler");
            let rounds = if n >= 100_000 { calls.min(10) } else { calls };
            let t = time_calls(rounds, || p.record_stats());
            let e = time_calls(rounds.min(50), || p.epoch_end());
            assert_eq!(p.failures(), 0);
            (t, e)
        };
        println!(
            "| {n} | {:.1} us | {:.3} us | {:.1} us | {:.3} us | {:.1} us | {:.1} us |",
            us(quiet),
            us(quiet) / n as f64,
            us(fresh),
            us(fresh) / n as f64,
            us(csv),
            us(epoch)
        );
        per_variable.push((n, us(quiet) / n as f64, us(fresh) / n as f64));
    }
    let cost = |n| per_variable.iter().find(|(m, _, _)| *m == n).copied();
    if let (Some((_, q1, f1)), Some((_, q10, f10))) = (cost(1_000), cost(10_000)) {
        println!();
        println!(
            "record_stats per variable, 10,000 against 1,000 variables: {:.2}x back to back, \
             {:.2}x after zero_grad + backward",
            q10 / q1,
            f10 / f1
        );
    }
    println!();
    println!("| live blocks in the leak registry | epoch_end (leak hunt) | record_stats |");
    println!("|---:|---:|---:|");
    for blocks in [10_000usize, 1_000_000] {
        let vs = store(100);
        let mut p = MemoryProfiler::builder(&vs)
            .print(false)
            .csv(false)
            .leak_check(true)
            .leak_warmup_epochs(1)
            .build()
            .expect("profiler");
        // Blocks born while the profiler runs, held across epochs like a leak would be.
        let held: Vec<Tensor> = (0..blocks)
            .map(|_| Tensor::zeros([1], (Kind::Float, Device::Cpu)))
            .collect();
        let rounds = if blocks > 100_000 { 5 } else { 20 };
        let record = time_calls(calls, || p.record_stats());
        let epoch = time_calls(rounds, || p.epoch_end());
        assert_eq!(p.failures(), 0);
        drop(held);
        println!("| {blocks} | {:.1} us | {:.1} us |", us(epoch), us(record));
    }
    cuda_accounting();
}

/// The CUDA accounting path's cost a report, without a GPU: the caching allocator's
/// reports of 10,000 fake cuda:0 blocks born, then dead, handed to the reporter as
/// libtorch hands them (the CUDA block table, the device counters, the generation
/// slots, and with leak hunting the live-block registry and the blocks' origins), with
/// no session, a session without leak hunting and a default one, on the training
/// thread and on a thread of its own (CUDA's backward reports from the autograd
/// engine's device thread). The median of 20 runs, per report.
fn cuda_accounting() {
    const BLOCKS: u64 = 10_000;
    println!();
    println!("| CUDA reports (driven on the CPU) | training thread | another thread |");
    println!("|---|---:|---:|");
    let vs = store(100);
    for (name, session) in [
        ("no session", None),
        ("profiler without leak hunting", Some(false)),
        ("default profiler (leak hunting on)", Some(true)),
    ] {
        let p = session.map(|leaks| {
            MemoryProfiler::builder(&vs)
                .print(false)
                .csv(false)
                .leak_check(leaks)
                .build()
                .expect("profiler")
        });
        let per_report = |other: bool| {
            let runs: Vec<Duration> = (0..20)
                .map(|_| {
                    tch_memprof::__private::cuda_report_cost(BLOCKS, other)
                        .expect("the CUDA reports")
                })
                .collect();
            median(runs).as_secs_f64() * 1e9 / (2 * BLOCKS) as f64
        };
        let (here, there) = (per_report(false), per_report(true));
        println!("| {name} | {here:.0} ns | {there:.0} ns |");
        drop(p);
    }
}
