//! `scripts/eager_capture.py`: a PyTorch model's eager training step captured without a
//! GPU (fake tensors), replayed through the model of the caching allocator with the GPU's
//! cuBLAS workspaces, held to the eager runs an NVIDIA H200 measured of the same steps
//! (`tests/data/gpu-truth/h200-2026-12-04/ranks/measured.csv`, the `single` cases: GPT-2
//! small and SmolLM2-135M of transformers at 4x1024, ViT-B/16 at 32x3x224x224, AdamW).

mod common;

use std::path::Path;

use tch_memprof::estimate::recorded::Recording;
use tch_memprof::estimate::{AllocatorConfig, Gpu};

/// The claims of docs/replay.md ("A step captured without a GPU"): the peak allocated
/// within 0.1% of the measured one, the peak reserved within 1%.
const ALLOCATED: f64 = 0.001;
const RESERVED: f64 = 0.01;

/// The H200's peaks (allocated, reserved) of `single.{model}`.
fn measured(model: &str) -> (u64, u64) {
    let case = format!("single.{model}");
    measured_cases(|c| c == case)[0].1
}

/// Each measured case whose name `keep` takes, with its peaks (allocated, reserved).
fn measured_cases(keep: impl Fn(&str) -> bool) -> Vec<(String, (u64, u64))> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu-truth/h200-2026-12-04/ranks/measured.csv");
    let mut reader = csv::Reader::from_path(path).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
    let (case, a, r) = (
        col("case"),
        col("measured_allocated"),
        col("measured_reserved"),
    );
    let found: Vec<_> = reader
        .records()
        .map(|row| row.unwrap())
        .filter(|row| keep(&row[case]))
        .map(|row| {
            (
                row[case].to_string(),
                (row[a].parse().unwrap(), row[r].parse().unwrap()),
            )
        })
        .collect();
    assert!(!found.is_empty(), "no such case measured");
    found
}

/// `scripts/eager_capture.py` run with `args`.
fn capture(python: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/eager_capture.py"))
        .args(args)
        .output()
        .unwrap()
}

/// Captures `args` (eager_capture.py's) into `out` and replays it under the default
/// allocator settings on an H200: the peaks (allocated, reserved).
fn capture_and_replay(python: &str, args: &[String], out: &Path) -> (u64, u64) {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend(["--out", out.to_str().unwrap()]);
    let run = capture(python, &all);
    assert!(
        run.status.success(),
        "{args:?}: {}",
        common::text(&run.stderr)
    );
    let mut recording = Recording::read(out, 0).unwrap();
    assert!(recording.captured(), "{args:?}: no cuBLAS call captured");
    recording.gpu = Some(Gpu::named("h200").unwrap());
    let replayed = recording.replay(&AllocatorConfig::default()).replayed;
    (replayed.allocated, replayed.reserved)
}

/// The corpus's Python for `test` (this file's), where the libtorch is the one the
/// H200's runs used (else the test is skipped by name, tests/data/version-keyed.txt).
fn corpus_python(test: &str, what: &str) -> Option<String> {
    if !common::on_the_measured_libtorch(&format!("eager_capture::{test}")) {
        return None;
    }
    common::corpus_python(what)
}

/// How far `ours` is from `truth`, allocated and reserved, as shares of the truth's.
fn off(ours: Peaks, truth: Peaks) -> (f64, f64) {
    (
        ours.0 as f64 / truth.0 as f64 - 1.0,
        ours.1 as f64 / truth.1 as f64 - 1.0,
    )
}

#[test]
fn captured_eager_steps_replay_to_the_peaks_an_h200_measured() {
    let Some(python) = corpus_python(
        "captured_eager_steps_replay_to_the_peaks_an_h200_measured",
        "the eager captures",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for model in ["hf_gpt2", "hf_smollm2_135m", "hf_vit_base"] {
        let out = dir.path().join(format!("{model}.csv"));
        let args = ["--model".to_string(), model.to_string()];
        let (replayed_allocated, replayed_reserved) = capture_and_replay(&python, &args, &out);
        let (allocated, reserved) = measured(model);
        let (off_a, off_r) = off(
            (replayed_allocated, replayed_reserved),
            (allocated, reserved),
        );
        println!(
            "{model}: allocated {replayed_allocated} against {allocated} ({:+.3}%), reserved {replayed_reserved} against {reserved} ({:+.2}%)",
            100.0 * off_a,
            100.0 * off_r
        );
        if off_a.abs() > ALLOCATED || off_r.abs() > RESERVED {
            failures.push(model);
        }
    }
    assert!(failures.is_empty(), "outside the claims: {failures:?}");
}

/// Peaks (allocated, reserved).
type Peaks = (u64, u64);

/// The claims of docs/replay.md for the ranks of FSDP2 and DDP, as for one GPU: every
/// rank within 0.1% allocated and 1% reserved.
const RANK_ALLOCATED: f64 = 0.001;
const RANK_RESERVED: f64 = 0.01;

/// The capture's arguments of a measured case: `fsdp2.MODEL.wN.rK.PRECISION.RESHARD` or
/// `ddp.MODEL.wN.rK.f32.view|copy`.
fn capture_args(case: &str) -> Vec<String> {
    let p: Vec<&str> = case.split('.').collect();
    let mut args = vec![
        "--model".to_string(),
        p[1].to_string(),
        format!("--{}", p[0].trim_end_matches('2')),
        p[2][1..].to_string(),
        "--rank".to_string(),
        p[3][1..].to_string(),
    ];
    let flags = [
        (p[4] == "bf16", "--bf16"),
        (p[5] == "keep", "--keep"),
        (p[5] == "view", "--bucket-view"),
    ];
    args.extend(
        flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| f.to_string()),
    );
    args
}

