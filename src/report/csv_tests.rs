//! The CSV sink's tests (a child module of `report/csv.rs`, kept in a file of its own).

use super::*;
use crate::report::summary_rows::summary_line;
use crate::runs::schema::ParameterRow;
use crate::stats::{VariableKind, VariableStats};

fn stats(device: &str, cuda: Option<crate::cuda::CudaStats>) -> IterationStats {
    let mut s = crate::report::terminal::tests::stats(0);
    s.device = device.into();
    s.cuda = cuda;
    s
}

fn summary(s: &IterationStats) -> (Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut r = CsvReport::new(dir.path(), "run", false, true);
    r.iteration(s).unwrap();
    let mut rd = csv::Reader::from_path(dir.path().join("run_summary.csv")).unwrap();
    let h = rd.headers().unwrap().iter().map(String::from).collect();
    let row = rd.records().next().unwrap().unwrap();
    (h, row.iter().map(String::from).collect())
}

/// The parameter rows written from the encoded tails of the last list are the rows
/// serde writes of the iterations that write them, byte for byte: the first, not the
/// second (the same list kept), the third (a new gradient; a shape and a name that
/// need quoting).
#[test]
fn parameter_rows_are_what_the_row_type_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = CsvReport::new(dir.path(), "run", false, true);
    let mut s = stats("cpu", None);
    s.variables = s
        .variables
        .iter()
        .cloned()
        .chain([VariableStats {
            name: "odd, \"quoted\" name".into(),
            kind: VariableKind::Weight,
            dtype: "BFloat16".into(),
            shape: vec![256, 4096],
            bytes: 2 << 20,
            grad_bytes: None,
        }])
        .collect();
    let mut iterations = Vec::new();
    for i in 1..=3u64 {
        s.iteration = i;
        if i == 3 {
            let mut v: Vec<VariableStats> = s.variables.to_vec();
            v[0].grad_bytes = Some(77);
            s.variables = v.into();
        }
        r.iteration(&s).unwrap();
        iterations.push(s.clone());
    }
    let written = std::fs::read(dir.path().join("run_parameters.csv")).unwrap();
    // The timestamps written, one a row, in order.
    let mut rd = csv::Reader::from_reader(&written[..]);
    let stamps: Vec<String> = rd
        .deserialize::<ParameterRow>()
        .map(|r| r.unwrap().timestamp)
        .collect();
    let mut expected = csv::Writer::from_writer(Vec::new());
    let mut k = 0;
    for s in iterations.iter().filter(|s| s.iteration != 2) {
        for v in s.variables.iter() {
            let mut row = ParameterRow {
                timestamp: stamps[k].clone(),
                epoch: s.epoch,
                iteration: s.iteration,
                parameter: v.name.clone(),
                kind: v.kind.as_str().into(),
                dtype: v.dtype.clone(),
                shape: format::shape(&v.shape),
                bytes: v.bytes,
            };
            expected.serialize(&row).unwrap();
            k += 1;
            if let Some(g) = v.grad_bytes {
                row.timestamp = stamps[k].clone();
                row.kind = "gradient".into();
                row.bytes = g;
                expected.serialize(&row).unwrap();
                k += 1;
            }
        }
    }
    assert_eq!(k, stamps.len());
    let expected = expected.into_inner().unwrap();
    assert_eq!(
        String::from_utf8(written).unwrap(),
        String::from_utf8(expected).unwrap()
    );
}

/// The (epoch, iteration) of each set of parameter rows in `dir`'s run, in order, with
/// its row count.
fn parameter_sets(dir: &std::path::Path) -> Vec<((u64, u64), usize)> {
    let mut rd = csv::Reader::from_path(dir.join("run_parameters.csv")).unwrap();
    let mut sets: Vec<((u64, u64), usize)> = Vec::new();
    for r in rd.deserialize::<ParameterRow>() {
        let r = r.unwrap();
        match sets.last_mut() {
            Some((key, n)) if *key == (r.epoch, r.iteration) => *n += 1,
            _ => sets.push(((r.epoch, r.iteration), 1)),
        }
    }
    sets
}

