//! Step-time overhead of the profiler, and of the step timeline, on a training step, as
//! ratios measured in one run: a ResNet-18 step (batch 8x3x64x64, Adam; the default), or
//! one of two launch-bound proxies (`--model mlp`, `--model attention`): many small ops
//! whose arithmetic is negligible, trained with SGD, so that nothing hides the
//! profiler's cost per op and per allocation, the way a small or medium CUDA step is
//! bound by kernel launches. The extra time of each mode is also printed per op and
//! per allocation of the step (counted in one profiled step of a child of its own).
//!
//!     scripts/with-libtorch.sh cargo bench --bench overhead
//!     scripts/with-libtorch.sh cargo bench --bench overhead -- --model mlp
//!     scripts/with-libtorch.sh cargo bench --bench overhead -- --device cuda
//!
//! The baseline must not have the tracking allocator either, and that one is installed
//! when the library loads; so each mode runs in a child process of this bench: the
//! baseline with TCH_MEMPROF_DISABLE=1 and no profiler; the others build a
//! MemoryProfiler and call record_stats every step: core without leak hunting,
//! profiled with the default settings (leak hunting on), timeline with the step
//! timeline on as well (every op's inputs, every allocation logged, the peak step
//! replayed); and a control, the baseline again in a process of its own: its ratio to
//! the baseline is the bench's resolution in that run, what it cannot tell from no
//! cost at all.
//!
//! **Interleaved turn by turn.** Each round starts one child of every mode; each builds
//! its model, runs its warm-up steps and waits. The bench then has them take turns, of
//! two steps each by default (a line on the child's stdin starts a turn, the child
//! answers with the time of its last step), in an order that rotates every turn: a
//! baseline step and a profiled step are at most a few steps apart, so a slow phase of a
//! shared machine hits every mode alike (on a 2-core AMD EPYC, the baseline's round
//! medians spread from 165.8 to 196.9 ms in one run, and every mode's moved with them).
//! Only a turn's last step is timed: it runs right after a step of its own process, as
//! a step of a training loop does, with the caches holding what that loop leaves in
//! them. With `--turn 1` each timed step runs right after the other children's, with
//! cold caches: every step then pays misses a training loop does not, the profiler's
//! included ([the figures](../docs/in-a-training-run.md)). The children are new every
//! round: where a process's memory falls moves its step time for the whole process
//! (on that machine a mode's round median was up to 5% above or below its round's
//! baseline, in either direction), so a mode's figure is taken over many processes:
//! the defaults are many short rounds (30 of 10 steps).
//!
//! Three ratios to the baseline are printed side by side: of the medians of all timed
//! steps, of the fastest rounds' medians, and the median of each step's ratio to the
//! baseline step of its turn ("paired"). On CUDA each step ends with a synchronize, so
//! a step's time is the GPU's work or the CPU's launching it, whichever is longer: a
//! fast GPU makes a small step CPU-bound, and the profiler's per-op callbacks then show
//! in full.
//!
//! Every child runs with glibc's malloc thresholds pinned (`MALLOC_MMAP_THRESHOLD_`,
//! `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`, unless already set): left to adapt, glibc
//! maps and unmaps the step's large blocks from one run to the next differently, and the
//! page faults that follow (352,000 and 812,000 in two identical baseline runs of 35
//! steps on a 2-core AMD EPYC: `TCH_MEMPROF_DISABLE=1 TCH_MEMPROF_BENCH_MODE=baseline
//! perf stat -e page-faults <this bench's binary> --steps 30`) moved step times by more
//! than the profiler costs. Pinned, every run took about 88,000, most of them at start-up.
//! The children run libtorch on one thread (`--threads`): with two, the OpenMP
//! workers' waits on a 2-core machine moved a step's time by more than the profiler
//! costs.
//!
//! Options (after `--`): `--rounds N` (default 30), `--steps N` timed steps per child
//! and round (default 10), `--turn N` steps a child runs a turn, the last one timed
//! (default 2), `--threads N` libtorch's threads in each child (default 1),
//! `--device cpu|cuda` (default cpu), `--model resnet18|mlp|attention|resnet50|gpt2`
//! (the last two: GPU-bound steps on CUDA, ResNet-50 with SGD and GPT-2 small with
//! AdamW), `--batch N` (default 8, 16 for the MLP, 2 for attention, 64 for ResNet-50, 8
//! for GPT-2), `--image N` (the ResNets', default 64 and 224: the input is Nx3xIxI) and
//! `--tokens N` (GPT-2's, default 1024). A small input keeps every op and allocation of the step but little
//! of its arithmetic, so that the profiler's share shows. A child run by hand (without
//! `--lockstep`) runs its warm-up and `--steps` steps and prints each step's time in
//! microseconds and its `record_stats` call's in nanoseconds (0 without a profiler), a
//! line each; so it runs under `valgrind --tool=callgrind` in minutes:
//! `TCH_MEMPROF_BENCH_MODE=profiled valgrind --tool=callgrind <this bench's binary>
//! --batch 1 --image 16 --steps 2`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use tch::{nn, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};

