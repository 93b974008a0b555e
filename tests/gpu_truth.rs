//! The estimate held to what a real GPU measured: real-world models from transformers,
//! torchvision and timm, whose CUDA peaks an NVIDIA H200 measured in eager PyTorch 2.11
//! (`tests/data/gpu-truth/h200-2026-11-26/`: the data and how it was measured), rebuilt
//! and traced here as they were there (`scripts/gpu_truth.py`; at batch 1, which gives
//! byte-identical estimates at the measured batch, and traces in a third of the time),
//! each case
//! estimated with `tch-memprof estimate FILE --gpu h200` in its mode (inference; AdamW
//! training; under bf16 autocast; the foreach and fused AdamW steps are estimated as the
//! plain one, whose peaks they match within 0.01% on the GPU).
//!
//! Two kinds of runs, held two ways. The H200's runs of the traced files (what a tch user
//! loading the file runs) are the target the product is held to: every case within what
//! the docs claim ([`TRACED_CLAIMS`]), and within 2% allocated and 3% reserved unless
//! [`KNOWN_TRACED_GAPS`] or [`KNOWN_HELD_OUT_GAPS`] lists it. The eager PyTorch runs are a
//! documented comparison, not the target: a case outside 2% / 3% fails unless
//! [`KNOWN_GAPS`] lists it with the error it has now, and a listed case fails when its
//! error moves by more than half a point either way (update the list and the docs) or
//! meets the target (take it off the list). Each test prints every case with its errors
//! (`cargo test --test gpu_truth -- --nocapture`) and the table by family and mode that
//! docs/estimate.md shows, which [`common::doc_table`] holds to it.
//!
//! The measurements were made with PyTorch 2.11; under another libtorch (the compat
//! suite) the kernels CUDA picks may differ, so the estimates are held under 2.11 only
//! and skipped by name otherwise (`tests/data/version-keyed.txt`). The models are traced a model at a time while the previous one's cases are
//! estimated, and each model's files removed after (all of them, mostly weights, take
//! 11.6 GB; the test prints that and the most on disk at once); `TCH_MEMPROF_CORPUS_CACHE=DIR` keeps them in DIR instead, reused while the
//! script and the packages are the same.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const DATA: &str = "tests/data/gpu-truth/h200-2026-11-26";

/// Allocated and reserved targets, as a share of the measured peak.
const ALLOCATED_TARGET: f64 = 0.02;
const RESERVED_TARGET: f64 = 0.03;

/// Grouped-query attention in f32.
const GQA: &str = "eager transformers skips the causal mask and calls SDPA with enable_gqa, \
                   which CUDA runs on the f32 math path (bmm, the attention weights kept); the \
                   traced file holds the mask and the key/value heads repeated, which the \
                   memory-efficient kernel takes";
/// The same under bf16 autocast (errs high).
const GQA_BF16: &str = "errs high against eager PyTorch: under autocast eager runs cuDNN \
                        attention on the key/value heads as they are, where the traced file \
                        repeats them to the query's heads, and the file's optimized graph \
                        keeps the JIT autocast pass's casts for backward; the H200's run of \
                        the file itself is within the target";
/// Convolution nets' training reserved.
const CONV_RESERVED: &str = "reserved errs high, the safe side: where the pool falls around a \
                             convolution backward's cuDNN workspaces depends on the sizes of \
                             its requests, which are not known one by one (a measured call \
                             gives the most it held at once; an unmeasured one is charged the \
                             larger plausible size), so the estimate takes the largest of its \
                             replays with them as charged, without them, and with every \
                             backward's at the larger plausible size";
/// Convolution nets' inference under against eager PyTorch.
const LOCALS_CONV: &str = "eager PyTorch's run: the H200's run of the traced file is predicted \
                           within the target (its convolutions' workspaces as measured); \
                           probably eager Python's locals, as in ViT (RegNet: the block's \
                           input, held by `proj(x) + f(x)` while f's grouped convolution \
                           runs)";
/// Attention models' inference.
const LOCALS: &str = "probably: eager Python holds a module's locals until its forward \
                      returns, where the TorchScript interpreter frees each value after its \
                      last use (the peak is in the first block's MLP, with the block's \
                      residual and norm outputs still live)";
/// BERT-base's eager inference.
const BERT_INFER: &str = "eager PyTorch's run, not yet explained: the H200's run of the \
                          traced file is predicted within 512 B";
/// Training from the file keeps more than eager PyTorch (errs high against eager).
const EAGER_KEEPS_LESS: &str = "errs high against eager PyTorch: the estimate predicts the \
                                traced file as tch runs it (the TorchScript executor's \
                                optimized graph, whose autodiff subgraphs keep a dropout's \
                                output and mask for backward even at p=0 and, under autocast, \
                                the casts of the JIT's autocast pass), which keeps more; \
                                the H200's run of the file itself is within the target";
/// GPT-2 training errs high.
const GPT2_HIGH: &str = "errs high, not yet explained";

