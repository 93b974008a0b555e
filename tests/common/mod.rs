//! Shared helpers: the reference MLP (1024 -> 4096 -> ReLU -> 10, batch 256), its sizes computed by hand, and the lock that serialises profiler tests.
#![allow(dead_code)]

use tch::{nn, nn::Module, Device, Kind, Tensor};

pub const B: i64 = 256;
pub const IN: i64 = 1024;
pub const HIDDEN: i64 = 4096;
pub const OUT: i64 = 10;
pub const F32: u64 = 4;

/// Linear(1024->4096) -> ReLU -> Linear(4096->10).
pub fn mlp(vs: &nn::VarStore) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(vs.root() / "l1", IN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(
            vs.root() / "l2",
            HIDDEN,
            OUT,
            Default::default(),
        ))
}

/// Bytes of the MLP's parameters: two weight matrices and two biases, f32.
pub fn mlp_weight_bytes() -> u64 {
    F32 * (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT) as u64
}

/// What the forward pass keeps for backward, plus the batch, by hand:
/// input x, targets y (i64), the ReLU output (saved by ReluBackward and by the second
/// linear), the log-softmax output (saved by LogSoftmaxBackward and NllLossBackward),
/// the loss and NLL's total_weight (two f32 scalars), and the f32 gradient seed
/// that backward() allocates before the engine starts.
pub fn mlp_feature_map_bytes() -> u64 {
    let x = F32 * (B * IN) as u64;
    let y = 8 * B as u64;
    let relu = F32 * (B * HIDDEN) as u64;
    let log_softmax = F32 * (B * OUT) as u64;
    let scalars = 3 * F32;
    x + y + relu + log_softmax + scalars
}

/// Peak of backward temporaries by hand: at ReluBackward, the gradient flowing into
/// the ReLU output (B x HIDDEN) and the gradient it produces (B x HIDDEN) are both live;
/// nothing else in backward is larger.
pub fn mlp_intermediate_bytes() -> u64 {
    2 * F32 * (B * HIDDEN) as u64
}

/// The reference MLP on the CPU with its Adam optimizer: what most profiled tests train.
pub struct Mlp {
    pub vs: nn::VarStore,
    pub net: nn::Sequential,
    pub opt: nn::Optimizer,
}

/// The reference MLP ([`mlp`]) on the CPU, with Adam at learning rate `lr`.
pub fn mlp_with_adam(lr: f64) -> Mlp {
    use tch::nn::OptimizerConfig;
    let vs = nn::VarStore::new(Device::Cpu);
    let net = mlp(&vs);
    let opt = nn::Adam::default().build(&vs, lr).unwrap();
    Mlp { vs, net, opt }
}

impl Mlp {
    /// One training iteration ([`train_step`]).
    pub fn step(&mut self) {
        train_step(&self.net, &mut self.opt);
    }
}

/// A profiler of `vs` that prints nothing and writes its CSV files into `dir`: the
/// builder most tests start from (add what the test needs, then build).
pub fn quiet_csv(
    vs: &nn::VarStore,
    dir: impl AsRef<std::path::Path>,
) -> tch_memprof::MemoryProfilerBuilder {
    tch_memprof::MemoryProfiler::builder(vs)
        .print(false)
        .csv(true)
        .csv_dir(dir)
}

pub struct Batch {
    pub x: Tensor,
    pub y: Tensor,
}

pub fn batch() -> Batch {
    Batch {
        x: Tensor::randn([B, IN], (Kind::Float, Device::Cpu)),
        y: Tensor::randint(OUT, [B], (Kind::Int64, Device::Cpu)),
    }
}

/// Bytes of a batch: x and y.
pub fn batch_bytes() -> u64 {
    F32 * (B * IN) as u64 + 8 * B as u64
}

/// One training iteration on a fresh batch; the batch and the loss are dropped before
/// it returns, so nothing of the iteration is held by the caller.
pub fn train_step(net: &impl Module, opt: &mut nn::Optimizer) {
    let b = batch();
    let loss = net.forward(&b.x).cross_entropy_for_logits(&b.y);
    opt.zero_grad();
    loss.backward();
    opt.step();
}