const MODE: &str = "TCH_MEMPROF_BENCH_MODE";
/// glibc's malloc thresholds, fixed for every child: 32 MiB (the largest mmap threshold
/// glibc takes), never trim the heap, 256 MiB of top pad.
const MALLOC_PINNED: [(&str, &str); 3] = [
    ("MALLOC_MMAP_THRESHOLD_", "33554432"),
    ("MALLOC_TRIM_THRESHOLD_", "4294967296"),
    ("MALLOC_TOP_PAD_", "268435456"),
];
const WARMUP: usize = 5;

fn arg_str(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

fn arg(name: &str, default: usize) -> usize {
    match arg_str(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("overhead: {name} {v}: not a whole number");
            std::process::exit(2)
        }),
    }
}

/// `--device cpu|cuda`; anything else is refused in one line.
fn device() -> Device {
    match arg_str("--device").as_deref() {
        None | Some("cpu") => Device::Cpu,
        Some("cuda") if tch::Cuda::is_available() => Device::Cuda(0),
        Some("cuda") => {
            eprintln!("overhead: --device cuda: libtorch sees no CUDA device here");
            std::process::exit(2)
        }
        Some(other) => {
            eprintln!("overhead: --device {other}: expected cpu or cuda");
            std::process::exit(2)
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Baseline,
    /// The profiler without leak hunting.
    Core,
    /// The default profiler (with leak hunting).
    Profiled,
    /// The default profiler writing its CSV files (a row per iteration: what `tch-memprof
    /// watch` reads), without printing.
    Csv,
    /// The default profiler with the step timeline.
    Timeline,
    /// The baseline again, in a process of its own: two identical modes' ratio is what
    /// the bench cannot tell from 1 in that run.
    Control,
}

const MODES: [Mode; 6] = [
    Mode::Baseline,
    Mode::Core,
    Mode::Profiled,
    Mode::Csv,
    Mode::Timeline,
    Mode::Control,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline",
            Mode::Core => "core",
            Mode::Profiled => "profiled",
            Mode::Csv => "csv",
            Mode::Timeline => "timeline",
            Mode::Control => "control",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline (no tracking allocator, no profiler)",
            Mode::Core => "profiler without leak hunting",
            Mode::Profiled => "profiler, default settings (leak hunting on)",
            Mode::Csv => "profiler, default settings, CSV written (watch)",
            Mode::Timeline => "profiler + step timeline",
            Mode::Control => "control (the baseline again)",
        }
    }
}

