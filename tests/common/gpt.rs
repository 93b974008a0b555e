//! A small GPT-style decoder written in tch with plain ops (embeddings, linear layers,
//! layer norm, GELU, causal attention written out with matmul and a masked softmax,
//! cross-entropy), run for real on the CPU under the profiler's step timeline and
//! dry-run on the meta device, and the op-by-op comparison of the two runs' live bytes.
//! Shared by `tests/dry_run_vs_cpu.rs` (the dry run against the CPU run) and
//! `tests/plan_levers.rs` (the plan's levers against the CPU run). Included with
//! `#[path = "common/gpt.rs"] mod gpt;` next to `mod common;`.
#![allow(dead_code)]

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};
use tch_memprof::estimate::trace::{dry_run_step, dry_run_trace, DryRunTrace, Lists, TraceOp};
use tch_memprof::estimate::{Input, Mode, Model, Optimizer, Options};
use tch_memprof::models::Chain;
use tch_memprof::{Category, Checkpointed, MemoryProfiler, StepProfile, StepRow};

pub const VOCAB: i64 = 97;
pub const CONTEXT: i64 = 16;
pub const DIM: i64 = 32;
pub const HEADS: i64 = 4;
pub const LAYERS: i64 = 2;

/// Training steps of both runs; the last one is the one compared (it runs with the
/// optimizer's state there, as the estimate's second step).
pub const STEPS: u32 = 2;

/// A layer norm: libtorch's (`nn::layer_norm`), or written out as a textbook writes it
/// (`(x - mean) / sqrt(var + eps) * weight + bias`, with `x.var(-1)`: `aten::var`).
#[derive(Debug)]
enum Norm {
    Lib(nn::LayerNorm),
    Hand { weight: Tensor, bias: Tensor },
}

impl Norm {
    fn new(p: nn::Path, hand: bool) -> Norm {
        if hand {
            Norm::Hand {
                weight: p.var("weight", &[DIM], nn::Init::Const(1.)),
                bias: p.var("bias", &[DIM], nn::Init::Const(0.)),
            }
        } else {
            Norm::Lib(nn::layer_norm(p, vec![DIM], Default::default()))
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            Norm::Lib(n) => n.forward(x),
            Norm::Hand { weight, bias } => {
                let mean = x.mean_dim(&[-1i64][..], true, None::<Kind>);
                let var = x.var_dim(&[-1i64][..], false, true);
                (x - mean) / (var + 1e-5).sqrt() * weight + bias
            }
        }
    }
}

/// Whether [`Gpt::new`] writes its layer norms out by hand (`Run::hand_norm`; set by
/// each run before it builds the model: the model may be built on the dry run's thread).
static HAND_NORM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn hand_norm() -> bool {
    HAND_NORM.load(std::sync::atomic::Ordering::SeqCst)
}

fn set_hand_norm(run: &Run) {
    HAND_NORM.store(run.hand_norm, std::sync::atomic::Ordering::SeqCst);
}

#[derive(Debug)]
struct Block {
    ln1: Norm,
    qkv: nn::Linear,
    proj: nn::Linear,
    ln2: Norm,
    fc: nn::Linear,
    out: nn::Linear,
}

impl Block {
    fn new(p: &nn::Path) -> Block {
        let c = nn::LinearConfig::default();
        let hand = hand_norm();
        Block {
            ln1: Norm::new(p / "ln1", hand),
            qkv: nn::linear(p / "qkv", DIM, 3 * DIM, c),
            proj: nn::linear(p / "proj", DIM, DIM, c),
            ln2: Norm::new(p / "ln2", hand),
            fc: nn::linear(p / "fc", DIM, 4 * DIM, c),
            out: nn::linear(p / "out", 4 * DIM, DIM, c),
        }
    }

    fn attention(&self, x: &Tensor) -> Tensor {
        let (b, t, _) = x.size3().unwrap();
        let hd = DIM / HEADS;
        let qkv = self
            .qkv
            .forward(x)
            .view([b, t, 3, HEADS, hd])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let scores = q.matmul(&k.transpose(-2, -1)) * (1.0 / (hd as f64).sqrt());
        // True above the diagonal: the future tokens each position must not see.
        let future = Tensor::ones([t, t], (Kind::Bool, x.device())).triu(1);
        let scores = scores.masked_fill(&future, f64::NEG_INFINITY);
        let probs = scores.softmax(-1, None::<Kind>);
        let y = probs
            .matmul(&v)
            .transpose(1, 2)
            .contiguous()
            .view([b, t, DIM]);
        self.proj.forward(&y)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let x = x + self.attention(&self.ln1.forward(x));
        let h = self.fc.forward(&self.ln2.forward(&x)).gelu("none");
        &x + self.out.forward(&h)
    }
}