/// The whole set of parameter rows is written at the first report, when a variable or
/// gradient changes, at an epoch's first report and when the file vanished; not when a
/// report repeats the last set (the same list, or a new list of the same rows). Each
/// set is whole, so the runs' reader's "last iteration's rows" are the latest set.
#[test]
fn parameter_rows_are_written_when_they_change_and_at_each_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = CsvReport::new(dir.path(), "run", false, true);
    // Three variables: a buffer, two weights with gradients; five rows a set.
    let mut s = crate::report::terminal::tests::stats(3);
    let per_set = 5;
    // Each report in a second of its own (the files' links are read once a second),
    // but for those `same_second` says.
    let mut at = std::time::Duration::from_secs(1_780_000_000);
    let same_second = std::cell::Cell::new(false);
    let mut report = |s: &mut IterationStats, epoch: u64, iteration: u64| {
        s.epoch = epoch;
        s.iteration = iteration;
        if !same_second.get() {
            at += std::time::Duration::from_secs(1);
        }
        r.iteration_at(s, at, at.as_secs())
    };
    // Epoch 1: the same list three times; then a new list of the same rows.
    for i in 1..=3 {
        report(&mut s, 1, i).unwrap();
    }
    s.variables = s.variables.to_vec().into();
    report(&mut s, 1, 4).unwrap();
    assert_eq!(parameter_sets(dir.path()), [((1, 1), per_set)]);
    // A gradient that went: a set of one row fewer, kept while nothing changes.
    let mut v = s.variables.to_vec();
    assert_eq!(v[2].name, "layer3.weight");
    v[2].grad_bytes = None;
    s.variables = v.into();
    report(&mut s, 1, 5).unwrap();
    report(&mut s, 1, 6).unwrap();
    // Epoch 2's first report writes the set, its second does not.
    report(&mut s, 2, 1).unwrap();
    report(&mut s, 2, 2).unwrap();
    assert_eq!(
        parameter_sets(dir.path()),
        [
            ((1, 1), per_set),
            ((1, 5), per_set - 1),
            ((2, 1), per_set - 1)
        ]
    );
    // The file deleted (the summary's left): its links are read once a second, so a
    // report in the second they were last read does not see it (its rows, had it any,
    // would go with the deleted file); the first report of the next second recreates
    // it with its header and the whole set, and says the earlier rows are lost, once.
    std::fs::remove_file(dir.path().join("run_parameters.csv")).unwrap();
    same_second.set(true);
    report(&mut s, 2, 3).unwrap();
    assert!(!dir.path().join("run_parameters.csv").exists());
    same_second.set(false);
    assert!(report(&mut s, 2, 4).is_err());
    assert_eq!(parameter_sets(dir.path()), [((2, 4), per_set - 1)]);
    report(&mut s, 2, 5).unwrap();
    report(&mut s, 2, 6).unwrap();
    // A changed gradient's bytes: a new set, the latest the runs' reader takes.
    let mut v = s.variables.to_vec();
    v[1].grad_bytes = Some(4096);
    s.variables = v.into();
    report(&mut s, 2, 7).unwrap();
    report(&mut s, 2, 8).unwrap();
    assert_eq!(
        parameter_sets(dir.path()),
        [((2, 4), per_set - 1), ((2, 7), per_set - 1)]
    );
    let run = crate::runs::Run::open(dir.path().join("run")).unwrap();
    let last = run.last_parameters();
    assert_eq!(last.len(), per_set - 1);
    assert_eq!(last["layer2.weight grad"], 4096);
    assert_eq!(last["layer3.weight"], 3 * 1024);
    assert!(!last.contains_key("layer3.weight grad"));
}

#[test]
fn cuda_runs_add_the_allocator_columns_and_cpu_runs_do_not() {
    let (h, _) = summary(&stats("cpu", None));
    assert_eq!(h.last().unwrap(), "backward_passes");
    assert!(!h.iter().any(|c| c.starts_with("cuda_")));

    let c = crate::report::terminal::tests::cuda_stats(1 << 20);
    let (h, row) = summary(&stats("cuda:0", Some(c)));
    let cuda: Vec<&str> = h
        .iter()
        .map(String::as_str)
        .filter(|c| c.starts_with("cuda_"))
        .collect();
    assert_eq!(
        cuda,
        [
            "cuda_allocated_bytes",
            "cuda_peak_allocated_bytes",
            "cuda_reserved_bytes",
            "cuda_peak_reserved_bytes",
            "cuda_active_bytes",
            "cuda_peak_active_bytes",
            "cuda_requested_bytes",
            "cuda_peak_requested_bytes",
            "cuda_alloc_retries",
            "cuda_ooms",
            "cuda_device_free_bytes",
            "cuda_device_total_bytes",
            "cuda_blas_workspaces_bytes",
        ]
    );
    let at = |name: &str| row[h.iter().position(|c| c == name).unwrap()].clone();
    assert_eq!(at("cuda_reserved_bytes"), (4 << 20).to_string());
    assert_eq!(
        at("cuda_peak_requested_bytes"),
        ((2 << 20) - 100).to_string()
    );
    assert_eq!(at("cuda_ooms"), "1");
    assert_eq!(h.len(), row.len());

    // Statistics that could not be read: the same columns, empty.
    let (h2, row2) = summary(&stats("cuda:0", None));
    assert_eq!(h2, h);
    assert_eq!(row2[h2.iter().position(|c| c == "cuda_ooms").unwrap()], "");
}

