//! A process killed mid-run leaves CSV files that parse, with every completed row.
//!
//! The test re-runs this test binary as a child that trains as fast as it can (no
//! sleep: the time is spent in training and in the profiler's writes) and says on stdout
//! how many `record_stats` calls have returned. Several times over, once the first has
//! returned, the parent waits a random delay (seeded from the clock and std's
//! `RandomState`), kills the child with SIGKILL, and parses what it left: every row of
//! each file complete, and as many rows as the child had finished (plus at most the one
//! it was writing when killed).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};

const CHILD_DIR: &str = "TCH_MEMPROF_CHILD_CSV_DIR";

/// The child: trains until killed, printing `completed N` after the N-th
/// `record_stats` returned. Ignored in normal runs; started by the test below.
#[test]
#[ignore = "helper process for killed_at_random_points_leaves_complete_rows"]
fn child_training_loop() {
    use std::io::Write;
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
    let mut out = std::io::stdout().lock();
    for n in 1u64.. {
        let x = Tensor::randn([16, 64], (Kind::Float, Device::Cpu));
        let loss = net.forward(&x).mean(Kind::Float);
        opt.backward_step(&loss);
        p.record_stats();
        writeln!(out, "completed {n}").unwrap();
        out.flush().unwrap();
    }
}

/// A random delay in [0, max): std's `RandomState` (randomly keyed per process and per
/// instance) hashing the clock.
fn random_delay(max: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let r = RandomState::new().hash_one(nanos);
    Duration::from_nanos(r % max.as_nanos() as u64)
}

fn csv_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|e| e.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// One run of the child killed at a random point of its loop; returns (rows it reported
/// complete, delay).
fn kill_at_random(dir: &Path) -> (usize, Duration) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_training_loop", "--nocapture"])
        .env(CHILD_DIR, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let completed = Arc::new(AtomicUsize::new(0));
    let reader = {
        let completed = completed.clone();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("completed ") {
                    completed.store(n.parse().unwrap(), Ordering::SeqCst);
                }
            }
        })
    };
    // Past the start (libtorch loading, the files created): the first report returned.
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the child reported no row in 60 s"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let delay = random_delay(Duration::from_millis(300));
    std::thread::sleep(delay);
    child.kill().unwrap(); // SIGKILL: no destructor, no flush at exit
    child.wait().unwrap();
    reader.join().unwrap(); // everything the child printed before it died
    (completed.load(Ordering::SeqCst), delay)
}

#[test]
fn killed_at_random_points_leaves_complete_rows() {
    for round in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let (done, delay) = kill_at_random(dir.path());
        let files = csv_files(dir.path());
        let at = format!("round {round}: killed after {delay:?}, {done} reports returned");
        println!("{at}");
        // Summary, parameters and wide (no epoch ended, so no epochs file), and the
        // run's description written at build; nothing else.
        assert_eq!(files.len(), 4, "{at}: {files:?}");
        let mut counts = Vec::new();
        for path in &files {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(
                text.ends_with('\n'),
                "{at}: {}: the last row is complete",
                path.display()
            );
            let mut r = csv::ReaderBuilder::new()
                .flexible(false)
                .from_path(path)
                .unwrap();
            let width = r.headers().unwrap().len();
            let rows: Vec<csv::StringRecord> = r
                .records()
                .map(|r| r.unwrap_or_else(|e| panic!("{at}: {}: {e}", path.display())))
                .collect();
            assert!(
                rows.iter().all(|r| r.len() == width),
                "{at}: {}",
                path.display()
            );
            counts.push((path.clone(), rows.len()));
        }
        let rows_of = |suffix: &str| {
            counts
                .iter()
                .find(|(p, _)| p.to_string_lossy().ends_with(suffix))
                .map(|(_, n)| *n)
                .unwrap()
        };
        assert_eq!(
            rows_of("_run.csv"),
            5,
            "{at}: tch_memprof, libtorch, device, started, print_period"
        );
        // One summary row and one wide row per record_stats: every one that returned,
        // and at most the one in progress at the kill.
        for file in ["_summary.csv", "_wide.csv"] {
            let n = rows_of(file);
            assert!(n == done || n == done + 1, "{at}: {file} has {n} rows");
        }
        // The parameters file: the whole set of four rows (weight and bias, and their
        // gradients), written by the first report and not again while the variables
        // stay as they are.
        let params = rows_of("_parameters.csv");
        assert_eq!(params, 4, "{at}: {params} parameter rows");
    }
}
