//! A TorchScript file estimated as tch runs it: through the graph executor's optimized
//! graph (the default), or as written (`--no-jit-optimize`, a program that calls
//! `tch::jit::set_graph_executor_optimize(false)`).
//!
//! PyTorch traces `Linear(512, 512) -> GELU -> Dropout(p) -> Linear(512, 512)` in
//! training mode and reports what its own executor's optimized graph holds after two
//! training calls: a `native_dropout` inside an autodiff subgraph. As written, a dropout
//! at p=0 returns its input and keeps nothing; `native_dropout` makes a new output and a
//! bool mask, and the next linear layer keeps that output for backward where as written
//! it kept the GELU's, which is freed instead: at the end of the forward pass, where the
//! step peaks, the optimized graph holds one mask more, one byte per element of the
//! dropout's input (by hand: 64 x 512 bytes at batch 64).
//!
//! Under autocast the optimized graph also gets the JIT's own autocast pass, whose casts
//! (`_autocast_to_reduced_precision`, `_autocast_to_full_precision`) are ops of the graph:
//! the dry run makes the casts PyTorch's executor makes on the CPU under CPU autocast, the
//! same number of the same sizes.

mod common;

use std::path::Path;
use std::process::Command;

use tch::Kind;
use tch_memprof::estimate::trace::{dry_run_trace, Lists};
use tch_memprof::estimate::{Input, Mode, Model, Optimizer, Options};

const BATCH: i64 = 64;
const WIDTH: i64 = 512;