/// The tiny model of the bounded-memory checks (test and bench):
/// Linear(16->32) -> ReLU -> Linear(32->4).
pub fn tiny_mlp(vs: &nn::VarStore) -> impl Module {
    nn::seq()
        .add(nn::linear(vs.root() / "l1", 16, 32, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 32, 4, Default::default()))
}

/// One optimizer step of the tiny model on a fresh batch of 8.
pub fn tiny_step(net: &impl Module, opt: &mut nn::Optimizer) {
    let x = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(4, [8], (Kind::Int64, Device::Cpu));
    let loss = net.forward(&x).cross_entropy_for_logits(&y);
    opt.backward_step(&loss);
}

/// Serialises the tests of one test binary that start a profiler (one per process).
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes [`SERIAL`] (a test that panicked while holding it does not block the rest).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `<venv>/bin/python3` of the torch wheel that LIBTORCH points into.
pub fn torch_python() -> Option<std::path::PathBuf> {
    let lib = std::path::PathBuf::from(std::env::var_os("LIBTORCH")?);
    // <venv>/lib/python3.X/site-packages/torch
    let venv = lib.parent()?.parent()?.parent()?.parent()?;
    let py = venv.join("bin").join("python3");
    py.exists().then_some(py)
}

/// The wheel's Python with the model corpus's packages (`scripts/corpus-env.sh`
/// installs them once); None, said with `NOT RUN: {what}` (a failure under `CI`),
/// without a Python beside LIBTORCH.
pub fn corpus_python(what: &str) -> Option<String> {
    if torch_python().is_none() {
        cannot_run(&format!(
            "{what}: no Python with torch beside LIBTORCH (run through scripts/with-libtorch.sh)"
        ));
        return None;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let env = std::process::Command::new(root.join("scripts/corpus-env.sh"))
        .output()
        .expect("runs scripts/corpus-env.sh");
    assert!(
        env.status.success(),
        "scripts/corpus-env.sh: {}",
        text(&env.stderr)
    );
    Some(text(&env.stdout).trim().to_string())
}

/// A check that cannot run here: says so on the test's stderr handle (which the test
/// harness does not capture, so it shows even when the test passes) as
/// `NOT RUN: {what}`, and fails the test when `CI` is set, where every check must run.
pub fn cannot_run(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "NOT RUN: {what}");
    if std::env::var_os("CI").is_some() {
        panic!("NOT RUN under CI: {what}");
    }
}

/// The libtorch whose figures the version-keyed checks hold (`tests/data/version-keyed.txt`).
pub const MEASURED_LIBTORCH: &str = "2.11.";

/// Skips `test` (`file::function`, as `tests/data/version-keyed.txt` lists it), saying so
/// with `why` on stderr; panics when the list does not name it: a skip no one listed is a
/// check gone quiet.
pub fn skip_listed(test: &str, why: &str) {
    use std::io::Write;
    let list = include_str!("../data/version-keyed.txt");
    let listed = list
        .lines()
        .filter(|l| !l.starts_with('#'))
        .any(|l| l.split_whitespace().next() == Some(test));
    assert!(
        listed,
        "{test} would skip ({why}), but tests/data/version-keyed.txt does not list it"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED (listed in tests/data/version-keyed.txt): {test}: {why}"
    );
}

/// Whether this is the libtorch the figures of `test` come from (2.11); otherwise skips
/// it by name ([`skip_listed`]) and says which libtorch this is.
pub fn on_the_measured_libtorch(test: &str) -> bool {
    let here = tch_memprof::LIBTORCH_VERSION;
    if here.starts_with(MEASURED_LIBTORCH) {
        return true;
    }
    skip_listed(
        test,
        &format!("its figures come from libtorch 2.11; this one is {here}"),
    );
    false
}

/// A GPU check (ignored unless asked for): fails, saying `what` could not be checked,
/// on a machine without a CUDA device.
pub fn need_cuda(what: &str) {
    assert!(
        tch::Cuda::is_available(),
        "no CUDA device: {what} cannot be checked here"
    );
}