/// A summary row's line is the row serde writes, byte for byte: a CPU row (no CUDA
/// columns), CUDA rows with every statistic, with none (empty fields) and with some,
/// numbers at their extremes; text that needs quoting is left to serde.
#[test]
fn summary_lines_are_what_serde_writes() {
    let cpu = SummaryRow {
        timestamp: "2026-12-07 06:31:07.123".into(),
        epoch: 1,
        iteration: 2,
        device: "cpu".into(),
        allocated_bytes: 3,
        peak_allocated_bytes: 4,
        reserved_bytes: 5,
        peak_reserved_bytes: 6,
        weights_bytes: 7,
        buffers_bytes: 8,
        gradients_bytes: 9,
        feature_maps_bytes: 10,
        intermediate_gradients_bytes: 11,
        optimizer_state_bytes: 12,
        other_bytes: 13,
        step: 14,
        backward_passes: 15,
        ..SummaryRow::default()
    };
    let mut cuda = SummaryRow {
        device: "cuda:0".into(),
        allocated_bytes: u64::MAX,
        step: 0,
        ..cpu.clone()
    };
    let columns = |r: &mut SummaryRow| {
        [
            &mut r.cuda_allocated_bytes,
            &mut r.cuda_peak_allocated_bytes,
            &mut r.cuda_reserved_bytes,
            &mut r.cuda_peak_reserved_bytes,
            &mut r.cuda_active_bytes,
            &mut r.cuda_peak_active_bytes,
            &mut r.cuda_requested_bytes,
            &mut r.cuda_peak_requested_bytes,
            &mut r.cuda_alloc_retries,
            &mut r.cuda_ooms,
            &mut r.cuda_device_free_bytes,
            &mut r.cuda_device_total_bytes,
            &mut r.cuda_blas_workspaces_bytes,
        ]
        .into_iter()
        .enumerate()
        .for_each(|(i, c)| *c = Some(Some(i as i64 * 1_000_003 - 2)))
    };
    columns(&mut cuda);
    cuda.cuda_ooms = Some(Some(i64::MIN));
    cuda.cuda_device_total_bytes = Some(Some(i64::MAX));
    let mut unread = cuda.clone();
    for c in [
        &mut unread.cuda_allocated_bytes,
        &mut unread.cuda_peak_allocated_bytes,
        &mut unread.cuda_reserved_bytes,
        &mut unread.cuda_peak_reserved_bytes,
        &mut unread.cuda_active_bytes,
        &mut unread.cuda_peak_active_bytes,
        &mut unread.cuda_requested_bytes,
        &mut unread.cuda_peak_requested_bytes,
        &mut unread.cuda_alloc_retries,
        &mut unread.cuda_ooms,
        &mut unread.cuda_device_free_bytes,
        &mut unread.cuda_device_total_bytes,
    ] {
        *c = Some(None);
    }
    let mut some = cuda.clone();
    some.cuda_reserved_bytes = Some(None);
    let quoted = SummaryRow {
        timestamp: "a \"quoted\", timestamp".into(),
        device: "odd,device\nname".into(),
        ..cpu.clone()
    };
    let mut line = Vec::new();
    for row in [cpu.clone(), cuda, unread, some] {
        let mut serde = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        serde.serialize(&row).unwrap();
        let serde = serde.into_inner().unwrap();
        assert!(summary_line(&mut line, &row));
        assert_eq!(
            String::from_utf8(line.clone()).unwrap(),
            String::from_utf8(serde).unwrap(),
            "{row:?}"
        );
    }
    assert!(!summary_line(&mut line, &quoted));
    let mut device = cpu.clone();
    device.device = "cpu\"".into();
    assert!(!summary_line(&mut line, &device));
}