/// Cases outside the target: (model, mode, allocated error %, reserved error %, why), the
/// errors as the estimate has them now (predicted over measured, minus one, in %).
const KNOWN_GAPS: &[(&str, &str, f64, f64, &str)] = &[
    ("hf_bert_base", "infer", -1.26, -3.07, BERT_INFER),
    ("hf_bert_base", "train-bf16", 3.80, 3.26, EAGER_KEEPS_LESS),
    ("hf_gpt2", "train", 2.11, 10.14, GPT2_HIGH),
    ("hf_gpt2", "train-bf16", 5.12, 3.97, EAGER_KEEPS_LESS),
    ("hf_gpt2", "train-foreach", 2.11, 10.14, GPT2_HIGH),
    ("hf_gpt2", "train-fused", 2.11, 10.14, GPT2_HIGH),
    ("hf_qwen2_tiny", "infer", 0.00, -21.87, GQA),
    ("hf_qwen2_tiny", "train", -15.48, -14.80, GQA),
    ("hf_qwen2_tiny", "train-bf16", 6.69, 4.54, GQA_BF16),
    ("hf_smollm2_135m", "infer", 0.00, -15.65, GQA),
    ("hf_smollm2_135m", "train", -22.45, -22.93, GQA),
    ("hf_smollm2_135m", "train-bf16", 12.15, 9.83, GQA_BF16),
    ("hf_smollm2_135m", "train-fused", -22.45, -22.93, GQA),
    ("hf_vit_base", "infer", -14.49, -12.08, LOCALS),
    ("hf_vit_base", "train", 2.31, 3.52, EAGER_KEEPS_LESS),
    ("hf_vit_base", "train-bf16", 9.84, 8.30, EAGER_KEEPS_LESS),
    ("timm_convnextv2_nano", "infer", -11.41, -21.08, LOCALS_CONV),
    (
        "timm_convnextv2_nano",
        "train",
        6.08,
        4.17,
        EAGER_KEEPS_LESS,
    ),
    ("timm_vit_small_patch16_224", "infer", -11.23, 0.00, LOCALS),
    (
        "timm_vit_small_patch16_224",
        "train",
        9.16,
        9.95,
        EAGER_KEEPS_LESS,
    ),
    ("tv_convnext_tiny", "infer", -6.92, 0.00, LOCALS_CONV),
    (
        "tv_convnext_tiny",
        "train-bf16",
        27.14,
        34.16,
        EAGER_KEEPS_LESS,
    ),
    ("tv_efficientnet_b0", "infer", -7.08, -10.00, LOCALS_CONV),
    ("tv_mobilenet_v3_large", "infer", -9.42, -7.30, LOCALS_CONV),
    ("tv_regnet_y_400mf", "infer", -17.37, 0.00, LOCALS_CONV),
    ("tv_resnet50", "infer", -5.52, 0.36, LOCALS_CONV),
    ("tv_swin_t", "infer", -15.38, -8.26, LOCALS),
    ("tv_swin_t", "train", 29.67, 32.03, EAGER_KEEPS_LESS),
];

/// The H200's runs of traced files and of the held-out models.
const TRACED_DATA: &str = "tests/data/gpu-truth/h200-2026-11-27";

/// The traced files' runs outside the target, as [`KNOWN_GAPS`] (rows run from a file
/// traced on the GPU are estimated from the file traced here, on the CPU).
const KNOWN_TRACED_GAPS: &[(&str, &str, f64, f64, &str)] =
    &[("timm_convnextv2_nano", "train", 0.41, 4.12, CONV_RESERVED)];

/// The held-out models' runs outside the target, as [`KNOWN_GAPS`].
const KNOWN_HELD_OUT_GAPS: &[(&str, &str, f64, f64, &str)] = &[
    ("tv_densenet121", "train", -0.05, 3.13, CONV_RESERVED),
    ("tv_mobilenet_v2", "train", -0.00, 5.53, CONV_RESERVED),
    ("tv_resnext50_32x4d", "train", 0.22, 10.49, CONV_RESERVED),
];

struct Measured {
    model: String,
    mode: String,
    input: String,
    allocated: u64,
    reserved: u64,
}

/// The cases of one measured folder (`DATA` unless another GPU's).
fn measured_in(dir: &str) -> Vec<Measured> {
    measured_file(&format!("{dir}/measured.csv"))
}

/// The cases of one measured CSV file.
fn measured_file(file: &str) -> Vec<Measured> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let mut r = csv::Reader::from_path(path).unwrap();
    let h = r.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let (m, md, i, a, rs) = (
        col("model"),
        col("mode"),
        col("input"),
        col("measured_allocated"),
        col("measured_reserved"),
    );
    r.records()
        .map(|row| {
            let row = row.unwrap();
            Measured {
                model: row[m].to_string(),
                mode: row[md].to_string(),
                input: row[i].to_string(),
                allocated: row[a].parse().unwrap(),
                reserved: row[rs].parse().unwrap(),
            }
        })
        .collect()
}

fn measured() -> Vec<Measured> {
    measured_in(DATA)
}