/// Runs the `tch-memprof` command with `args` (without `PYTORCH_CUDA_ALLOC_CONF`), on
/// one OpenMP thread: tests run two at a time and may run two commands each, and on a
/// 2-core machine each command's spinning thread pool slowed the others (the corpus test
/// took a quarter longer with the default pools).
pub fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .args(args)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        // Tables wrap to COLUMNS when piped: the golden outputs are unwrapped.
        .env_remove("COLUMNS")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("runs tch-memprof")
}

/// `tch-memprof ARGS` with standard output piped and `COLUMNS` set: its tables wrapped to
/// that width.
pub fn cli_at_width(args: &[&str], columns: u16) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .args(args)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env("COLUMNS", columns.to_string())
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("runs tch-memprof")
}

/// `tch-memprof ARGS`, which must succeed (else the test fails with its standard
/// error): its standard output.
pub fn cli_ok(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "tch-memprof {}: {}",
        args.join(" "),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The cell under `name` in the first row of CSV `text` (a header line, then rows), as
/// `estimate --csv` prints them.
pub fn csv_cell(text: &str, name: &str) -> String {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let row: Vec<&str> = lines.next().expect("a row").split(',').collect();
    let i = header
        .iter()
        .position(|h| *h == name)
        .unwrap_or_else(|| panic!("no column {name} in {header:?}"));
    row[i].to_string()
}

/// Bytes of a command's output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `f` on every item, two at a time (the machine's cores; each estimate is its
/// own process), keeping their order.
pub fn in_pairs<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.is_empty() {
        return Vec::new();
    }
    std::thread::scope(|s| {
        let half = items.len().div_ceil(2);
        let f = &f;
        let parts: Vec<_> = items
            .chunks(half)
            .map(|chunk| s.spawn(move || chunk.iter().map(f).collect::<Vec<_>>()))
            .collect();
        parts.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// Holds the Markdown table `name` of `doc` (a path from the crate's root), the lines
/// between `<!-- table NAME ... -->` and `<!-- end NAME -->`, to `table`, the one the
/// test measured and printed: fails when they differ, showing both. With
/// `TCH_MEMPROF_BLESS=1` it writes the measured table into the doc instead (then read
/// the diff before committing it). So a table in the docs is the table its test
/// printed, not a copy that drifts.
pub fn doc_table(doc: &str, name: &str, table: &str) {
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if !on_the_measured_libtorch("common::doc_table") {
        return;
    }
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{doc}: {e}"));
    let start = format!("<!-- table {name} ");
    let end = format!("<!-- end {name} -->");
    let begin = text
        .find(&start)
        .unwrap_or_else(|| panic!("{doc} has no `{start}... -->` marker"));
    let body = begin
        + text[begin..]
            .find("-->\n")
            .unwrap_or_else(|| panic!("{doc}: the marker of {name} is not closed"))
        + 4;
    let stop = body
        + text[body..]
            .find(&end)
            .unwrap_or_else(|| panic!("{doc} has no `{end}` after the table {name}"));
    let table = format!("{}\n", table.trim_end());
    if text[body..stop] == table {
        return;
    }
    if std::env::var_os("TCH_MEMPROF_BLESS").is_some() {
        let new = format!("{}{table}{}", &text[..body], &text[stop..]);
        std::fs::write(&path, new).unwrap();
        eprintln!("BLESSED: the table {name} of {doc}");
        return;
    }
    panic!(
        "the table {name} of {doc} is not the one this test measured \
         (TCH_MEMPROF_BLESS=1 writes it there):\n--- in {doc}:\n{}--- measured:\n{table}",
        &text[body..stop]
    );
}

/// A Markdown table: the header's cells, the alignment row (`---` or `---:` each), and
/// the rows.
pub fn markdown_table(header: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n|", header.join(" | "));
    for r in right {
        out.push_str(if *r { "---:|" } else { "---|" });
    }
    out.push('\n');
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}