/// Through the sink: a run's first summary row is serde's (with the header), the next
/// ones lines; the same iteration reported twice in the same millisecond gives the same
/// row twice, on the CPU and on CUDA (with and without the allocator's statistics).
#[test]
fn a_runs_summary_rows_after_the_first_are_the_first_ones() {
    let at = std::time::Duration::new(1_780_000_000, 123_000_000);
    for (device, cuda) in [
        ("cpu", None),
        (
            "cuda:0",
            Some(crate::cuda::CudaStats {
                allocated_current: 1,
                allocated_peak: 2,
                reserved_current: 3,
                reserved_peak: 4,
                active_current: 5,
                active_peak: 6,
                requested_current: 7,
                requested_peak: 8,
                alloc_retries: 9,
                ooms: 10,
                free_bytes: 11,
                total_bytes: 12,
            }),
        ),
        ("cuda:1", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut r = CsvReport::new(dir.path(), "run", false, device == "cpu");
        let mut s = stats(device, cuda);
        s.allocated_bytes = 123_456_789;
        s.peak_reserved_bytes = u64::MAX;
        for _ in 0..3 {
            r.iteration_at(&s, at, 0).unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join("run_summary.csv")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[1], lines[2], "{device}");
        assert_eq!(lines[1], lines[3], "{device}");
        assert!(lines[1].contains(",123456789,"), "{}", lines[1]);
        // Read back, each row holds the statistics (the reader takes serde's columns).
        let run = crate::runs::Run::open(dir.path().join("run")).unwrap();
        assert_eq!(run.summary.len(), 3);
        for row in &run.summary {
            assert_eq!(row.peak_reserved_bytes, u64::MAX);
            let cuda = s.cuda.as_ref();
            assert_eq!(row.cuda_ooms.flatten(), cuda.map(|c| c.ooms), "{device}");
            assert_eq!(
                row.cuda_device_free_bytes.flatten(),
                cuda.map(|c| c.free_bytes)
            );
            assert_eq!(
                row.cuda_peak_requested_bytes.flatten(),
                cuda.map(|c| c.requested_peak)
            );
        }
    }
}

/// A summary file (and the wide one) deleted mid-run: the first report of a later second
/// (of the run's own clock: the wall clock's may stand still) recreates each with its
/// header (on the CPU the resident columns' names) and the report's row, and says the
/// earlier rows are lost, once; the rows after it are the same lines.
#[test]
fn a_deleted_summary_file_comes_back_with_its_header() {
    let at = std::time::Duration::new(1_780_000_000, 5_000_000);
    for device in ["cpu", "cuda:0"] {
        let dir = tempfile::tempdir().unwrap();
        let mut r = CsvReport::new(dir.path(), "run", true, device == "cpu");
        let s = stats(device, None);
        r.iteration_at(&s, at, 0).unwrap();
        let summary = dir.path().join("run_summary.csv");
        let wide = dir.path().join("run_wide.csv");
        let header = |p: &std::path::Path| {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines().next().unwrap().to_string()
        };
        let (summary_header, wide_header) = (header(&summary), header(&wide));
        assert_eq!(
            summary_header.contains("resident_bytes"),
            device == "cpu",
            "{summary_header}"
        );
        std::fs::remove_file(&summary).unwrap();
        std::fs::remove_file(&wide).unwrap();
        // The same second: not seen (the row goes with the deleted file).
        r.iteration_at(&s, at, 0).unwrap();
        assert!(!summary.exists());
        let e = r.iteration_at(&s, at, 1).unwrap_err().to_string();
        assert!(e.contains("earlier rows are lost"), "{e}");
        r.iteration_at(&s, at, 1).unwrap();
        r.iteration_at(&s, at, 2).unwrap();
        for (path, first) in [(&summary, &summary_header), (&wide, &wide_header)] {
            let text = std::fs::read_to_string(path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 4, "{text}");
            assert_eq!(lines[0], first.as_str(), "{}", path.display());
            assert_eq!(lines[1], lines[2]);
            assert_eq!(lines[1], lines[3]);
        }
    }
}