/// Every rank of FSDP2 and DDP the H200 measured (`fsdp2.*` in measured.csv: GPT-2,
/// SmolLM2-135M and ViT-B/16 at N = 2, 4, 8, ranks 0 and N-1, f32 and bf16 mixed
/// precision, resharded and kept; `ddp.*`: GPT-2 and SmolLM2 at N = 2, ViT-B/16 at N = 4,
/// gradients copied into the buckets or views of them), captured with PyTorch's own
/// `fully_shard` and `DistributedDataParallel` over its fake process group on fake
/// tensors, two at a time.
#[test]
fn captured_fsdp2_and_ddp_ranks_replay_to_the_peaks_an_h200_measured() {
    let Some(python) = corpus_python(
        "captured_fsdp2_and_ddp_ranks_replay_to_the_peaks_an_h200_measured",
        "the FSDP2 and DDP captures",
    ) else {
        return;
    };
    let cases = measured_cases(|c| c.starts_with("fsdp2.") || c.starts_with("ddp."));
    let ddp = cases.iter().filter(|(c, _)| c.starts_with("ddp.")).count();
    assert!(
        cases.len() - ddp >= 30 && ddp >= 5,
        "{} cases only",
        cases.len()
    );
    let dir = tempfile::tempdir().unwrap();
    let results: Vec<(String, Peaks, Peaks)> = std::thread::scope(|scope| {
        let chunks: Vec<Vec<_>> = (0..2)
            .map(|i| cases.iter().skip(i).step_by(2).cloned().collect())
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| {
                let (python, dir) = (&python, dir.path());
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(case, truth)| {
                            let out = dir.join(format!("rank{i}.csv"));
                            let ours = capture_and_replay(python, &capture_args(&case), &out);
                            (case, truth, ours)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut failures = Vec::new();
    for (case, (allocated, reserved), (ours_a, ours_r)) in &results {
        let (off_a, off_r) = off((*ours_a, *ours_r), (*allocated, *reserved));
        println!(
            "{case}: allocated {:+.3}%, reserved {:+.2}%",
            100.0 * off_a,
            100.0 * off_r
        );
        if off_a.abs() > RANK_ALLOCATED || off_r.abs() > RANK_RESERVED {
            failures.push(case.clone());
        }
    }
    assert_eq!(results.len(), cases.len());
    assert!(failures.is_empty(), "outside the claims: {failures:?}");
}

/// The capture's bad arguments are one line on standard error and exit status 2, before
/// any model is built.
#[test]
fn the_captures_bad_arguments_are_one_line() {
    let Some(python) = common::corpus_python("the capture's bad arguments") else {
        return;
    };
    for (args, why) in [
        (
            &["--out", "x.csv"][..],
            "--model NAME and --out FILE are needed",
        ),
        (
            &["--model", "nope", "--out", "x.csv"],
            "--model nope: not a model",
        ),
        (
            &[
                "--model", "hf_gpt2", "--out", "x.csv", "--fsdp", "2", "--ddp", "2",
            ],
            "one sharding at a time",
        ),
        (
            &["--model", "hf_gpt2", "--out", "x.csv", "--bucket-view"],
            "give --ddp N",
        ),
        (
            &[
                "--model", "hf_gpt2", "--out", "x.csv", "--ddp", "2", "--rank", "2",
            ],
            "--rank 2: not a rank of --ddp 2",
        ),
        (
            &["--model", "hf_gpt2", "--out", "x.csv", "--fsdp", "two"],
            "--fsdp two: not a whole number",
        ),
        (
            &["--model", "hf_gpt2", "--out", "x.csv", "--steps", "0"],
            "--steps 0: at least 1",
        ),
    ] {
        let run = capture(&python, args);
        let err = common::text(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(why) && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

/// The capture's list of the ops CUDA runs on cuBLAS is the dry run's
/// (`src/native/dryrun/trace.cpp`, `is_cublas_op`): one rule, two languages.
#[test]
fn the_capture_takes_the_dry_runs_cublas_ops() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let quoted = |text: &str, from: &str, to: &str| -> Vec<String> {
        let start = text.find(from).unwrap_or_else(|| panic!("{from}"));
        let end = start + text[start..].find(to).unwrap();
        text[start..end]
            .split('"')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let cpp = std::fs::read_to_string(root.join("src/native/dryrun/trace.cpp")).unwrap();
    let py = std::fs::read_to_string(root.join("scripts/eager_capture.py")).unwrap();
    let ours = quoted(&cpp, "static const char* const kOps[] = {", "};");
    let theirs = quoted(&py, "CUBLAS_OPS = (", ")\n");
    assert!(ours.len() >= 10, "{ours:?}");
    assert_eq!(ours, theirs);
}

/// A captured history's workspace rows through `replay`: each thread's cuBLAS workspace
/// once (the training thread's, the autograd engine's), cuBLASLt's after the cuBLAS one,
/// at the size of the GPU `--memory` names (PyTorch 2.11: 32 MiB on Hopper;
/// `:4096:2:16:8`, 8,519,680 bytes, before it; cuBLASLt 1 MiB), by hand.
#[test]
fn a_captured_historys_workspaces_are_the_named_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("captured.csv");
    std::fs::write(
        &path,
        "seq,action,addr,size,stream,frame,phase\n\
         0,alloc,4096,1048576,0,aten::empty,\n\
         1,workspace,0,0,0,,\n\
         2,workspace,0,0,0,,\n\
         3,workspace_lt,0,0,0,,backward\n\
         4,free_completed,4096,1048576,0,,\n",
    )
    .unwrap();
    const MIB: u64 = 1 << 20;
    for (gpu, cublas) in [("h100", 32 * MIB), ("a100", 8_519_680)] {
        let out = common::cli(&[
            "replay",
            path.to_str().unwrap(),
            "--memory",
            gpu,
            "--csv",
            "--alloc-conf",
            "expandable_segments:False",
        ]);
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        let text = common::text(&out.stdout);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip(1)
            .map(|l| l.split(',').collect())
            .collect();
        // The capture's own row: the block alone, no segment.
        assert_eq!(rows[0][..3], ["captured", "1048576", "0"], "{text}");
        // The forward's one cuBLAS workspace (two calls), then backward's cuBLAS and
        // cuBLASLt ones, beside the block.
        let want = MIB + cublas + cublas + MIB;
        assert_eq!(rows[1][1], want.to_string(), "{gpu}: {text}");
    }
}

/// Models the capture was never tuned on (the held-out set an H200 measured eagerly,
/// `tests/data/gpu-truth/h200-2026-11-27/held-out.csv`, two AdamW training steps), with
/// the claims of docs/replay.md: decoders of transformers (Pythia-160M, a small Mistral)
/// within 0.1% allocated and 1% reserved, MLP-Mixer-B/16 within 0.5% and 1%; the
/// convolution nets under, by what cuDNN's workspaces take (not captured): ResNet-18 and
/// MobileNetV2 within 2% allocated and up to 16% under reserved. OPT-125M reads its
/// attention mask's values, which fake tensors have not: refused in one line, exit 1.
#[test]
fn captured_held_out_models_against_an_h200() {
    let Some(python) = corpus_python(
        "captured_held_out_models_against_an_h200",
        "the held-out captures",
    ) else {
        return;
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu-truth/h200-2026-11-27/held-out.csv");
    let mut reader = csv::Reader::from_path(path).unwrap();
    let truth: Vec<(String, (u64, u64))> = reader
        .records()
        .map(|r| r.unwrap())
        .filter(|r| &r[1] == "train")
        .map(|r| {
            (
                r[0].to_string(),
                (r[4].parse().unwrap(), r[5].parse().unwrap()),
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    // (model, allocated within, reserved under, reserved over)
    for (model, a, r_under, r_over) in [
        ("hf_pythia_160m", 0.001, 0.01, 0.01),
        ("hf_mistral_tiny", 0.001, 0.01, 0.01),
        ("timm_mixer_b16_224", 0.005, 0.01, 0.01),
        ("tv_resnet18", 0.02, 0.16, 0.01),
        ("tv_mobilenet_v2", 0.02, 0.16, 0.01),
    ] {
        let measured = truth.iter().find(|(m, _)| m == model).unwrap().1;
        let out = dir.path().join(format!("{model}.csv"));
        let args = ["--model".to_string(), model.to_string()];
        let ours = capture_and_replay(&python, &args, &out);
        let (off_a, off_r) = off(ours, measured);
        println!(
            "{model}: allocated {:+.2}%, reserved {:+.2}%",
            100.0 * off_a,
            100.0 * off_r
        );
        if off_a.abs() > a || !(-r_under..=r_over).contains(&off_r) {
            failures.push(model);
        }
    }
    assert!(failures.is_empty(), "outside the claims: {failures:?}");
    let opt = dir.path().join("opt.csv");
    let run = capture(
        &python,
        &["--model", "hf_opt_125m", "--out", opt.to_str().unwrap()],
    );
    let err = common::text(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains("reads a tensor's values") && err.trim().lines().count() == 1,
        "{err}"
    );
}