#[derive(Debug)]
pub struct Gpt {
    wte: nn::Embedding,
    wpe: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: nn::Linear,
}

impl Gpt {
    pub fn new(p: &nn::Path) -> Gpt {
        Gpt {
            wte: nn::embedding(p / "wte", VOCAB, DIM, Default::default()),
            wpe: nn::embedding(p / "wpe", CONTEXT, DIM, Default::default()),
            blocks: (0..LAYERS).map(|i| Block::new(&(p / "h" / i))).collect(),
            ln_f: Norm::new(p / "ln_f", hand_norm()),
            head: nn::linear(
                p / "head",
                DIM,
                VOCAB,
                nn::LinearConfig {
                    bias: false,
                    ..Default::default()
                },
            ),
        }
    }
}

impl Module for Gpt {
    /// Token ids `[batch, tokens]` to logits `[batch * tokens, vocab]`.
    fn forward(&self, idx: &Tensor) -> Tensor {
        let (b, t) = idx.size2().unwrap();
        let pos = Tensor::arange(t, (Kind::Int64, idx.device()));
        let mut x = self.wte.forward(idx) + self.wpe.forward(&pos);
        for block in &self.blocks {
            x = block.forward(&x);
        }
        self.head
            .forward(&self.ln_f.forward(&x))
            .view([b * t, VOCAB])
    }
}

/// The decoder as a chain of segments, for checkpointing: the embeddings, each block,
/// the head (the same ops as `forward`).
impl Chain for Gpt {
    fn segments(&self) -> usize {
        self.blocks.len() + 2
    }

    fn segment(&self, i: usize, x: &Tensor, _train: bool) -> Tensor {
        if i == 0 {
            let (_, t) = x.size2().unwrap();
            let pos = Tensor::arange(t, (Kind::Int64, x.device()));
            self.wte.forward(x) + self.wpe.forward(&pos)
        } else if i <= self.blocks.len() {
            self.blocks[i - 1].forward(x)
        } else {
            let (b, t, _) = x.size3().unwrap();
            self.head
                .forward(&self.ln_f.forward(x))
                .view([b * t, VOCAB])
        }
    }
}

/// `gpt`'s chain under `Checkpointed` (no generator state saved, as the dry run), every
/// `every`-th segment checkpointed and the others kept, as `Options::checkpoint` runs
/// it.
pub fn checkpointed<'a>(vs: &nn::VarStore, gpt: &'a Gpt, every: u32) -> Checkpointed<'a> {
    (0..gpt.segments()).fold(Checkpointed::new(vs).preserve_rng(false), |c, i| {
        let f = move |x: &Tensor, train: bool| gpt.segment(i, x, train);
        if i % every as usize == 0 {
            c.segment(f)
        } else {
            c.segment_kept(f)
        }
    })
}

/// Parameters of the decoder by hand.
pub fn params() -> u64 {
    let d = DIM as u64;
    let block =
        2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
    VOCAB as u64 * d + CONTEXT as u64 * d + LAYERS as u64 * block + 2 * d + d * VOCAB as u64
}

/// One configuration of the step, run for real and dry-run alike.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Inference, or training with an optimizer.
    pub mode: Mode,
    /// The (micro-)batch: sequences of `CONTEXT` tokens per forward pass.
    pub batch: i64,
    /// Micro-batches per optimizer step (gradient accumulation; 1: none).
    pub accumulate: u32,
    /// CPU autocast's dtype over forward and loss, or none.
    pub autocast: Option<Kind>,
    /// Activation checkpointing of every k-th segment (`Checkpointed`), or none.
    pub checkpoint: Option<u32>,
    /// Gradients set to none before the forward pass instead of before backward.
    pub zero_grad_first: bool,
    /// The real loop drops its output right after its last read (the loss's
    /// `log_softmax`) instead of holding it through the optimizer step (the dry run
    /// always holds it).
    pub drop_output: bool,
    /// The layer norms written out by hand (`x.var(-1)`) instead of libtorch's.
    pub hand_norm: bool,
}