/// The step the bench times (`--model`).
#[derive(Clone, Copy, PartialEq)]
enum Model {
    /// ResNet-18 with Adam: the arithmetic and Adam's sweep over 11 million weights
    /// dominate, on the CPU.
    Resnet18,
    /// A narrow, deep MLP with SGD: many small ops whose arithmetic is negligible, the
    /// way a small or medium CUDA step is bound by kernel launches.
    Mlp,
    /// Small transformer blocks at tiny widths with SGD: the same, with the ops of
    /// attention (layer norms, matmuls, softmax, reshapes).
    Attention,
    /// ResNet-50 with SGD (batch 64x3x224x224 by default): a GPU-bound step on CUDA.
    Resnet50,
    /// GPT-2 small with AdamW (batch 8x1024 tokens by default): a GPU-bound step on CUDA.
    Gpt2,
}

const MODELS: [(&str, Model); 5] = [
    ("resnet18", Model::Resnet18),
    ("mlp", Model::Mlp),
    ("attention", Model::Attention),
    ("resnet50", Model::Resnet50),
    ("gpt2", Model::Gpt2),
];

/// `--model resnet18|mlp|attention|resnet50|gpt2` (default resnet18).
fn model() -> Model {
    let name = arg_str("--model").unwrap_or_else(|| "resnet18".into());
    MODELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, m)| m)
        .unwrap_or_else(|| {
            eprintln!(
                "overhead: --model {name}: expected resnet18, mlp, attention, resnet50 or gpt2"
            );
            std::process::exit(2)
        })
}

/// The MLP proxy: 48 linear layers of width 32 with ReLUs, batch 16.
const MLP_DEPTH: i64 = 48;
const MLP_WIDTH: i64 = 32;
/// The attention proxy: 6 pre-norm blocks of width 16, 2 heads, 8 tokens, batch 2.
const ATT_BLOCKS: i64 = 6;
const ATT_WIDTH: i64 = 16;
const ATT_HEADS: i64 = 2;
const ATT_TOKENS: i64 = 8;

impl Model {
    fn describe(self) -> String {
        match self {
            Model::Resnet18 => {
                let (batch, image) = (arg("--batch", 8), arg("--image", 64));
                format!("ResNet-18 training step, batch {batch}x3x{image}x{image}, Adam")
            }
            Model::Mlp => format!(
                "launch-bound proxy: MLP of {MLP_DEPTH} linear layers of width {MLP_WIDTH}, batch {}, SGD",
                arg("--batch", 16)
            ),
            Model::Attention => format!(
                "launch-bound proxy: {ATT_BLOCKS} transformer blocks, width {ATT_WIDTH}, {ATT_HEADS} heads, batch {}x{ATT_TOKENS}, SGD",
                arg("--batch", 2)
            ),
            Model::Resnet50 => {
                let (batch, image) = (arg("--batch", 64), arg("--image", 224));
                format!("ResNet-50 training step, batch {batch}x3x{image}x{image}, SGD")
            }
            Model::Gpt2 => format!(
                "GPT-2 small training step, batch {}x{} tokens, AdamW",
                arg("--batch", 8),
                arg("--tokens", 1024)
            ),
        }
    }
}

/// One pre-norm transformer block: attention then a 4x MLP, each with a residual.
fn attention_block(p: nn::Path) -> impl ModuleT {
    let d = ATT_WIDTH;
    let ln1 = nn::layer_norm(&p / "ln1", vec![d], Default::default());
    let qkv = nn::linear(&p / "qkv", d, 3 * d, Default::default());
    let proj = nn::linear(&p / "proj", d, d, Default::default());
    let ln2 = nn::layer_norm(&p / "ln2", vec![d], Default::default());
    let fc1 = nn::linear(&p / "fc1", d, 4 * d, Default::default());
    let fc2 = nn::linear(&p / "fc2", 4 * d, d, Default::default());
    nn::func_t(move |x, _train| {
        let (b, t) = (x.size()[0], x.size()[1]);
        let hd = d / ATT_HEADS;
        let qkv = x
            .apply(&ln1)
            .apply(&qkv)
            .view([b, t, 3, ATT_HEADS, hd])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let att =
            (q.matmul(&k.transpose(-2, -1)) * (1.0 / (hd as f64).sqrt())).softmax(-1, Kind::Float);
        let y = att
            .matmul(&v)
            .transpose(1, 2)
            .contiguous()
            .view([b, t, d])
            .apply(&proj);
        let x = x + y;
        let h = x.apply(&ln2).apply(&fc1).gelu("none").apply(&fc2);
        x + h
    })
}