/// Traces the model into `dir/model.pt` with dropout `p`, and returns how many
/// `native_dropout` nodes the optimized graph PyTorch's executor ran on the third
/// training call has (autodiff subgraphs included); None where no Python can run.
fn trace(dir: &Path, p: f64) -> Option<usize> {
    let Some(python) = common::torch_python() else {
        common::cannot_run(
            "tracing with PyTorch: no Python with torch beside LIBTORCH (run through \
             scripts/with-libtorch.sh)",
        );
        return None;
    };
    let script = format!(
        r#"
import sys, torch
class M(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.l1 = torch.nn.Linear({WIDTH}, {WIDTH}); s.d = torch.nn.Dropout({p}); s.l2 = torch.nn.Linear({WIDTH}, {WIDTH})
    def forward(s, x):
        return s.l2(s.d(torch.nn.functional.gelu(s.l1(x))))
torch.manual_seed(0)
torch.jit.trace(M().train(), torch.randn({BATCH}, {WIDTH}), check_trace=False).save(sys.argv[1])
m = torch.jit.load(sys.argv[1]); m.train()
for _ in range(3):
    out = m(torch.randn({BATCH}, {WIDTH}))
    graph = torch.jit.last_executed_optimized_graph()
    out.sum().backward()
n = 0
def walk(block):
    global n
    for node in block.nodes():
        n += node.kind() == "aten::native_dropout"
        for b in node.blocks():
            walk(b)
        if node.hasAttribute("Subgraph"):
            walk(node.g("Subgraph"))
walk(graph)
print(n)
"#
    );
    let file = dir.join("model.pt");
    let out = Command::new(python)
        .args(["-c", &script, file.to_str().unwrap()])
        .output()
        .expect("runs python");
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    Some(common::text(&out.stdout).trim().parse().unwrap())
}

/// Peak allocated of a training step (SGD) of `file` at batch 64, with `extra` flags.
fn peak(file: &Path, extra: &[&str]) -> u64 {
    let input = format!("{BATCH}x{WIDTH}");
    let mut args = vec![
        "estimate",
        file.to_str().unwrap(),
        "--input",
        &input,
        "--train",
        "--optimizer",
        "sgd",
        "--csv",
    ];
    args.extend(extra);
    let out = common::cli(&args);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let text = common::text(&out.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = header
        .iter()
        .position(|h| *h == "peak_allocated_bytes")
        .unwrap();
    row[col].parse().unwrap()
}

#[test]
fn a_dropout_at_p0_keeps_its_mask_in_the_optimized_graph_and_nothing_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let Some(native_dropouts) = trace(dir.path(), 0.0) else {
        return;
    };
    // PyTorch's own executor: the dropout runs as native_dropout.
    assert_eq!(native_dropouts, 1);
    let file = dir.path().join("model.pt");
    let optimized = peak(&file, &[]);
    let as_written = peak(&file, &["--no-jit-optimize"]);
    assert_eq!(
        optimized - as_written,
        (BATCH * WIDTH) as u64,
        "optimized {optimized} B, as written {as_written} B"
    );
}

#[test]
fn an_optimized_graph_that_needs_a_constants_value_is_estimated_as_written_and_says_so() {
    // A scale computed from a constant vector: the trace bakes the vector in as a
    // constant (on the meta device in the dry run, with the weights), constant
    // propagation folds its sum into a scalar, and the optimized graph reads that
    // scalar's value (CanonicalizeOps: `mul(x, <0-dim constant>)` becomes
    // `mul(x, <its item()>)`), which a meta tensor does not have.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scaled.pt");
    let script = scaled_model("torch.tensor([16.0, 0.0], dtype=h.dtype).sum()");
    if !run_python(&script, &[&file]) {
        return;
    }
    let run = |extra: &[&str]| estimate_scaled(&file, extra);
    let (optimized, warning) = run(&[]);
    let (as_written, quiet) = run(&["--no-jit-optimize"]);
    assert_eq!(optimized, as_written);
    assert!(quiet.is_empty(), "{quiet}");
    let lines: Vec<&str> = warning.lines().collect();
    assert_eq!(lines.len(), 1, "{warning}");
    assert!(
        lines[0].starts_with("warning: at batch 4: the TorchScript executor's optimized graph")
            && lines[0].contains("(aten::_local_scalar_dense needs a tensor's value")
            && lines[0].contains("estimated as written"),
        "{warning}"
    );
}

/// The bytes each cast of the JIT's autocast pass allocates in the second training call
/// of `file` (the first through the optimized graph) under CPU bf16 autocast, as
/// PyTorch's own profiler records them on the CPU, sorted; None where no Python can run.
fn pytorch_jit_casts(file: &Path) -> Option<Vec<u64>> {
    let python = common::torch_python()?;
    let script = format!(
        r#"
import sys, torch
from torch.profiler import profile, ProfilerActivity
m = torch.jit.load(sys.argv[1]); m.train()
casts = ("aten::_autocast_to_reduced_precision", "aten::_autocast_to_full_precision")
for call in range(2):
    x = torch.randn({BATCH}, {WIDTH})
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
    out.float().sum().backward()
sizes = sorted(e.cpu_memory_usage for e in prof.events()
               if e.name in casts and e.cpu_memory_usage > 0
               and not (e.cpu_parent and e.cpu_parent.name in casts))
print(" ".join(map(str, sizes)))
"#
    );
    let out = Command::new(python)
        .args(["-c", &script, file.to_str().unwrap()])
        .output()
        .expect("runs python");
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    Some(
        common::text(&out.stdout)
            .split_whitespace()
            .map(|s| s.parse().unwrap())
            .collect(),
    )
}

#[test]
fn under_autocast_the_dry_run_makes_the_casts_of_the_jits_autocast_pass_as_pytorch_does() {
    let dir = tempfile::tempdir().unwrap();
    if trace(dir.path(), 0.0).is_none() {
        return;
    }
    let file = dir.path().join("model.pt");
    let Some(pytorch) = pytorch_jit_casts(&file) else {
        return;
    };
    // Linear's input, weight and bias cast down, GELU's input (the JIT's fp32 list) up,
    // the second linear's inputs down: a test that sees none would prove nothing.
    assert!(pytorch.len() >= 4, "PyTorch's casts: {pytorch:?}");
    let _serial = common::serial();
    let model = Model::torchscript(&file).unwrap();
    let options = Options {
        autocast: Some(Kind::BFloat16),
        steps: 2,
        ..Options::default()
    };
    let input = Input::new(&[BATCH, WIDTH], Kind::Float);
    let run = dry_run_trace(
        &model,
        &[input],
        Mode::Train(Optimizer::Sgd),
        &options,
        Lists::Cpu,
    )
    .unwrap();
    let mut ours: Vec<u64> = run
        .ops
        .iter()
        .filter(|o| {
            o.step == 2
                && o.allocated_bytes > 0
                && matches!(
                    o.op.as_str(),
                    "aten::_autocast_to_reduced_precision" | "aten::_autocast_to_full_precision"
                )
        })
        .map(|o| o.allocated_bytes)
        .collect();
    ours.sort_unstable();
    assert_eq!(
        ours, pytorch,
        "the dry run's casts (bytes) against PyTorch's"
    );
}

#[test]
fn a_scalar_constant_the_optimized_graph_reads_is_there_traced_on_the_cpu_or_on_a_gpu() {
    // Gemma's embedding scale: `h * torch.tensor(256 ** 0.5, dtype=h.dtype)` traced
    // becomes `mul(h, to(CONSTANTS.c0, <the tracing device>, float))`; the optimized
    // graph folds the `to` and reads the constant's value while optimizing
    // (CanonicalizeOps calls `item()` on a 0-dim constant multiplied by). The same file
    // as traced on a GPU names cuda:0 there (its code rewritten so, as a trace on a GPU
    // writes it).
    let dir = tempfile::tempdir().unwrap();
    let cpu = dir.path().join("scaled.pt");
    let gpu = dir.path().join("scaled-on-gpu.pt");
    let script = scaled_model("torch.tensor(256 ** 0.5, dtype=h.dtype)")
        + r#"
import zipfile
src = zipfile.ZipFile(sys.argv[1])
with zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_STORED) as dst:
    for info in src.infolist():
        data = src.read(info.filename)
        if info.filename.endswith(".py"):
            data = data.replace(b'torch.device("cpu")', b'torch.device("cuda:0")')
        dst.writestr(info.filename, data)
"#;
    if !run_python(&script, &[&cpu, &gpu]) {
        return;
    }
    // The model's column is the file's name: the rest of the row is compared.
    let run = |file: &Path, extra: &[&str]| {
        let (stdout, stderr) = estimate_scaled(file, extra);
        let row = stdout.lines().nth(1).unwrap();
        (row[row.find(',').unwrap()..].to_string(), stderr)
    };
    let (on_cpu, warning) = run(&cpu, &[]);
    assert!(warning.is_empty(), "optimized, no fallback: {warning}");
    let (on_gpu, warning) = run(&gpu, &[]);
    assert!(warning.is_empty(), "optimized, no fallback: {warning}");
    assert_eq!(on_cpu, on_gpu);
    // No dropout: the optimized graph keeps what the ops as written keep.
    let (as_written, _) = run(&cpu, &["--no-jit-optimize"]);
    assert_eq!(on_cpu, as_written);
}

