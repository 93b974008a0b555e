//! The CSV sink's tests (a child module of `report/csv.rs`, kept in a file of its own).

use super::*;
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
/// serde writes of each iteration, byte for byte: a list kept across iterations
/// (only the timestamp, epoch and iteration new), then a new list (a new gradient, a
/// shape and a name that need quoting).
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
    for s in &iterations {
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