/// A traced file's line of `cases.jsonl` (or of `--paced`'s output): its (model,
/// infer|train) and path.
fn case_file(line: &str) -> ((String, String), PathBuf) {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let text = |k: &str| v[k].as_str().unwrap().to_string();
    ((text("model"), text("mode")), PathBuf::from(text("file")))
}

/// Where traced files are kept between runs: only where `TCH_MEMPROF_CORPUS_CACHE`
/// names a folder (11.6 GB). Unset, or `off`, each model's files are removed once
/// its cases are estimated ([`paced`]).
fn truth_cache() -> Option<PathBuf> {
    match std::env::var_os("TCH_MEMPROF_CORPUS_CACHE") {
        Some(v) if v != "off" && !v.is_empty() => Some(PathBuf::from(v)),
        _ => None,
    }
}

/// Every model's files, by (model, infer|train), from `scripts/gpu_truth.py --cache`.
fn cached(python: &str, cache: &Path) -> BTreeMap<(String, String), PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python)
        .arg(root.join("scripts/gpu_truth.py"))
        .arg("--cache")
        .arg(cache)
        .output()
        .expect("runs scripts/gpu_truth.py");
    assert!(
        out.status.success(),
        "scripts/gpu_truth.py: {}",
        common::text(&out.stderr)
    );
    let entry = PathBuf::from(common::text(&out.stdout).trim());
    let lines = std::fs::read_to_string(entry.join("cases.jsonl")).unwrap();
    lines.lines().map(case_file).collect()
}

/// Traces the models (`names`, or all of them) into `dir` a model at a time
/// (`scripts/gpu_truth.py --paced`), hands each model's files to `each` as soon as they
/// are written, and removes them after: the next model is traced meanwhile, so the disk
/// holds two models' files at most.
fn paced(
    python: &str,
    dir: &Path,
    names: &[&str],
    mut each: impl FnMut(&BTreeMap<(String, String), PathBuf>),
) {
    use std::io::{BufRead, Write};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir).unwrap();
    let log = dir.join("gpu_truth.stderr");
    let mut child = Command::new(python)
        .arg(root.join("scripts/gpu_truth.py"))
        .arg("--paced")
        .arg("--out")
        .arg(dir)
        .args(names)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("runs scripts/gpu_truth.py");
    let mut go = child.stdin.take().unwrap();
    let rows = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut model = BTreeMap::new();
    let (mut most, mut all) = (0, 0);
    for line in rows.lines() {
        let line = line.unwrap();
        if !line.trim().is_empty() {
            let (case, file) = case_file(&line);
            model.insert(case, file);
            continue;
        }
        // A model's files are all written: the next is traced while these are used.
        // (After the last model the script has exited and the pipe is closed.)
        let _ = writeln!(go).and_then(|_| go.flush());
        each(&model);
        // The most the folder holds: this model's files and the next one's, traced
        // meanwhile.
        most = most.max(bytes_under(dir));
        for file in model.values() {
            all += std::fs::metadata(file).map_or(0, |m| m.len());
            let _ = std::fs::remove_file(file);
        }
        model.clear();
    }
    drop(go);
    println!(
        "traced files on disk at most: {:.2} GB, of {:.2} GB traced in all",
        most as f64 / 1e9,
        all as f64 / 1e9
    );
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "scripts/gpu_truth.py: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// What the estimate of one case said.
#[derive(Clone)]
struct Made {
    allocated: u64,
    reserved: u64,
    /// The attention backends of its dry run (the CSV's column).
    attention: String,
    /// It warned that the file was traced on the CPU and stops on a GPU.
    cpu_warning: bool,
}

/// The estimate of one case, or its stderr.
fn estimate(file: &Path, case: &Measured) -> Result<Made, String> {
    let mut args = vec![
        "estimate",
        file.to_str().unwrap(),
        "--input",
        case.input.as_str(),
        "--gpu",
        "h200",
        "--csv",
    ];
    if case.mode.starts_with("train") {
        args.extend(["--train", "--optimizer", "adamw"]);
    }
    if case.mode == "train-bf16" {
        args.extend(["--autocast", "bf16"]);
    }
    let out = common::cli(&args);
    if !out.status.success() {
        return Err(common::text(&out.stderr));
    }
    let text = common::text(&out.stdout);
    let col = |name: &str| common::csv_cell(&text, name);
    Ok(Made {
        allocated: col("peak_allocated_bytes").parse().unwrap(),
        reserved: col("peak_reserved_bytes").parse().unwrap(),
        attention: col("attention"),
        cpu_warning: common::text(&out.stderr).contains("was traced on the CPU"),
    })
}

#[test]
fn the_estimate_is_held_to_the_peaks_an_h200_measured_on_real_world_models() {
    let Some(python) = python_under_2_11(
        "the_estimate_is_held_to_the_peaks_an_h200_measured_on_real_world_models",
    ) else {
        return;
    };
    let cases = measured();
    assert_eq!(cases.len(), 42, "the measured cases");
    hold(&cases, &python, KNOWN_GAPS, None, "gpu-truth-eager");
}

