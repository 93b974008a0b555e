//! What a user of the timeline finds on disk: the peak step's CSV files and plots beside
//! the run's other CSV files, written at epoch_end; a step asked for, written when it
//! ends; nothing of the kind with the timeline off; a bad step number refused.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use tch::nn;
use tch_memprof::{Error, MemoryProfiler};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn ending(dir: &Path, suffix: &str) -> Option<PathBuf> {
    files(dir)
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(suffix))
}

#[test]
fn peak_step_files_appear_at_epoch_end_and_parse() {
    let _g = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let Mlp { vs, net, mut opt } = mlp_with_adam(1e-3);
    let mut prof = quiet_csv(&vs, dir.path())
        .timeline(true)
        .timeline_step(2)
        .build()
        .unwrap();
    for _ in 0..3 {
        train_step(&net, &mut opt);
        prof.record_stats();
    }
    // The asked-for step is written when it ends; the peak step waits for epoch_end.
    assert!(
        ending(dir.path(), "_step2_timeline.csv").is_some(),
        "{:?}",
        files(dir.path())
    );
    assert!(ending(dir.path(), "_step2_layers.csv").is_some());
    assert!(ending(dir.path(), "_step2_timeline.png").is_some());
    let peak_files = prof.peak_step_files().unwrap();
    assert!(!peak_files.timeline_csv.exists());
    prof.epoch_end();
    assert_eq!(prof.failures(), 0);
    for f in peak_files.paths() {
        assert!(f.exists(), "{} missing", f.display());
    }

    let peak = prof.peak_step_profile().unwrap();
    let mut r = csv::Reader::from_path(&peak_files.timeline_csv).unwrap();
    let header: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(
        header,
        [
            "op_index",
            "op",
            "phase",
            "layer",
            "param_bytes",
            "buffer_bytes",
            "grad_bytes",
            "act_bytes",
            "temp_bytes",
            "opt_bytes",
            "workspace_bytes",
            "other_bytes",
            "total_bytes",
            "peak_bytes",
            "idle_bytes"
        ]
    );
    let mut rows = 0;
    let mut highest = 0u64;
    for rec in r.records() {
        let rec = rec.unwrap();
        let cats: u64 = (4..12).map(|i| rec[i].parse::<u64>().unwrap()).sum();
        let total = rec[12].parse::<u64>().unwrap();
        assert_eq!(cats, total);
        // The highest point since the last row is at least what is live at this one.
        let peak_since = rec[13].parse::<u64>().unwrap();
        assert!(peak_since >= total, "{rec:?}");
        highest = highest.max(peak_since);
        // No step detail here: nothing is counted idle.
        assert_eq!(&rec[14], "0");
        assert!(["forward", "backward", "optimizer"].contains(&&rec[2]));
        rows += 1;
    }
    assert_eq!(rows, peak.rows.len());
    // The rows' highest points are the step's peak, reached inside an op.
    assert_eq!(highest, peak.peak.bytes);

    let png = std::fs::read(&peak_files.png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(&peak_files.svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("ACT"));
    drop(prof);
}

#[test]
fn no_timeline_files_without_the_timeline() {
    let _g = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let Mlp { vs, net, mut opt } = mlp_with_adam(1e-3);
    let mut prof = quiet_csv(&vs, dir.path()).build().unwrap();
    train_step(&net, &mut opt);
    prof.record_stats();
    prof.epoch_end();
    assert!(prof.peak_step_profile().is_none());
    assert!(prof.peak_step_files().is_none());
    drop(prof);
    assert!(ending(dir.path(), "_timeline.csv").is_none());
}

#[test]
fn step_zero_is_refused_with_the_reason() {
    let _g = common::serial();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let err = MemoryProfiler::builder(&vs)
        .timeline_step(0)
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidConfig {
            name: "timeline_step",
            ..
        }
    ));
    assert!(err.to_string().contains("counted from 1"), "{err}");
}