/// The step's input and its targets: a batch of random images (or vectors) and class
/// ids, or of token ids and next-token ids.
enum Batch {
    Dense { shape: Vec<i64>, classes: i64 },
    Tokens { batch: i64, tokens: i64, vocab: i64 },
}

impl Batch {
    fn make(&self, dev: Device) -> (Tensor, Tensor) {
        match *self {
            Batch::Dense { ref shape, classes } => (
                Tensor::randn(shape.as_slice(), (Kind::Float, dev)),
                Tensor::randint(classes, [shape[0]], (Kind::Int64, dev)),
            ),
            Batch::Tokens {
                batch,
                tokens,
                vocab,
            } => (
                Tensor::randint(vocab, [batch, tokens], (Kind::Int64, dev)),
                Tensor::randint(vocab, [batch * tokens], (Kind::Int64, dev)),
            ),
        }
    }
}

/// Builds `model` in `vs`, with its batch.
fn build(model: Model, vs: &nn::VarStore) -> (Box<dyn ModuleT>, Batch) {
    let root = vs.root();
    let dense = |shape: Vec<i64>, classes| Batch::Dense { shape, classes };
    match model {
        Model::Resnet18 => {
            let (batch, image) = (arg("--batch", 8) as i64, arg("--image", 64) as i64);
            let net = tch::vision::resnet::resnet18(&root, 10);
            (Box::new(net), dense(vec![batch, 3, image, image], 10))
        }
        Model::Resnet50 => {
            let (batch, image) = (arg("--batch", 64) as i64, arg("--image", 224) as i64);
            let net = tch::vision::resnet::resnet50(&root, 1000);
            (Box::new(net), dense(vec![batch, 3, image, image], 1000))
        }
        Model::Gpt2 => {
            let net = tch_memprof::models::Gpt2::new(&root, tch_memprof::models::Gpt2Config::SMALL);
            let batch = Batch::Tokens {
                batch: arg("--batch", 8) as i64,
                tokens: arg("--tokens", 1024) as i64,
                vocab: 50257,
            };
            (Box::new(net), batch)
        }
        Model::Mlp => {
            let mut seq = nn::seq_t();
            for i in 0..MLP_DEPTH {
                seq = seq
                    .add(nn::linear(
                        &root / format!("l{i}"),
                        MLP_WIDTH,
                        MLP_WIDTH,
                        Default::default(),
                    ))
                    .add_fn(|x| x.relu());
            }
            let batch = arg("--batch", 16) as i64;
            (Box::new(seq), dense(vec![batch, MLP_WIDTH], MLP_WIDTH))
        }
        Model::Attention => {
            let mut seq = nn::seq_t();
            for i in 0..ATT_BLOCKS {
                seq = seq.add(attention_block(&root / format!("block{i}")));
            }
            let head = nn::linear(&root / "head", ATT_WIDTH, ATT_WIDTH, Default::default());
            let seq = seq.add_fn(|x| x.mean_dim(1, false, Kind::Float)).add(head);
            let batch = arg("--batch", 2) as i64;
            (
                Box::new(seq),
                dense(vec![batch, ATT_TOKENS, ATT_WIDTH], ATT_WIDTH),
            )
        }
    }
}