/// The built-in transformers (GPT-2, BERT-base, ViT-B/16, Llama 3.2 1B), estimated with
/// `tch-memprof estimate --model NAME --gpu h200`, against their PyTorch mirrors the H200
/// measured (`builtin-mirrors.csv`, whose README section says how): every case within the
/// target, inference and training, f32 and bf16 autocast, and within what the docs say
/// of them: 0.2% allocated, 2.4% reserved. No Python needed.
#[test]
fn the_builtin_models_estimates_are_held_to_their_mirrors_on_an_h200() {
    let rows = builtin_rows("builtin-mirrors.csv", 16);
    let made = common::in_pairs(&rows, |row| {
        let input = match &row[0] {
            "vit-b16" => row[1].to_string(),
            _ => format!("{}:i64", &row[1]),
        };
        let mut args = vec!["--model", &row[0], "--input", &input];
        if &row[2] == "train" {
            args.extend(["--train", "--optimizer", "adamw"]);
        }
        if &row[3] == "bf16" {
            args.extend(["--autocast", "bf16"]);
        }
        builtin_estimate(&args, "")
    });
    hold_builtin(&rows, &made, 4, BUILTIN_CLAIMS);
}

/// What the docs claim of the built-in models' estimates against their mirrors' runs on
/// an H200, every case: allocated within 0.2%, reserved within 2.4%, in %.
const BUILTIN_CLAIMS: (f64, f64) = (0.2, 2.4);

/// `plan` and `estimate --memory` warn where an answer leaves less than the estimate's
/// error as measured here ([`tch_memprof::estimate::THIN_MARGIN`]): the share covers the
/// most the peak reserved is claimed under a run's, of tch code and of files.
#[test]
fn the_thin_margin_warning_covers_the_measured_error() {
    let margin = 100.0 * tch_memprof::estimate::THIN_MARGIN;
    for (what, under) in [
        ("tch code's reserved", BUILTIN_CLAIMS.1),
        ("files' reserved under", TRACED_CLAIMS.reserved_under),
    ] {
        assert!(
            margin >= under,
            "THIN_MARGIN {margin}% is below {what}: {under}%"
        );
    }
    // docs/plan.md names the share.
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/plan.md"))
        .unwrap();
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let says = format!("plan 1 leaves less than {margin:.1}% of the budget");
    assert!(doc.contains(&says), "docs/plan.md does not say {says:?}");
}

/// GPT-2's training step (AdamW, 8x1024) under each allocator setting `plan` tries and
/// with activation checkpointing of every segment and of every second one, estimated
/// with `PYTORCH_CUDA_ALLOC_CONF` and `--checkpoint`, against the H200's runs of its
/// PyTorch mirror (`builtin-plan-levers.csv`): every case within the target, and within
/// what the docs say: reserved to the byte in five of the six, within 0.15% in the sixth;
/// allocated within 0.02%.
#[test]
fn the_plans_levers_are_held_to_an_h200s_runs_of_them() {
    let rows = builtin_rows("builtin-plan-levers.csv", 6);
    let made = common::in_pairs(&rows, |row| {
        let mut args = vec!["--model", &row[0], "--train", "--optimizer", "adamw"];
        let input = format!("{}:i64", &row[1]);
        args.extend(["--input", &input]);
        if &row[3] != "off" {
            args.extend(["--checkpoint", &row[3]]);
        }
        builtin_estimate(&args, &row[2])
    });
    // docs/gpu-validation.md: reserved exact in five of the six settings (the sixth,
    // expandable segments, -0.15% to two decimals), allocated within 0.02%.
    assert_eq!(hold_builtin(&rows, &made, 4, (0.02, 0.155)), 5);
}

/// The `rows` rows of a CSV file of [`DATA`] (its header aside).
fn builtin_rows(file: &str, rows: usize) -> Vec<csv::StringRecord> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DATA).join(file);
    let mut r = csv::Reader::from_path(path).unwrap();
    let all: Vec<csv::StringRecord> = r.records().map(|row| row.unwrap()).collect();
    assert_eq!(all.len(), rows, "the measured cases of {file}");
    all
}

/// `tch-memprof estimate ARGS --gpu h200 --csv` under `PYTORCH_CUDA_ALLOC_CONF=conf`:
/// (peak allocated, peak reserved).
fn builtin_estimate(args: &[&str], conf: &str) -> (u64, u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .arg("estimate")
        .args(args)
        .args(["--gpu", "h200", "--csv"])
        .env("PYTORCH_CUDA_ALLOC_CONF", conf)
        .output()
        .expect("runs tch-memprof");
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let text = common::text(&out.stdout);
    let col = |name: &str| -> u64 { common::csv_cell(&text, name).parse().unwrap() };
    (col("peak_allocated_bytes"), col("peak_reserved_bytes"))
}

