//! The out-of-memory report exists even when the loop dies right after the error: tch's
//! non-`f_` methods panic on it, and most training loops do not catch that. A child
//! process (this test binary, re-run) trains, then allocates what cannot be had with
//! `Tensor::empty` and panics out of its loop; the parent reads the files it left.

mod common;

use std::process::{Command, Stdio};

use common::*;
use tch::{nn, nn::OptimizerConfig, Device, Kind, Tensor};

const CHILD_DIR: &str = "TCH_MEMPROF_OOM_CHILD_DIR";

#[test]
#[ignore = "helper process for the report_survives_a_loop_that_panics test"]
fn child_loop_that_panics_on_oom() {
    let dir = std::env::var(CHILD_DIR).expect("started by the parent test");
    let vs = nn::VarStore::new(Device::Cpu);
    let net = tiny_mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut p = tch_memprof::MemoryProfiler::builder(&vs)
        .print(true)
        .csv_dir(&dir)
        .build()
        .unwrap();
    tiny_step(&net, &mut opt);
    p.record_stats();
    // 2^46 floats (256 TiB): the allocation fails and tch panics.
    let _huge = Tensor::empty([1i64 << 46], (Kind::Float, Device::Cpu));
    unreachable!("the allocation cannot succeed");
}

#[test]
fn report_survives_a_loop_that_panics() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_loop_that_panics_on_oom",
            "--nocapture",
        ])
        .env(CHILD_DIR, dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the child must die of the panic");
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let report = files
        .iter()
        .find(|p| p.to_string_lossy().ends_with("_oom1.txt"))
        .unwrap_or_else(|| panic!("no report among {files:?}; child stdout:\n{stdout}"));
    let text = std::fs::read_to_string(report).unwrap();
    assert!(
        text.contains("OUT OF MEMORY on cpu during step 2"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} B", 4u64 << 46)) || text.contains("256.00 TiB"),
        "{text}"
    );
    assert!(
        files
            .iter()
            .any(|p| p.to_string_lossy().ends_with("_oom1.pickle")),
        "{files:?}"
    );
    // Printed before the panic, through the unlocked writer.
    assert!(stdout.contains("OUT OF MEMORY on cpu"), "{stdout}");
}