impl Run {
    /// Training with `optimizer`, no accumulation, no autocast.
    pub fn train(optimizer: Optimizer, batch: i64) -> Run {
        Run {
            mode: Mode::Train(optimizer),
            batch,
            accumulate: 1,
            autocast: None,
            checkpoint: None,
            zero_grad_first: false,
            drop_output: false,
            hand_norm: false,
        }
    }

    /// Inference at `batch`, no autocast.
    pub fn inference(batch: i64) -> Run {
        Run {
            mode: Mode::Inference,
            batch,
            accumulate: 1,
            autocast: None,
            checkpoint: None,
            zero_grad_first: false,
            drop_output: false,
            hand_norm: false,
        }
    }

    /// The profiled step: the last optimizer step (1 for inference).
    fn step(&self) -> u32 {
        match self.mode {
            Mode::Inference => 1,
            Mode::Train(_) | Mode::Steps => STEPS,
        }
    }

    /// The dry trace's step (1-based) of the profiled step: the trace counts optimizer
    /// steps, micro-batches together.
    fn trace_steps(&self) -> std::ops::RangeInclusive<u32> {
        let s = self.step();
        s..=s
    }
}

/// `f` under CPU autocast in `dtype`, or plainly.
pub fn maybe_autocast<T>(dtype: Option<Kind>, f: impl FnOnce() -> T) -> T {
    match dtype {
        Some(k) => tch_memprof::autocast(Device::Cpu, k, f).unwrap(),
        None => f(),
    }
}

/// The real CPU run: `STEPS` training steps (or one inference), the last one profiled
/// with the step timeline.
///
/// The loop is the loop the dry run models (`Model::dry_run`): per micro-batch the batch
/// made, forward and loss (the targets made inside the loss; under autocast when it is
/// on), `zero_grad` before the first micro-batch's backward only, `backward`; then
/// `step`. Without accumulation the batch, output and loss live through the optimizer
/// step and are dropped after it; with accumulation each micro-batch's are dropped right
/// after its backward (the dry run keeps nothing of a micro-batch across micro-batches
/// but the gradients).
pub fn cpu_run(run: &Run) -> StepProfile {
    set_hand_norm(run);
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let gpt = Gpt::new(&vs.root());
    let steps = run.step();
    let mut prof = MemoryProfiler::builder(&vs)
        .print(false)
        .timeline_step(steps as u64)
        .build()
        .unwrap();
    let tokens = || Tensor::randint(VOCAB, [run.batch, CONTEXT], (Kind::Int64, Device::Cpu));
    match run.mode {
        Mode::Train(o) => {
            let mut opt = o.build(&vs).unwrap();
            let k = run.accumulate.max(1);
            for _ in 0..steps {
                let mut held = None;
                for micro in 0..k {
                    let xs = tokens();
                    if let Some(every) = run.checkpoint {
                        // The loop `Checkpointed` takes: gradients to none first, then
                        // forward and backward in one call.
                        let mut c = checkpointed(&vs, &gpt, every);
                        if let Some(dtype) = run.autocast {
                            c = c.mixed_precision(dtype);
                        }
                        if micro == 0 {
                            opt.zero_grad();
                        }
                        let loss = c
                            .forward_backward(&xs, |out| {
                                let target = Tensor::randint(
                                    VOCAB,
                                    [run.batch * CONTEXT],
                                    (Kind::Int64, Device::Cpu),
                                );
                                out.cross_entropy_for_logits(&target)
                            })
                            .unwrap();
                        if k == 1 {
                            held = Some((loss, Tensor::new(), xs));
                        }
                        continue;
                    }
                    if run.zero_grad_first && micro == 0 {
                        opt.zero_grad();
                    }
                    let (loss, out) = maybe_autocast(run.autocast, || {
                        let out = gpt.forward(&xs);
                        if run.drop_output {
                            // cross_entropy_for_logits written out, the output dropped
                            // right after its last read.
                            let target = Tensor::randint(
                                VOCAB,
                                [run.batch * CONTEXT],
                                (Kind::Int64, Device::Cpu),
                            );
                            let logp = out.log_softmax(-1, Kind::Float);
                            drop(out);
                            return (logp.nll_loss(&target), Tensor::new());
                        }
                        let loss = {
                            let target = Tensor::randint(
                                VOCAB,
                                [run.batch * CONTEXT],
                                (Kind::Int64, Device::Cpu),
                            );
                            out.cross_entropy_for_logits(&target)
                        };
                        (loss, out)
                    });
                    if !run.zero_grad_first && micro == 0 {
                        opt.zero_grad();
                    }
                    loss.backward();
                    if k == 1 {
                        held = Some((loss, out, xs));
                    } else {
                        drop(loss);
                        drop(out);
                        drop(xs);
                    }
                }
                opt.step();
                drop(held);
                prof.record_stats();
            }
        }
        Mode::Steps => unreachable!("the shared decoder's runs use the built-in loop"),
        Mode::Inference => {
            let xs = tokens();
            let y = tch::no_grad(|| maybe_autocast(run.autocast, || gpt.forward(&xs)));
            drop(y);
            drop(xs);
            prof.record_stats();
        }
    }
    assert_eq!(prof.failures(), 0);
    prof.step_profile().expect("the step was profiled").clone()
}