/// Prints each row's errors (its first `key` cells name it; the measured peaks are its
/// last two) and fails on any outside the target or outside `documented` (allocated,
/// reserved, in %: the bounds the docs quote). Returns how many rows have the measured
/// peak reserved to the byte.
fn hold_builtin(
    rows: &[csv::StringRecord],
    made: &[(u64, u64)],
    key: usize,
    documented: (f64, f64),
) -> usize {
    let mut exact_reserved = 0;
    let mut outside = Vec::new();
    println!("{:<48}  alloc err %  resv err %", "case");
    for (row, (allocated, reserved)) in rows.iter().zip(made) {
        let err = |pred: u64, meas: &str| {
            let meas: f64 = meas.parse().unwrap();
            (pred as f64 / meas - 1.0) * 100.0
        };
        let n = row.len();
        let (a, r) = (err(*allocated, &row[n - 2]), err(*reserved, &row[n - 1]));
        exact_reserved += (reserved.to_string() == row[n - 1]) as usize;
        let case: Vec<&str> = row.iter().take(key).collect();
        let case = case.join(" ");
        println!("{case:<48} {a:>+11.2} {r:>+11.2}");
        let target = (ALLOCATED_TARGET * 100.0).min(documented.0);
        let target_reserved = (RESERVED_TARGET * 100.0).min(documented.1);
        if a.abs() > target || r.abs() > target_reserved {
            outside.push(format!("{case}: {a:+.2}%, {r:+.2}%"));
        }
    }
    assert!(
        outside.is_empty(),
        "outside the target or the documented bounds {documented:?}: {outside:?}"
    );
    println!(
        "{exact_reserved} of {} with the peak reserved to the byte",
        rows.len()
    );
    exact_reserved
}

/// The same cases run on the H200 from their traced files (`traced.csv` of
/// `h200-2026-11-27`: what a tch user loading the file runs), against the estimate of
/// the files traced here. Every case's peak allocated is predicted within 2% (the eager
/// runs' inference gaps were Python's, not the program's); the cases outside the target
/// ([`KNOWN_TRACED_GAPS`]) all err high, in the reserved of convolution nets' training,
/// whose backward workspaces are not known request by request.
#[test]
fn the_estimate_is_held_to_the_peaks_of_the_traced_files_run_on_an_h200() {
    hold_file(
        "the_estimate_is_held_to_the_peaks_of_the_traced_files_run_on_an_h200",
        "traced.csv",
        45,
        KNOWN_TRACED_GAPS,
        "gpu-truth-traced",
    );
}

/// Eleven models the estimate was not built on, run on the H200 from their traced files
/// (`held-out-traced.csv` of `h200-2026-11-27`), against the estimate of the files
/// traced here: the estimate's error on code it was not given, as tch users run it.
#[test]
fn the_estimate_is_held_to_the_peaks_of_held_out_models_run_on_an_h200() {
    hold_file(
        "the_estimate_is_held_to_the_peaks_of_held_out_models_run_on_an_h200",
        "held-out-traced.csv",
        22,
        KNOWN_HELD_OUT_GAPS,
        "gpu-truth-held-out",
    );
}

