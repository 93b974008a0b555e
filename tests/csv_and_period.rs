//! The report period and the CSV files, parsed back and checked against the stats.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use tch::{nn, Device};

fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r
        .records()
        .map(|rec| rec.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

fn col(header: &[String], name: &str) -> usize {
    header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
}

fn file(paths: &[PathBuf], suffix: &str) -> PathBuf {
    paths
        .iter()
        .find(|p| p.to_string_lossy().ends_with(suffix))
        .unwrap()
        .clone()
}

#[test]
fn every_third_iteration_is_reported_and_the_files_parse_back() {
    let _guard = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let csv_dir = dir.path().join("nested/memory_csv_data");
    let Mlp { vs, net, mut opt } = mlp_with_adam(1e-3);
    let mut profiler = quiet_csv(&vs, &csv_dir)
        .print_period(3)
        .wide_csv(true)
        .build()
        .unwrap();

    let mut reported = Vec::new();
    for epoch in 1..=2u64 {
        for _ in 0..4 {
            train_step(&net, &mut opt);
            profiler.record_stats();
            let s = profiler.last_stats().unwrap().clone();
            if s.step % 3 == 0 {
                reported.push(s);
            }
        }
        profiler.epoch_end();
        assert_eq!(profiler.epochs().len() as u64, epoch);
    }
    assert_eq!(profiler.failures(), 0);
    let paths = profiler.csv_paths().to_vec();
    drop(profiler);

    // Steps 3 and 6 of 8: epoch 1 iteration 3, epoch 2 iteration 2.
    let (h, rows) = read_csv(&file(&paths, "_summary.csv"));
    let expected_header = "timestamp,epoch,iteration,device,allocated_bytes,peak_allocated_bytes,\
        resident_bytes,peak_resident_bytes,weights_bytes,buffers_bytes,gradients_bytes,\
        feature_maps_bytes,intermediate_gradients_bytes,optimizer_state_bytes,other_bytes";
    assert!(h.join(",").starts_with(expected_header), "{h:?}");
    assert_eq!(rows.len(), 2);
    let at = |r: &Vec<String>, name: &str| r[col(&h, name)].clone();
    assert_eq!(
        (at(&rows[0], "epoch"), at(&rows[0], "iteration")),
        ("1".into(), "3".into())
    );
    assert_eq!(
        (at(&rows[1], "epoch"), at(&rows[1], "iteration")),
        ("2".into(), "2".into())
    );
    for (row, s) in rows.iter().zip(&reported) {
        // Local time as spreadsheets read it: `2026-11-26 20:31:07.123`, written during
        // this test.
        let ts = at(row, "timestamp");
        let written = chrono::NaiveDateTime::parse_from_str(&ts, "%Y-%m-%d %H:%M:%S%.3f")
            .unwrap_or_else(|e| panic!("timestamp {ts:?}: {e}"));
        let age = chrono::Local::now().naive_local() - written;
        assert!(age.num_seconds().abs() < 600, "timestamp {ts:?}");
        assert_eq!(ts.len(), "2026-11-26 20:31:07.123".len(), "{ts:?}");
        assert_eq!(at(row, "device"), "cpu");
        for (name, value) in [
            ("allocated_bytes", s.allocated_bytes),
            ("peak_allocated_bytes", s.peak_allocated_bytes),
            ("weights_bytes", s.weights_bytes),
            ("gradients_bytes", s.gradients_bytes),
            ("feature_maps_bytes", s.feature_maps_bytes),
            (
                "intermediate_gradients_bytes",
                s.intermediate_gradients_bytes,
            ),
            ("optimizer_state_bytes", s.optimizer_state_bytes),
            ("other_bytes", s.other_bytes),
        ] {
            assert_eq!(at(row, name).parse::<u64>().unwrap(), value, "{name}");
        }
        assert_eq!(
            at(row, "weights_bytes").parse::<u64>().unwrap(),
            mlp_weight_bytes()
        );
        assert_eq!(
            at(row, "feature_maps_bytes").parse::<u64>().unwrap(),
            mlp_feature_map_bytes()
        );
    }

    // Long form: a set of 4 weights + 4 gradients at each report, both reports here
    // being their epoch's first (a set is not written again within an epoch while the
    // variables stay: src/report/csv_tests.rs, tests/killed_process.rs).
    let (h, rows) = read_csv(&file(&paths, "_parameters.csv"));
    assert_eq!(
        h.join(","),
        "timestamp,epoch,iteration,parameter,kind,dtype,shape,bytes"
    );
    assert_eq!(rows.len(), 2 * 8);
    let l1 = rows
        .iter()
        .find(|r| r[3] == "l1.weight" && r[4] == "gradient")
        .unwrap();
    assert_eq!(l1[5], "Float");
    assert_eq!(l1[6], "[4096, 1024]");
    assert_eq!(l1[7], (F32 * (HIDDEN * IN) as u64).to_string());

    // Wide: one column per variable and per gradient.
    let (h, rows) = read_csv(&file(&paths, "_wide.csv"));
    assert_eq!(h.len(), 3 + 4 + 4);
    assert!(h.contains(&"l2.bias".to_string()) && h.contains(&"l2.bias grad".to_string()));
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0][col(&h, "l2.bias")], (F32 * OUT as u64).to_string());

    // Epochs: change of live bytes since the previous epoch end is 0 once warm.
    let (h, rows) = read_csv(&file(&paths, "_epochs.csv"));
    assert_eq!(rows.len(), 2);
    // On the CPU the reserved column holds the resident memory and is named for it.
    assert!(h.contains(&"peak_resident_bytes".to_string()), "{h:?}");
    assert!(!h.contains(&"peak_reserved_bytes".to_string()), "{h:?}");
    // The files read back as any run's do.
    let stem = file(&paths, "_summary.csv");
    let run = tch_memprof::runs::Run::open(&stem).unwrap();
    assert_eq!(run.summary.len(), 2);
    assert!(run.summary.iter().all(|r| r.peak_reserved_bytes > 0));
    assert_eq!(rows[1][col(&h, "allocated_change_bytes")], "0");
    assert_eq!(rows[0][col(&h, "iterations")], "4");
}

#[test]
fn files_are_never_overwritten() {
    let _guard = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let _net = mlp(&vs);
    let mut stems = Vec::new();
    for _ in 0..2 {
        let mut p = quiet_csv(&vs, dir.path()).build().unwrap();
        p.record_stats();
        stems.push(p.csv_paths()[0].clone());
    }
    assert_ne!(
        stems[0], stems[1],
        "a second run in the same second gets its own files"
    );
    assert!(stems.iter().all(|p| p.exists()));
}