/// The dry run of `run`, with CPU autocast's op lists (the real run's).
/// The dry run's profiled step (`Run::step`), replayed as the estimate replays its
/// predicted step, in the bytes a CPU run holds.
pub fn dry_run_profile(run: &Run) -> StepProfile {
    set_hand_norm(run);
    let model = match run.checkpoint {
        Some(_) => Model::build_chain_on_meta(Gpt::new).unwrap(),
        None => Model::build_on_meta(Gpt::new).unwrap(),
    };
    let options = Options {
        autocast: run.autocast,
        accumulate: run.accumulate,
        checkpoint: run.checkpoint,
        zero_grad_first: run.zero_grad_first,
        steps: STEPS,
        ..Options::default()
    };
    let input = Input::new(&[run.batch, CONTEXT], Kind::Int64);
    dry_run_step(&model, &[input], run.mode, &options, Lists::Cpu, run.step()).unwrap()
}

/// The predicted step against the measured one, op by op and category by category: the
/// same ops (the CPU's `randint` batch and targets, the dry run's `empty` meta ones left
/// out), each category's bytes the same after every op, the same peak and its split.
pub fn compare_categories(run: &Run) {
    let _serial = crate::common::serial();
    let dry = dry_run_profile(run);
    let cpu = cpu_run(run);
    let cpu_rows: Vec<&StepRow> = cpu
        .rows
        .iter()
        .filter(|r| r.op != "aten::randint")
        .collect();
    let dry_rows: Vec<&StepRow> = dry.rows.iter().filter(|r| r.op != "aten::empty").collect();
    assert_same_rows(&cpu_rows, &dry_rows, false);
    assert_eq!(cpu.peak.bytes, dry.peak.bytes);
    assert_eq!(cpu.peak.breakdown, dry.peak.breakdown);
    eprintln!(
        "{run:?}: {} ops, peak {} B, by category the same op by op",
        cpu_rows.len(),
        cpu.peak.bytes
    );
}