/// The files traced on the CPU that an H200 could not run (`traced.csv`: a case whose
/// file traced on the CPU stopped with "Expected all tensors to be on the same device"
/// ran from a file traced on the GPU, `traced_on` = `cuda`; three inference cases ran
/// both ways), and only those, are the ones whose estimate warns so: the estimate of
/// every case's file traced here, on the CPU, said whether it names the CPU as a device.
#[test]
fn the_estimate_warns_of_exactly_the_files_traced_on_the_cpu_that_a_gpu_could_not_run() {
    let Some(python) = python_under_2_11(
        "the_estimate_warns_of_exactly_the_files_traced_on_the_cpu_that_a_gpu_could_not_run",
    ) else {
        return;
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(TRACED_DATA)
        .join("traced.csv");
    let mut r = csv::Reader::from_path(path).unwrap();
    let h = r.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let (m, md, on) = (col("model"), col("mode"), col("traced_on"));
    let mut ran_from: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for row in r.records() {
        let row = row.unwrap();
        ran_from
            .entry((row[m].to_string(), row[md].to_string()))
            .or_default()
            .push(row[on].to_string());
    }
    let (mut stopped, mut ran, mut wrong) = (0, 0, Vec::new());
    for ((model, mode), traced_on) in &ran_from {
        let failed = !traced_on.iter().any(|t| t == "cpu");
        let made = estimates(&python)[&(model.clone(), mode.clone())]
            .as_ref()
            .unwrap_or_else(|e| panic!("{model} {mode}: the estimate failed: {e}"));
        if made.cpu_warning != failed {
            wrong.push(format!(
                "{model} {mode}: {} from the file traced on the CPU, and the estimate {}",
                if failed { "did not run" } else { "ran" },
                if made.cpu_warning {
                    "warns"
                } else {
                    "does not warn"
                }
            ));
        }
        if failed {
            stopped += 1;
        } else {
            ran += 1;
        }
    }
    println!("{stopped} cases did not run from a file traced on the CPU, {ran} did");
    assert_eq!(
        (stopped, ran),
        (21, 21),
        "the cases of traced.csv by where they ran from"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// [`hold`] on the `runs` cases of one CSV file of [`TRACED_DATA`].
fn hold_file(
    test: &str,
    file: &str,
    runs: usize,
    gaps: &[(&str, &str, f64, f64, &str)],
    table: &str,
) {
    let Some(python) = python_under_2_11(test) else {
        return;
    };
    let cases = measured_file(&format!("{TRACED_DATA}/{file}"));
    assert_eq!(cases.len(), runs, "the runs of {file}");
    hold(&cases, &python, gaps, Some(&TRACED_CLAIMS), table);
}

/// The estimate of every case of the three tests, by (model, mode), made once for them
/// all (most traced runs are the eager cases' model and mode, estimated alike): two at a
/// time (the machine's cores), each in its own process, a model's cases as soon as its
/// files are traced.
fn estimates(python: &str) -> &'static BTreeMap<(String, String), Result<Made, String>> {
    static ESTIMATES: OnceLock<BTreeMap<(String, String), Result<Made, String>>> = OnceLock::new();
    ESTIMATES.get_or_init(|| {
        let mut all = measured();
        all.extend(measured_file(&format!("{TRACED_DATA}/traced.csv")));
        all.extend(measured_file(&format!("{TRACED_DATA}/held-out-traced.csv")));
        let mut seen = std::collections::BTreeSet::new();
        all.retain(|c| seen.insert((c.model.clone(), c.mode.clone())));
        let file_key = |c: &Measured| {
            let kind = if c.mode == "infer" { "infer" } else { "train" };
            (c.model.clone(), kind.to_string())
        };
        let mut results = BTreeMap::new();
        let mut estimate_traced = |files: &BTreeMap<(String, String), PathBuf>| {
            let cases: Vec<&Measured> = all
                .iter()
                .filter(|c| files.contains_key(&file_key(c)))
                .collect();
            let made = common::in_pairs(&cases, |c| estimate(&files[&file_key(c)], c));
            for (c, r) in cases.iter().zip(made) {
                results.insert((c.model.clone(), c.mode.clone()), r);
            }
        };
        match truth_cache() {
            Some(cache) => estimate_traced(&cached(python, &cache)),
            None => {
                let dir = tempfile::tempdir().unwrap();
                paced(python, dir.path(), &[], estimate_traced);
            }
        }
        for c in &all {
            assert!(
                results.contains_key(&(c.model.clone(), c.mode.clone())),
                "{} {}: not traced",
                c.model,
                c.mode
            );
        }
        results
    })
}

/// The bytes of the files in `dir` (not in its subfolders).
fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The wheel's Python, where its libtorch is the one the cases were measured with; under
/// another, `test` is skipped by name (`tests/data/version-keyed.txt`).
fn python_under_2_11(test: &str) -> Option<String> {
    if !common::on_the_measured_libtorch(&format!("gpu_truth::{test}")) {
        return None;
    }
    common::corpus_python("the GPU truth cases")
}

/// What the docs claim of the traced files' runs (the target the product is held to, as
/// tch runs a file), every case: inference allocated within 8 KiB (the farthest, Swin-T,
/// 7,680 B under its 510 MiB); training allocated within 0.6% in f32 and 0.2% under bf16
/// autocast; reserved never more than 2.2% under the measured peak, nor more than 10.5%
/// over it.
const TRACED_CLAIMS: Claims = Claims {
    inference_allocated_bytes: 8 << 10,
    train_allocated: 0.6,
    train_bf16_allocated: 0.2,
    reserved_under: 2.2,
    reserved_over: 10.5,
};

/// The bounds a set of cases is held to, in % of the measured peak.
struct Claims {
    inference_allocated_bytes: u64,
    train_allocated: f64,
    train_bf16_allocated: f64,
    reserved_under: f64,
    reserved_over: f64,
}

/// The family a model is grouped in for the docs' tables.
fn family(model: &str) -> &'static str {
    const GQA: &[&str] = &["hf_smollm2_135m", "hf_qwen2_tiny", "hf_mistral_tiny"];
    const VISION: &[&str] = &[
        "hf_vit_base",
        "timm_vit_small_patch16_224",
        "timm_deit_small_patch16_224",
        "timm_mixer_b16_224",
        "tv_swin_t",
    ];
    if GQA.contains(&model) {
        "decoders with grouped-query attention"
    } else if VISION.contains(&model) {
        "vision transformers and MLP-Mixer"
    } else if model.starts_with("hf_") {
        "transformers without grouped-query attention"
    } else {
        "convolution nets"
    }
}

/// The mode a case is grouped in for the docs' tables (the foreach and fused AdamW
/// steps with the plain one).
fn mode_group(mode: &str) -> &'static str {
    match mode {
        "infer" => "inference",
        "train-bf16" => "training, bf16 autocast",
        _ => "training, f32",
    }
}

