//! A snapshot written by the profiler on the CPU loads in PyTorch's own viewer code
//! (`torch.cuda._memory_viz`: segsum, trace, memory, segments, trace_plot,
//! segment_plot) and shows the same bytes as the allocator's counter.
//!
//! Needs the Python of the pinned torch wheel (the one `scripts/with-libtorch.sh`
//! provisions); prints `NOT RUN: ...` when LIBTORCH is not inside such an environment
//! (and fails when `CI` is set).

mod common;

use std::process::Command;

use common::*;
use tch::{nn, nn::OptimizerConfig, Device};
use tch_memprof::MemoryProfiler;

const VIEWER_CHECK: &str = r#"
import pickle, sys
from torch.cuda import _memory_viz as mv

with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
summary = mv.segsum(data)                     # asserts its own byte accounting
trace = mv.trace(data)
flame = mv.memory(data, format_flamegraph=lambda lines: lines)
segs = mv.segments(data, format_flamegraph=lambda lines: lines)
html = mv.trace_plot(data) + mv.segment_plot(data)
active = sum(mv.calc_active(s) for s in data["segments"])
live = 0
for e in data["device_traces"][0]:
    if e["action"] == "alloc":
        live += e["size"]
    elif e["action"] == "free_completed":
        live -= e["size"]
layers = sorted({b["frames"][0]["filename"] for s in data["segments"] for b in s["blocks"]})
print("active", active)
print("trace_delta", live)
print("trace_entries", len(data["device_traces"][0]))
print("layers", ",".join(layers))
print("html_bytes", len(html))
"#;

#[test]
fn a_cpu_snapshot_loads_in_pytorchs_viewer_with_the_allocators_bytes() {
    let _serial = common::serial();
    let Some(python) = torch_python() else {
        cannot_run(
            "the snapshot in PyTorch's viewer: no Python with torch beside LIBTORCH \
             (run through scripts/with-libtorch.sh)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = mlp(&vs);
    let mut opt = nn::Adam::default().build(&vs, 1e-4).unwrap();
    let live = tch_memprof::__private::cpu_live_bytes;
    let at_build = live();
    let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    train_step(&net, &mut opt); // Adam state appears: not in the history
    profiler.record_stats();
    let at_history_start = live();
    profiler.start_memory_history(100_000).unwrap();
    for _ in 0..2 {
        train_step(&net, &mut opt);
        profiler.record_stats();
    }
    let kept = common::batch(); // alive at the snapshot, born inside the history
    let path = dir.path().join("cpu_snapshot.pickle");
    profiler.write_memory_snapshot(&path).unwrap();
    let at_snapshot = live();
    drop(kept);

    let script = dir.path().join("check.py");
    std::fs::write(&script, VIEWER_CHECK).unwrap();
    let out = Command::new(&python)
        .arg(&script)
        .arg(&path)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("viewer check:\n{stdout}");
    assert!(
        out.status.success(),
        "the viewer code failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = |key: &str| -> String {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or_else(|| panic!("{key} missing in:\n{stdout}"))
            .to_string()
    };
    let int = |key: &str| value(key).parse::<i64>().unwrap();
    // Segments: every block born since the profiler was built and still alive.
    assert_eq!(int("active"), at_snapshot - at_build);
    // The trace: births minus deaths since the history started.
    assert_eq!(int("trace_delta"), at_snapshot - at_history_start);
    assert!(int("trace_entries") > 0);
    assert!(int("html_bytes") > 10_000);
    // Frames name the layers: Adam state and gradients of l1 and l2, the batch (none).
    let layers = value("layers");
    for l in ["l1", "l2", "(none)"] {
        assert!(layers.split(',').any(|x| x == l), "{l} not in {layers}");
    }
}

#[test]
fn history_settings_are_checked() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let mut profiler = MemoryProfiler::builder(&vs).print(false).build().unwrap();
    let err = profiler.start_memory_history(0).unwrap_err();
    assert!(err.to_string().contains("max_entries = 0"), "{err}");
    let err = profiler
        .write_cuda_allocator_snapshot("never.pickle")
        .unwrap_err();
    assert!(err.to_string().contains("needs a CUDA VarStore"), "{err}");
    assert!(!std::path::Path::new("never.pickle").exists());
}