/// Two steps' rows, op by op: the same op, each category's bytes the same after it (and,
/// with `phases`, the same phase); on a difference, both runs side by side.
pub fn assert_same_rows(cpu_rows: &[&StepRow], dry_rows: &[&StepRow], phases: bool) {
    let line = |r: &StepRow| {
        let cats: Vec<String> = Category::ALL
            .iter()
            .map(|c| format!("{} {}", c.label(), r.bytes.get(*c)))
            .collect();
        format!("{} {} [{}]", r.op, r.phase.name(), cats.join(", "))
    };
    let table = || {
        cpu_rows
            .iter()
            .zip(dry_rows)
            .enumerate()
            .map(|(i, (c, d))| format!("{i:4} | {}\n     | {}", line(c), line(d)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(cpu_rows.len(), dry_rows.len(), "{}", table());
    for (i, (c, d)) in cpu_rows.iter().zip(dry_rows).enumerate() {
        assert_eq!(c.op, d.op, "op {i}\n{}", table());
        if phases {
            assert_eq!(c.phase, d.phase, "op {i} {}\n{}", c.op, table());
        }
        for cat in Category::ALL {
            assert_eq!(
                c.bytes.get(cat),
                d.bytes.get(cat),
                "op {i} {}: {}\n{}",
                c.op,
                cat.label(),
                table()
            );
        }
    }
}

pub fn dry_run(run: &Run) -> DryRunTrace {
    set_hand_norm(run);
    let model = match run.checkpoint {
        Some(_) => Model::build_chain_on_meta(Gpt::new).unwrap(),
        None => Model::build_on_meta(Gpt::new).unwrap(),
    };
    let options = Options {
        autocast: run.autocast,
        accumulate: run.accumulate,
        checkpoint: run.checkpoint,
        zero_grad_first: run.zero_grad_first,
        steps: STEPS,
        ..Options::default()
    };
    let input = Input::new(&[run.batch, CONTEXT], Kind::Int64);
    dry_run_trace(&model, &[input], run.mode, &options, Lists::Cpu).unwrap()
}

/// The ops of the profiled step in both runs, side by side, for the failure messages.
fn side_by_side(cpu: &StepProfile, dry: &[&TraceOp]) -> String {
    let n = cpu.rows.len().max(dry.len());
    (0..n)
        .map(|i| {
            let c = cpu.rows.get(i).map_or(String::from("-"), |r| {
                format!("{} {} {}", r.op, r.phase.name(), r.allocated_bytes)
            });
            let d = dry.get(i).map_or(String::from("-"), |o| {
                format!("{} {} {}", o.op, o.phase.name(), o.live_bytes)
            });
            format!("{i:4} | {c:<50} | {d}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The two runs' peaks of the profiled step.
#[derive(Clone, Debug)]
pub struct Compared {
    /// The profiler's peak allocated bytes of the CPU step (weights included).
    pub cpu: u64,
    /// The op the CPU's peak was reached in.
    pub cpu_op: String,
    /// The dry run's live-byte peak of the same step (weights included; no caching
    /// allocator).
    pub dry: u64,
    /// The highest live bytes the CPU had when an op returned, over the step.
    pub cpu_op_ends: u64,
}

/// The dry run against the CPU run of `run`, op by op: every op of the profiled step the
/// same in both, with the same live bytes when it returned (`arange`'s output included:
/// on meta it is sized by a resize, which the trace adopts at the op's end); the peaks of
/// the step in both runs.
pub fn compare(run: &Run) -> Compared {
    let _serial = crate::common::serial();
    let dry = dry_run(run);
    assert_eq!(dry.weights_bytes, 4 * params());
    let cpu = cpu_run(run);
    let steps = run.trace_steps();
    let dry_ops: Vec<&TraceOp> = dry.ops.iter().filter(|o| steps.contains(&o.step)).collect();
    let table = side_by_side(&cpu, &dry_ops);
    // The batch and the targets: `randint` on the CPU, `empty` in the dry run (a meta
    // tensor of the input's shape; the step's batch and targets, and a 0-byte `empty` on
    // the CPU that gives the targets' dtype).
    let cpu_rows: Vec<_> = cpu
        .rows
        .iter()
        .filter(|r| r.op != "aten::randint")
        .collect();
    let dry_rows: Vec<_> = dry_ops
        .into_iter()
        .filter(|o| o.op != "aten::empty")
        .collect();
    // After its loop the dry run sets the gradients to none (`zero_grad`): that is in
    // no step, as the CPU loop's own end is in no profiled step.
    assert_eq!(cpu_rows.len(), dry_rows.len(), "{table}");
    for (i, (c, d)) in cpu_rows.iter().zip(&dry_rows).enumerate() {
        // Ops by name only: the phases are drawn differently (the dry run marks backward
        // before `zero_grad`, the profiler when the first autograd node runs).
        assert_eq!(c.op, d.op, "op {i}\n{table}");
        assert_eq!(c.allocated_bytes, d.live_bytes, "op {i} {}\n{table}", c.op);
    }
    let dry_peak = steps.map(|s| dry.step_peaks[s as usize - 1]).max().unwrap();
    let compared = Compared {
        cpu: cpu.peak.bytes,
        cpu_op: cpu.peak.op.clone(),
        dry: dry_peak,
        cpu_op_ends: cpu.rows.iter().map(|r| r.allocated_bytes).max().unwrap(),
    };
    eprintln!(
        "{run:?}: CPU peak {} B in {} (highest at an op's end {} B); dry run {} B",
        compared.cpu, compared.cpu_op, compared.cpu_op_ends, compared.dry
    );
    compared
}
