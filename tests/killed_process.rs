//! A process killed mid-run leaves CSV files that parse, with every completed row.
//!
//! The test re-runs this test binary as a child that trains forever, kills it with
//! SIGKILL once rows have appeared, and parses what it left.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};

const CHILD_DIR: &str = "TCH_MEMPROF_CHILD_CSV_DIR";

/// The child: trains until killed. Ignored in normal runs; started by the test below.
#[test]
#[ignore = "helper process for killed_mid_run_leaves_complete_rows"]
fn child_training_loop() {
    let dir = std::env::var(CHILD_DIR).expect("started by the parent test");
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::linear(vs.root() / "fc", 64, 8, Default::default());
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut p = tch_memprof::MemoryProfiler::builder(&vs)
        .print(false)
        .csv(true)
        .wide_csv(true)
        .csv_dir(&dir)
        .build()
        .unwrap();
    loop {
        let x = Tensor::randn([16, 64], (Kind::Float, Device::Cpu));
        let loss = net.forward(&x).mean(Kind::Float);
        opt.backward_step(&loss);
        p.record_stats();
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn csv_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|e| e.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn summary_rows(dir: &Path) -> usize {
    csv_files(dir)
        .iter()
        .find(|p| p.to_string_lossy().ends_with("_summary.csv"))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

#[test]
fn killed_mid_run_leaves_complete_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_training_loop", "--nocapture"])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while summary_rows(dir.path()) < 20 {
        assert!(Instant::now() < deadline, "the child wrote no rows in 60 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no flush at exit
    child.wait().unwrap();

    let files = csv_files(dir.path());
    // Summary, parameters and wide (no epoch ended, so no epochs file), and the run's
    // description written at build; nothing else.
    assert_eq!(files.len(), 4, "{files:?}");
    let mut counts = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            text.ends_with('\n'),
            "{}: the last row is complete",
            path.display()
        );
        let mut r = csv::ReaderBuilder::new()
            .flexible(false)
            .from_path(path)
            .unwrap();
        let width = r.headers().unwrap().len();
        let rows: Vec<csv::StringRecord> = r.records().map(|r| r.unwrap()).collect();
        assert!(rows.iter().all(|r| r.len() == width), "{}", path.display());
        counts.push((path.clone(), rows.len()));
    }
    // Summary and wide files have one row per completed record_stats; the parameter
    // file two per iteration (weight and bias) plus their gradients.
    let rows_of = |suffix: &str| {
        counts
            .iter()
            .find(|(p, _)| p.to_string_lossy().ends_with(suffix))
            .map(|(_, n)| *n)
            .unwrap()
    };
    let summary = rows_of("_summary.csv");
    assert!(summary >= 20);
    assert_eq!(
        rows_of("_run.csv"),
        4,
        "tch_memprof, libtorch, device, started"
    );
    let wide = rows_of("_wide.csv");
    let params = rows_of("_parameters.csv");
    // The kill can land between files of one record_stats: at most one row apart.
    assert!(
        wide == summary || wide + 1 == summary,
        "wide {wide} summary {summary}"
    );
    assert!(
        params.div_ceil(4) >= summary.saturating_sub(1),
        "params {params} summary {summary}"
    );
}