/// The script that traces an embedding, a multiplication by `scale` (a Python
/// expression of the embedding's output `h`) and a linear layer in training mode, and
/// saves it to `sys.argv[1]`.
fn scaled_model(scale: &str) -> String {
    format!(
        r#"
import sys, torch
class G(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.e = torch.nn.Embedding(1000, 256); s.l = torch.nn.Linear(256, 1000)
    def forward(s, x):
        h = s.e(x)
        return s.l(h * {scale})
torch.jit.trace(G().train(), torch.zeros(4, 32, dtype=torch.long), check_trace=False).save(sys.argv[1])
"#
    )
}

/// Runs `script` with PyTorch's Python on `files`; false (said so) where there is none.
fn run_python(script: &str, files: &[&Path]) -> bool {
    let Some(python) = common::torch_python() else {
        common::cannot_run("tracing with PyTorch: no Python with torch beside LIBTORCH");
        return false;
    };
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(files)
        .output()
        .expect("runs python");
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    true
}

/// `estimate FILE --input 4x32:i64 --train --csv` with `extra` flags: its standard
/// output and standard error.
fn estimate_scaled(file: &Path, extra: &[&str]) -> (String, String) {
    let mut args = vec![
        "estimate",
        file.to_str().unwrap(),
        "--input",
        "4x32:i64",
        "--train",
        "--csv",
    ];
    args.extend(extra);
    let out = common::cli(&args);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    (common::text(&out.stdout), common::text(&out.stderr))
}