/// Child: trains the model and prints one step time per line, in microseconds.
fn child(mode: Mode, steps: usize, dev: Device) {
    tch::set_num_threads(arg("--threads", 1) as i32);
    let model = model();
    let profiled = !matches!(mode, Mode::Baseline | Mode::Control);
    let vs = nn::VarStore::new(dev);
    let (net, batch) = build(model, &vs);
    let mut opt = match model {
        Model::Resnet18 => nn::Adam::default().build(&vs, 1e-3).unwrap(),
        Model::Gpt2 => nn::AdamW::default().build(&vs, 1e-4).unwrap(),
        Model::Mlp | Model::Attention | Model::Resnet50 => {
            nn::Sgd::default().build(&vs, 1e-3).unwrap()
        }
    };
    // The CSV mode's files, in a folder of the child's own, removed when it ends.
    let csv_dir = std::env::temp_dir().join(format!("tch-memprof-overhead-{}", std::process::id()));
    let mut profiler = profiled.then(|| {
        tch_memprof::MemoryProfiler::builder(&vs)
            .print(false)
            .csv(mode == Mode::Csv)
            .csv_dir(&csv_dir)
            .timeline(mode == Mode::Timeline)
            .leak_check(mode != Mode::Core)
            .build()
            .expect("profiler")
    });
    let lockstep = std::env::args().any(|a| a == "--lockstep");
    let mut step = || {
        let t0 = Instant::now();
        let (x, y) = batch.make(dev);
        let loss = net.forward_t(&x, true).cross_entropy_for_logits(&y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        // record_stats on its own, in nanoseconds (0 without a profiler).
        let mut record = 0;
        if let Some(p) = profiler.as_mut() {
            let t = Instant::now();
            p.record_stats();
            record = t.elapsed().as_nanos();
        }
        if let Device::Cuda(i) = dev {
            tch::Cuda::synchronize(i as i64);
        }
        (t0.elapsed().as_micros(), record)
    };
    for _ in 0..WARMUP {
        step();
    }
    let mut out = std::io::stdout().lock();
    if lockstep {
        // One step for each line on stdin, until it closes.
        writeln!(out, "ready").unwrap();
        out.flush().unwrap();
        // A line of N: N steps, the last one's times answered (the others warm the
        // caches, as the step before does in a training loop).
        for line in std::io::stdin().lines() {
            let turn: usize = line.unwrap().trim().parse().unwrap_or(1).max(1);
            let mut timed = step();
            for _ in 1..turn {
                timed = step();
            }
            let (us, record) = timed;
            writeln!(out, "{us} {record}").unwrap();
            out.flush().unwrap();
        }
    } else if std::env::args().any(|a| a == "--count") {
        // One step, counted: its allocations here, its ops from its step profile.
        let before = tch_memprof::__private::cpu_allocations();
        step();
        let allocs = tch_memprof::__private::cpu_allocations() - before;
        let ops = profiler
            .as_ref()
            .and_then(|p| p.peak_step_profile())
            .map_or(0, |sp| sp.rows.len());
        writeln!(out, "count {ops} {allocs}").unwrap();
    } else {
        for _ in 0..steps {
            let (us, record) = step();
            writeln!(out, "{us} {record}").unwrap();
        }
    }
    if let Some(p) = profiler {
        assert_eq!(p.failures(), 0);
    }
    let _ = std::fs::remove_dir_all(&csv_dir);
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
    let steps = arg("--steps", 10);
    let dev = device();
    if let Ok(name) = std::env::var(MODE) {
        let mode = MODES
            .into_iter()
            .find(|m| m.name() == name)
            .unwrap_or(Mode::Baseline);
        child(mode, steps, dev);
        return;
    }
    let rounds = arg("--rounds", 30);
    let turn = arg("--turn", 2);
    if turn == 0 {
        eprintln!("overhead: --turn 0: a turn is at least the one step it times");
        std::process::exit(2);
    }
    let exe = std::env::current_exe().unwrap();
    // Step times in ms, per mode and round; each step's ratio to the baseline step of
    // its cycle, per mode.
    let mut times: Vec<Vec<Vec<f64>>> = vec![Vec::new(); MODES.len()];
    let mut paired: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    // Each mode's record_stats calls, in microseconds.
    let mut records: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        for t in times.iter_mut() {
            t.push(Vec::new());
        }
        // Fresh children every round: where a process's memory falls moves its step
        // time by a percent or two, for the whole process.
        // Spawned in an order that rotates every round too: the slot a child starts in
        // (what the others are doing while it loads and warms up) is no mode's alone.
        let mut slots: Vec<Option<Child>> = (0..MODES.len()).map(|_| None).collect();
        for k in 0..MODES.len() {
            let m = (k + round) % MODES.len();
            slots[m] = Some(spawn(&exe, MODES[m], dev));
        }
        let mut children: Vec<Child> = slots.into_iter().map(Option::unwrap).collect();
        let mut pipes: Vec<(ChildStdin, BufReader<ChildStdout>)> = children
            .iter_mut()
            .map(|c| {
                let stdin = c.stdin.take().unwrap();
                (stdin, BufReader::new(c.stdout.take().unwrap()))
            })
            .collect();
        // Every child has built its model and run its warm-up steps.
        for (m, (_, out)) in pipes.iter_mut().enumerate() {
            let line = read_line(out, MODES[m], &mut children[m]);
            assert_eq!(line, "ready", "{}: {line}", MODES[m].name());
        }
        for s in 0..steps {
            // Rotate: no mode always runs first, or always after the same one.
            let mut step_ms = [0.0; MODES.len()];
            for k in 0..MODES.len() {
                let m = (k + s + round) % MODES.len();
                let (stdin, stdout) = &mut pipes[m];
                writeln!(stdin, "{turn}").unwrap();
                stdin.flush().unwrap();
                let line = read_line(stdout, MODES[m], &mut children[m]);
                let (us, record) = line
                    .split_once(' ')
                    .and_then(|(a, b)| Some((a.parse::<f64>().ok()?, b.parse::<f64>().ok()?)))
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: not a step time and record_stats time: {line}",
                            MODES[m].name()
                        )
                    });
                step_ms[m] = us / 1000.0;
                records[m].push(record / 1000.0);
            }
            for m in 0..MODES.len() {
                times[m].last_mut().unwrap().push(step_ms[m]);
                paired[m].push(step_ms[m] / step_ms[0]);
            }
        }
        drop(pipes);
        for (m, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output().expect("wait for child");
            assert!(out.status.success(), "the {} child failed", MODES[m].name());
        }
        let meds: Vec<String> = MODES
            .iter()
            .enumerate()
            .map(|(m, mode)| {
                let med = median(&mut times[m].last().unwrap().clone());
                format!("{} {med:.2}", mode.name())
            })
            .collect();
        eprintln!("round {}: median ms {}", round + 1, meds.join(", "));
    }
    let medians: Vec<f64> = times.iter().map(|r| median(&mut r.concat())).collect();
    let fastest: Vec<f64> = times
        .iter()
        .map(|r| {
            r.iter()
                .map(|t| median(&mut t.clone()))
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let on = match dev {
        Device::Cuda(_) => "CUDA",
        _ => "CPU",
    };
    println!(
        "{on} {}, {rounds} rounds x {steps} steps per mode, interleaved {}",
        model().describe(),
        if turn == 1 {
            "step by step (cold caches)".to_string()
        } else {
            format!("in turns of {turn} steps, the last one timed")
        }
    );
    println!("  {:<48} {:>10} {:>10}", "mode", "median ms", "fastest ms");
    for ((mode, m), f) in MODES.iter().zip(&medians).zip(&fastest) {
        println!("  {:<48} {m:>10.2} {f:>10.2}", mode.describe());
    }
    println!(
        "  {:<48} {:>10} {:>10} {:>10}",
        "ratio to the baseline", "median", "fastest", "paired"
    );
    for (m, mode) in MODES.iter().enumerate().skip(1) {
        println!(
            "  {:<48} {:>10.4} {:>10.4} {:>10.4}",
            mode.describe(),
            medians[m] / medians[0],
            fastest[m] / fastest[0],
            median(&mut paired[m].clone())
        );
    }
    // What the step is made of, from one profiled step of a child of its own: the
    // extra time of each mode per op and per allocation (of the paired ratio, times the
    // baseline's median step).
    let (ops, allocs) = count_step(&exe, dev);
    println!(
        "  a step: {ops} ops (the step timeline's: outermost ops and autograd nodes), {allocs} allocations"
    );
    println!(
        "  {:<48} {:>10} {:>10} {:>10} {:>16}",
        "extra a step", "us", "ns an op", "ns an alloc", "record_stats us"
    );
    for (m, mode) in MODES.iter().enumerate().skip(1) {
        let extra_us = (median(&mut paired[m].clone()) - 1.0) * medians[0] * 1000.0;
        let per = |n: u64| {
            if n == 0 {
                "-".to_string()
            } else {
                format!("{:.0}", extra_us * 1000.0 / n as f64)
            }
        };
        // The part of it that is record_stats on its own (median of its calls).
        let record = if records[m].iter().any(|&r| r > 0.0) {
            format!("{:.1}", median(&mut records[m].clone()))
        } else {
            "-".to_string()
        };
        println!(
            "  {:<48} {:>10.1} {:>10} {:>10} {:>16}",
            mode.describe(),
            extra_us,
            per(ops),
            per(allocs),
            record
        );
    }
}

/// Ops and CPU allocations of one step of the model: a timeline child of its own, run
/// to one step after its warm-up (`--count`), prints them.
fn count_step(exe: &Path, dev: Device) -> (u64, u64) {
    let mut cmd = Command::new(exe);
    cmd.args(["--count", "--steps", "1"]);
    child_args(&mut cmd, dev);
    cmd.env(MODE, Mode::Timeline.name());
    let out = cmd.output().expect("run the counting child");
    assert!(out.status.success(), "the counting child failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("count "))
        .expect("the counting child's count line");
    let mut it = line.split(' ').map(|v| v.parse::<u64>().expect("a count"));
    (it.next().unwrap(), it.next().unwrap())
}

/// The bench's own arguments a child runs with: threads, model, its sizes, the device.
fn child_args(cmd: &mut Command, dev: Device) {
    cmd.args(["--threads", &arg("--threads", 1).to_string()]);
    for name in ["--batch", "--image", "--tokens", "--model"] {
        if let Some(v) = arg_str(name) {
            cmd.args([name, &v]);
        }
    }
    if let Device::Cuda(_) = dev {
        cmd.args(["--device", "cuda"]);
    }
}

/// One child of `mode`, in lockstep: it runs a step for each line on its stdin.
fn spawn(exe: &Path, mode: Mode, dev: Device) -> Child {
    let mut cmd = Command::new(exe);
    cmd.arg("--lockstep");
    child_args(&mut cmd, dev);
    cmd.env(MODE, mode.name());
    for (k, v) in MALLOC_PINNED {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
    if matches!(mode, Mode::Baseline | Mode::Control) {
        cmd.env("TCH_MEMPROF_DISABLE", "1");
    }
    // stderr is the terminal's: a child's error shows as it happens.
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    cmd.spawn().expect("run child")
}

/// The child's next line; a child that ended instead fails the bench (its stderr is
/// above).
fn read_line(out: &mut BufReader<ChildStdout>, mode: Mode, child: &mut Child) -> String {
    let mut line = String::new();
    if out.read_line(&mut line).unwrap_or(0) == 0 {
        panic!("the {} child ended: {}", mode.name(), child.wait().unwrap());
    }
    line.trim().to_string()
}
