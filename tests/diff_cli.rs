//! `tch-memprof diff` on two real runs: an MLP trained at batch 8 and at batch 32, with
//! CSV and the timeline on. The growth it reports is checked against the profiler's own
//! in-process figures (a path independent of the CSV files), and its exit status and
//! messages against each kind of input.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};

/// Trains 2 epochs of 3 steps at `batch` with CSV into `dir`; returns the run's stem and
/// the largest feature-map figure of its iterations.
fn run(dir: &Path, batch: i64) -> (PathBuf, u64) {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "fc1", 64, 128, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "fc2", 128, 4, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut p = common::quiet_csv(&vs, dir).timeline(true).build().unwrap();
    let mut feature_maps = 0;
    for _ in 0..2 {
        for _ in 0..3 {
            let x = Tensor::randn([batch, 64], (Kind::Float, Device::Cpu));
            let y = Tensor::randn([batch, 4], (Kind::Float, Device::Cpu));
            let loss = net.forward(&x).mse_loss(&y, tch::Reduction::Mean);
            opt.zero_grad();
            loss.backward();
            opt.step();
            p.record_stats();
            feature_maps = feature_maps.max(p.last_stats().unwrap().feature_maps_bytes);
        }
        p.epoch_end();
    }
    assert_eq!(p.failures(), 0);
    let summary = p.csv_paths()[0].to_string_lossy().into_owned();
    let stem = summary
        .strip_suffix("_summary.csv")
        .expect("summary first")
        .to_string();
    drop(p);
    (PathBuf::from(stem), feature_maps)
}

fn diff(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .arg("diff")
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn diff_gates_on_growth_and_says_what_grew() {
    let _guard = serial();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, fa) = run(da.path(), 8);
    let (b, fb) = run(db.path(), 32);
    assert!(fb > fa, "batch 32 keeps more than batch 8: {fb} vs {fa}");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());

    // A run against itself: nothing grew.
    let same = diff(&[a, a]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stderr));
    assert!(text(&same.stdout).contains("no peak grew by more than 5%"));

    // Batch 8 -> 32: the feature maps grew, by exactly what the profiler measured.
    let grew = diff(&[a, b, "--max-increase", "5%"]);
    assert_eq!(grew.status.code(), Some(1), "{}", text(&grew.stdout));
    let err = text(&grew.stderr);
    let expected = format!("feature_maps_bytes grew by {} B", fb - fa);
    assert!(err.contains(&expected), "expected «{expected}» in: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    // The layers of the profiled step are compared too.
    assert!(
        text(&grew.stdout).contains("layer"),
        "{}",
        text(&grew.stdout)
    );
    // Weights do not depend on the batch; the CPU's resident memory is shown, not gated.
    assert!(!err.contains("weights_bytes"), "{err}");
    assert!(!err.contains("peak_resident_bytes"), "{err}");
    assert!(!err.contains("peak_reserved_bytes"), "{err}");
    assert!(
        text(&grew.stdout).contains("│ peak resident"),
        "{}",
        text(&grew.stdout)
    );

    // A generous threshold passes; shrinking always passes; the folder names the run.
    assert_eq!(
        diff(&[a, b, "--max-increase", "100000%"]).status.code(),
        Some(0)
    );
    let shrink = diff(&[b, a, "--max-increase", "0%"]);
    assert_eq!(shrink.status.code(), Some(0), "{}", text(&shrink.stderr));
    let by_folder = diff(&[da.path().to_str().unwrap(), a]);
    assert_eq!(
        by_folder.status.code(),
        Some(0),
        "{}",
        text(&by_folder.stderr)
    );

    // A run cut short by a killed process: read up to its last complete row, with a warning.
    let cut = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(da.path()).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, cut.path().join(p.file_name().unwrap())).unwrap();
    }
    let summary = std::fs::read_dir(cut.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("_summary.csv"))
        .unwrap();
    let bytes = std::fs::read(&summary).unwrap();
    std::fs::write(&summary, &bytes[..bytes.len() - 7]).unwrap();
    let out = diff(&[cut.path().to_str().unwrap(), a]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cut short"),
        "{}",
        text(&out.stderr)
    );

    // Runs made with another libtorch: said, from <run>_run.csv.
    let meta = std::fs::read_dir(cut.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("_run.csv"))
        .expect("<run>_run.csv written at build");
    let m = std::fs::read_to_string(&meta).unwrap();
    assert!(
        m.contains(&format!("libtorch,{}", tch_memprof::LIBTORCH_VERSION)),
        "{m}"
    );
    std::fs::write(&meta, m.replace(tch_memprof::LIBTORCH_VERSION, "9.9.9")).unwrap();
    let out = diff(&[cut.path().to_str().unwrap(), a]);
    let said = text(&out.stdout);
    assert!(
        said.contains("different libtorch versions (9.9.9 vs"),
        "{said}"
    );
}

#[test]
fn bad_input_is_one_clear_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = diff(&[missing.to_str().unwrap(), missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("no run at") && err.contains("nope"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // A file without a column this version writes.
    std::fs::write(
        dir.path().join("r_summary.csv"),
        "timestamp,epoch,iteration,device\nt,1,1,cpu\n",
    )
    .unwrap();
    let r = dir.path().join("r");
    let out = diff(&[r.to_str().unwrap(), r.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("r_summary.csv") && err.contains("missing field"),
        "{err}"
    );

    let out = diff(&["a", "b", "--max-increase", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("'lots' is not a percentage"),
        "{}",
        text(&out.stderr)
    );
}
