//! `tch-memprof estimate` and `tch-memprof profile` as a user runs them: CSV that
//! matches the library, TorchScript files exported by PyTorch, bad input as one line
//! and exit status 2.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tch::Kind;
use tch_memprof::estimate::{Input, Mode, Model, Options};

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .args(args)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .output()
        .expect("runs tch-memprof")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn csv_rows_are_the_librarys_estimates() {
    let _serial = common::serial();
    let out = cli(&[
        "estimate",
        "--model",
        "mobilenet_v3_small",
        "--batch-sizes",
        "1,4",
        "--csv",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "model,batch,mode,weights_bytes,peak_allocated_bytes,peak_reserved_bytes"
    );
    assert_eq!(lines.len(), 3, "{stdout}");
    let model = Model::builtin("mobilenet_v3_small").unwrap();
    for (line, b) in lines[1..].iter().zip([1i64, 4]) {
        let e = model
            .estimate(
                &[Input::new(&[b, 3, 224, 224], Kind::Float)],
                Mode::Inference,
                &Options::default(),
            )
            .unwrap();
        assert_eq!(
            *line,
            format!(
                "mobilenet_v3_small,{b},inference,{},{},{}",
                e.weights_bytes, e.peak_allocated, e.peak_reserved
            )
        );
    }
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let _serial = common::serial();
    let cases: [&[&str]; 8] = [
        &[
            "estimate",
            "/nonexistent/model.pt",
            "--input",
            "1x3x224x224",
        ],
        &["estimate", "--model", "resnet9000"],
        &[
            "estimate",
            "--model",
            "resnet18",
            "--input",
            "1x3x224x224:f8",
        ],
        &["estimate", "--model", "resnet18", "--input", "1x3xx224"],
        &["estimate", "--model", "resnet18", "--input", "1x1x224x224"],
        &[
            "estimate",
            "--model",
            "resnet18",
            "--train",
            "--optimizer",
            "lion",
        ],
        &["estimate", "--model", "resnet18", "--memory", "12 parsecs"],
        &["profile", "/nonexistent/model.pt", "--input", "1x3x32x32"],
    ];
    for args in cases {
        let out = cli(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("tch-memprof: "), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{err}"
        );
    }
    let out = cli(&["estimate", "--model", "resnet18", "--input", "1x1x224x224"]);
    let err = text(&out.stderr);
    assert!(err.contains("forward pass failed"), "{err}");
}

/// A small CNN exported by PyTorch with torch.jit.trace; prints its parameter and
/// buffer bytes (as PyTorch counts them).
const EXPORT: &str = r#"
import sys, torch
from torch import nn
m = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
    nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 16 * 16, 10)).eval()
t = torch.jit.trace(m, torch.randn(2, 3, 32, 32))
t.save(sys.argv[1])
print(sum(p.numel() * p.element_size() for p in list(m.parameters()) + list(m.buffers())))
"#;

fn export(dir: &Path) -> Option<(PathBuf, u64)> {
    let Some(python) = common::torch_python() else {
        common::cannot_run(
            "the TorchScript export by PyTorch: no Python with torch beside LIBTORCH \
             (run through scripts/with-libtorch.sh)",
        );
        return None;
    };
    let path = dir.join("cnn.pt");
    let out = Command::new(python)
        .args(["-c", EXPORT, path.to_str().unwrap()])
        .output()
        .expect("runs python");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = text(&out.stdout).trim().parse().unwrap();
    Some((path, bytes))
}

#[test]
fn a_torchscript_file_is_estimated_and_profiled() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let Some((pt, weight_bytes)) = export(dir.path()) else {
        return;
    };
    let model = Model::torchscript(&pt).unwrap();
    assert_eq!(model.weights_bytes(), weight_bytes);
    let input = [Input::new(&[8, 3, 32, 32], Kind::Float)];
    let inference = model
        .estimate(&input, Mode::Inference, &Options::default())
        .unwrap();
    // The batch alone is 8x3x32x32 floats; the conv output 8x16x32x32 floats is live at
    // the peak beside it.
    assert!(inference.baseline_allocated >= weight_bytes + 8 * 3 * 32 * 32 * 4);
    assert!(inference.peak_allocated >= inference.baseline_allocated + 8 * 16 * 32 * 32 * 4);
    let train = model
        .estimate(
            &input,
            Mode::Train(tch_memprof::estimate::Optimizer::Adam),
            &Options::default(),
        )
        .unwrap();
    // Gradients and Adam's two states come on top of the weights.
    assert!(train.peak_allocated >= inference.baseline_allocated + 3 * weight_bytes);

    let out = cli(&[
        "estimate",
        pt.to_str().unwrap(),
        "--input",
        "8x3x32x32",
        "--train",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("train-adam"));

    let results = dir.path().join("profile");
    let out = cli(&[
        "profile",
        pt.to_str().unwrap(),
        "--input",
        "8x3x32x32",
        "--train",
        "--output-dir",
        results.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in [
        "step.png",
        "step.svg",
        "timeline.csv",
        "layers.csv",
        "summary.txt",
    ] {
        let len = std::fs::metadata(results.join(f))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 0, "{f} missing or empty");
    }
}