/// The docs' table of errors by family and mode: each group's cases and the range of
/// their allocated and reserved errors (`(family, mode, allocated %, reserved %)`).
fn family_table(errors: &[(&str, &str, f64, f64)]) -> String {
    let mut groups: BTreeMap<(&str, &str), Vec<(f64, f64)>> = BTreeMap::new();
    for (model, mode, a, r) in errors {
        groups
            .entry((family(model), mode_group(mode)))
            .or_default()
            .push((*a, *r));
    }
    let range = |xs: Vec<f64>| {
        let (lo, hi) = xs
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        let pct = |x: f64| {
            let x = if x.abs() < 0.05 { 0.0 } else { x };
            if x == 0.0 {
                "0.0%".to_string()
            } else {
                format!("{x:+.1}%")
            }
        };
        if pct(lo) == pct(hi) {
            pct(lo)
        } else {
            format!("{} to {}", pct(lo), pct(hi))
        }
    };
    let rows: Vec<Vec<String>> = groups
        .into_iter()
        .map(|((family, mode), cases)| {
            vec![
                family.to_string(),
                mode.to_string(),
                cases.len().to_string(),
                range(cases.iter().map(|c| c.0).collect()),
                range(cases.iter().map(|c| c.1).collect()),
            ]
        })
        .collect();
    common::markdown_table(
        &["family", "mode", "cases", "allocated", "reserved"],
        &[false, false, true, true, true],
        &rows,
    )
}

/// Estimates every case, prints the table, and fails on a case outside the target that
/// `gaps` does not list, a listed one whose error moved by more than half a point either
/// way (a documented comparison, bounded in both directions: the docs quote it) or that
/// meets the target, a listed one not measured, and any case outside `claims`. Holds the
/// docs' table `table` (by family and mode) to what it measured.
fn hold(
    cases: &[Measured],
    python: &str,
    gaps: &[(&str, &str, f64, f64, &str)],
    claims: Option<&Claims>,
    table: &str,
) {
    let mut failures = Vec::new();
    let mut errors = Vec::new();
    println!(
        "{:<28} {:<14} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}  attention",
        "model", "mode", "alloc meas", "alloc pred", "err %", "resv meas", "resv pred", "err %"
    );
    let (mut within_alloc, mut within_both) = (0, 0);
    let results = cases.iter().map(|c| {
        estimates(python)
            .get(&(c.model.clone(), c.mode.clone()))
            .cloned()
            .unwrap_or_else(|| Err("not estimated".into()))
    });
    for (c, result) in cases.iter().zip(results) {
        let Made {
            allocated: alloc,
            reserved: resv,
            attention,
            ..
        } = match result {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{} {}: the estimate failed: {e}", c.model, c.mode));
                continue;
            }
        };
        let ea = 100.0 * (alloc as f64 / c.allocated as f64 - 1.0);
        let er = 100.0 * (resv as f64 / c.reserved as f64 - 1.0);
        println!(
            "{:<28} {:<14} {:>12} {:>12} {:>+8.2} {:>12} {:>12} {:>+8.2}  {attention}",
            c.model, c.mode, c.allocated, alloc, ea, c.reserved, resv, er
        );
        errors.push((c.model.as_str(), c.mode.as_str(), ea, er));
        if let Some(claims) = claims {
            let (bound, what) = match mode_group(&c.mode) {
                "inference" => (0.0, "inference within its bytes"),
                "training, bf16 autocast" => (claims.train_bf16_allocated, "the bf16 bound"),
                _ => (claims.train_allocated, "the f32 bound"),
            };
            let allocated_ok = if bound == 0.0 {
                alloc.abs_diff(c.allocated) <= claims.inference_allocated_bytes
            } else {
                ea.abs() <= bound
            };
            if !allocated_ok {
                failures.push(format!(
                    "{} {}: allocated {ea:+.3}% ({alloc} B, measured {} B), outside what the \
                     docs claim ({what})",
                    c.model, c.mode, c.allocated
                ));
            }
            if er < -claims.reserved_under || er > claims.reserved_over {
                failures.push(format!(
                    "{} {}: reserved {er:+.2}%, outside what the docs claim ({:.1}% under to \
                     {:.1}% over)",
                    c.model, c.mode, claims.reserved_under, claims.reserved_over
                ));
            }
        }
        let ok_alloc = ea.abs() <= 100.0 * ALLOCATED_TARGET;
        let ok = ok_alloc && er.abs() <= 100.0 * RESERVED_TARGET;
        within_alloc += ok_alloc as usize;
        within_both += ok as usize;
        let gap = gaps
            .iter()
            .find(|(m, md, ..)| *m == c.model && *md == c.mode);
        match (ok, gap) {
            (true, None) => {}
            (true, Some(_)) => failures.push(format!(
                "{} {}: meets the target now (allocated {ea:+.2}%, reserved {er:+.2}%): \
                 take it off the list of known gaps",
                c.model, c.mode
            )),
            (false, None) => failures.push(format!(
                "{} {}: allocated {ea:+.2}%, reserved {er:+.2}%: outside the target \
                 (allocated within {}%, reserved within {}%)",
                c.model,
                c.mode,
                100.0 * ALLOCATED_TARGET,
                100.0 * RESERVED_TARGET
            )),
            (false, Some((_, _, ga, gr, why))) => {
                if (ea - ga).abs() > 0.5 || (er - gr).abs() > 0.5 {
                    failures.push(format!(
                        "{} {}: allocated {ea:+.2}%, reserved {er:+.2}%, moved from the known \
                         gap ({ga:+.2}%, {gr:+.2}%: {why}) by more than half a point: update \
                         the list and the docs",
                        c.model, c.mode
                    ));
                }
            }
        }
    }
    println!(
        "{} cases: {within_alloc} within {}% allocated, {within_both} within that and {}% \
         reserved; {} known gaps",
        cases.len(),
        100.0 * ALLOCATED_TARGET,
        100.0 * RESERVED_TARGET,
        gaps.len()
    );
    for (m, md, ..) in gaps {
        if !cases.iter().any(|c| c.model == *m && c.mode == *md) {
            failures.push(format!(
                "the known gaps list {m} {md}, which was not measured"
            ));
        }
    }
    if table == "gpu-truth-eager" {
        eager_above(&errors, &mut failures);
    }
    let markdown = family_table(&errors);
    println!("{markdown}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    common::doc_table("docs/estimate.md", table, &markdown);
}

/// What the CLI tells a PyTorch user ([`tch_memprof::estimate::EAGER_ABOVE`]): how much
/// more eager PyTorch allocated than the estimate of the traced file, at most, in
/// inference and in training, to the tenth of a point of the estimate's peak.
fn eager_above(errors: &[(&str, &str, f64, f64)], failures: &mut Vec<String>) {
    let above = |training: bool| {
        errors
            .iter()
            .filter(|(_, mode, ..)| (mode_group(mode) != "inference") == training)
            // The estimate's error ea (percent of the measured peak) as eager's excess over
            // the estimate: measured / estimate - 1.
            .map(|&(_, _, ea, _)| 1.0 / (1.0 + ea / 100.0) - 1.0)
            .fold(f64::MIN, f64::max)
    };
    let (inference, training) = tch_memprof::estimate::EAGER_ABOVE;
    for (what, said, measured) in [
        ("inference", inference, above(false)),
        ("training", training, above(true)),
    ] {
        println!(
            "eager PyTorch above the estimate, {what}: at most {:.2}%",
            100.0 * measured
        );
        if (said - measured).abs() > 0.0005 {
            failures.push(format!(
                "EAGER_ABOVE says eager PyTorch took up to {:.1}% more in {what}; the H200 \
                 measured {:.2}%: update it",
                100.0 * said,
                100.0 * measured
            ));
        }
    }
}

/// `estimate --compare`: the prediction held to the H200's recorded run of the same
/// program (BERT-base inference at 8x512 tokens; the run's snapshot, gzipped, in
/// `tests/data/gpu-truth/h200-2026-11-27/snapshots/traced/`). Its history holds 213
/// `alloc` actions (counted with Python's pickle:
/// `sum(e["action"] == "alloc" for e in s["device_traces"][0])`) and began after the
/// weights were on the GPU, so the 206 blocks live at its end that it never allocated
/// (the weights) are seeded first: 419 requests. The dry run makes the same requests
/// in the same order, the weights as a set; the one place they part is a 4-byte
/// request the prediction makes and the record does not have.
#[test]
fn the_prediction_makes_the_requests_the_h200_made_in_the_same_order() {
    let Some(python) =
        python_under_2_11("the_prediction_makes_the_requests_the_h200_made_in_the_same_order")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("bert.pickle");
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(format!(
            "{TRACED_DATA}/snapshots/traced/hf_bert_base.infer.cuda.pickle.gz"
        ))
        .unwrap(),
    )
    .read_to_end(&mut bytes)
    .unwrap();
    std::fs::write(&snapshot, bytes).unwrap();
    let key = ("hf_bert_base".to_string(), "infer".to_string());
    let compare = |files: &BTreeMap<(String, String), PathBuf>| {
        common::cli(&[
            "estimate",
            files[&key].to_str().unwrap(),
            "--input",
            "8x512:i64",
            "--gpu",
            "h200",
            "--compare",
            snapshot.to_str().unwrap(),
        ])
    };
    let out = match truth_cache() {
        Some(cache) => compare(&cached(&python, &cache)),
        None => {
            let traced = dir.path().join("traced");
            let mut out = None;
            paced(&python, &traced, &["hf_bert_base"], |files| {
                out = Some(compare(files))
            });
            out.expect("hf_bert_base traced")
        }
    };
    let text = common::text(&out.stdout);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    println!("{text}");
    assert!(
        text.contains(
            "requests: 419 recorded, 420 predicted; 419 the same size in the same order \
             (the 206 weights' in any order); 1 place(s) where they part"
        ),
        "{text}"
    );
    assert!(text.contains("predicted only: 4 B in aten::to"), "{text}");
    // The peaks beside each other: the record's (blocks as asked for) and the estimate's.
    assert!(text.contains("peak reserved: recorded 1.11 GiB, predicted 1.11 GiB (+0.00%)"));
}
