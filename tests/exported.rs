//! Exported programs (`.pt2`, from `torch.export.save`) as the reader takes them, on
//! files PyTorch itself made (`scripts/export-cases.py`): both forms torch.export
//! writes give the same estimate; a program with a dynamic batch takes the sizes its
//! range constraint allows and refuses others in one line; what the reader does not run
//! (control flow, custom ops, autocast turned on inside the model) and damaged archives
//! are refused in one line with exit status 2; `profile` runs a real training step of a
//! program on the CPU, as of the same model's TorchScript file; infinite floats, weights
//! that view one storage, and the largest batch searched within a program's range (a
//! static program's one batch never called the largest that fits); parameters saved
//! frozen take no gradient and no optimizer state.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tch::{Device, Kind};
use tch_memprof::estimate::Input;
use tch_memprof::Category;

/// The programs of `scripts/export-cases.py`, made once per test binary; None (said)
/// without the wheel's Python.
fn cases() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let python = common::corpus_python("exported programs")?;
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("export-cases");
        let _ = std::fs::remove_dir_all(&dir);
        let out = Command::new(python)
            .arg(root.join("scripts/export-cases.py"))
            .arg(&dir)
            .output()
            .expect("runs scripts/export-cases.py");
        assert!(
            out.status.success(),
            "scripts/export-cases.py: {}",
            common::text(&out.stderr)
        );
        Some(dir)
    })
    .as_deref()
}

/// `estimate FILE ARGS... --csv`: (weights, peak allocated) of the one row, or the
/// refusal (exit status, stderr).
fn estimate(file: &Path, args: &[&str]) -> Result<(u64, u64), (Option<i32>, String)> {
    let mut all = vec!["estimate", file.to_str().unwrap(), "--csv"];
    all.extend(args);
    let out = common::cli(&all);
    if !out.status.success() {
        return Err((out.status.code(), common::text(&out.stderr)));
    }
    let csv = common::text(&out.stdout);
    let col = |name: &str| -> u64 { common::csv_cell(&csv, name).parse().unwrap() };
    Ok((col("weights_bytes"), col("peak_allocated_bytes")))
}

/// The refusal of `estimate FILE ARGS...`: exit status 2 and one line holding every
/// phrase of `says`.
fn refuses(file: &Path, args: &[&str], says: &[&str]) {
    match estimate(file, args) {
        Ok(r) => panic!("{}: estimated {r:?}, where it must refuse", file.display()),
        Err((status, stderr)) => {
            let lines = stderr.trim_end().lines().count();
            assert_eq!(status, Some(2), "{stderr}");
            assert_eq!(lines, 1, "{stderr}");
            for s in says {
                assert!(stderr.contains(s), "{stderr:?} does not say {s:?}");
            }
        }
    }
}

fn within(a: u64, b: u64, share: f64) -> bool {
    (a as f64 - b as f64).abs() <= share * b as f64
}

#[test]
fn both_forms_torch_export_writes_estimate_alike() {
    let Some(dir) = cases() else { return };
    // The training IR (composite ops such as aten.linear kept) and core ATen
    // (run_decompositions()) of one model: the same weights; peaks within 5%.
    for model in ["resnet18", "bert"] {
        for mode in [&[][..], &["--train", "--optimizer", "adamw"][..]] {
            let training = estimate(&dir.join(format!("{model}.pt2")), mode).unwrap();
            let core = estimate(&dir.join(format!("{model}-core.pt2")), mode).unwrap();
            println!("{model} {mode:?}: training IR {training:?}, core ATen {core:?}");
            assert_eq!(training.0, core.0, "{model}: weights");
            assert!(within(core.1, training.1, 0.05), "{model} {mode:?}");
        }
    }
    // The same ResNet-18 traced into TorchScript: the same weights, byte for byte.
    let pt = estimate(&dir.join("resnet18.pt"), &["--input", "2x3x64x64"]).unwrap();
    let pt2 = estimate(&dir.join("resnet18.pt2"), &[]).unwrap();
    assert_eq!(pt.0, pt2.0);
    assert!(within(pt2.1, pt.1, 0.05), "{pt:?} {pt2:?}");
}

/// The largest bytes each category holds over the predicted step of `estimate FILE
/// ARGS... --output-dir` (its timeline's columns, in the bytes the allocator charges).
fn category_maxima(file: &Path, args: &[&str]) -> std::collections::HashMap<String, u64> {
    let out = tempfile::tempdir().unwrap();
    let mut all = vec!["estimate", file.to_str().unwrap(), "--output-dir"];
    all.push(out.path().to_str().unwrap());
    all.extend(args);
    let run = common::cli(&all);
    assert!(run.status.success(), "{}", common::text(&run.stderr));
    let mut rd = csv::Reader::from_path(out.path().join("timeline.csv")).unwrap();
    let h = rd.headers().unwrap().clone();
    let mut max = std::collections::HashMap::new();
    for r in rd.records() {
        let r = r.unwrap();
        for (name, v) in h.iter().zip(r.iter()) {
            if let (true, Ok(v)) = (name.ends_with("_bytes"), v.parse::<u64>()) {
                let m = max.entry(name.to_string()).or_insert(0);
                *m = v.max(*m);
            }
        }
    }
    max
}

/// lora.json: the trainable and the frozen parameters of lora.pt2, each `([rows, row],
/// bytes)` (dim 0, then the rest), as PyTorch gives them.
type Described = Vec<([u64; 2], u64)>;
fn lora_parameters(dir: &Path) -> (Described, Described) {
    described(&dir.join("lora.json"))
}

/// FSDP2's padded shards of f32 parameters over `world` ranks, by hand: dim 0 split
/// in ceil(d / world) rows, every rank holding that many.
fn padded_shards(ps: &Described, world: u64) -> u64 {
    ps.iter()
        .map(|([rows, row], _)| rows.div_ceil(world) * row * 4)
        .sum()
}

/// Rank `rank`'s unpadded local shards of the same (what the optimizer's state is of).
fn local_shards(ps: &Described, world: u64, rank: u64) -> u64 {
    ps.iter()
        .map(|([rows, row], _)| {
            let per = rows.div_ceil(world);
            rows.saturating_sub(rank * per).min(per) * row * 4
        })
        .sum()
}

/// The trainable and the frozen parameters a fixture's JSON describes.
fn described(json: &Path) -> (Described, Described) {
    let counts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let read = |k: &str| -> Described {
        counts[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let shape: Vec<u64> = p["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                let rows = shape.first().copied().unwrap_or(1);
                let row: u64 = shape.iter().skip(1).product();
                ([rows, row], p["bytes"].as_u64().unwrap())
            })
            .collect()
    };
    (read("trainable"), read("frozen"))
}

/// Under FSDP2 (`fully_shard` shards every parameter of a module, whatever its
/// requires_grad) the frozen layer is sharded like the adapter: each rank holds every
/// parameter's padded shard (dim 0 in ceil(d / N) rows), and AdamW's two states of the
/// adapter's local shards only; the arithmetic by hand from PyTorch's shapes.
#[test]
fn frozen_parameters_are_sharded_with_no_gradient_or_state() {
    use tch_memprof::estimate::{Fsdp, Gpu, Mode, Model, Optimizer, Options};
    let Some(dir) = cases() else { return };
    let _serial = common::serial();
    let (trainable, frozen) = lora_parameters(dir);
    let model = Model::from_file(&dir.join("lora.pt2")).unwrap();
    let input = Input::parse("4x256", None).unwrap();
    let options = Options::for_gpu(Gpu::named("h200").unwrap());
    let ranks = model
        .estimate_sharded(
            std::slice::from_ref(&input),
            Mode::Train(Optimizer::AdamW),
            &options,
            &Fsdp::over(4),
        )
        .unwrap();
    assert_eq!(ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 3]);
    let padded = |ps: &Described| padded_shards(ps, 4);
    let local = |ps: &Described, rank: u64| local_shards(ps, 4, rank);
    // Under bf16 mixed precision the frozen layer is gathered in bf16 with the adapter
    // (the dry run computes with both cast); the shards and the state stay f32.
    let mixed = Fsdp {
        param_dtype: Some(tch::Kind::BFloat16),
        ..Fsdp::over(4)
    };
    let bf16 = model
        .estimate_sharded(
            std::slice::from_ref(&input),
            Mode::Train(Optimizer::AdamW),
            &options,
            &mixed,
        )
        .unwrap();
    let mut ranks = ranks;
    ranks.extend(bf16);
    for r in &ranks {
        println!(
            "rank {}: sharded parameters {} B, optimizer state {} B, peak {} B",
            r.rank, r.sharded_parameter_bytes, r.optimizer_state_bytes, r.peak_allocated
        );
        assert_eq!(
            r.sharded_parameter_bytes,
            padded(&trainable) + padded(&frozen),
            "rank {}",
            r.rank
        );
        assert_eq!(
            r.optimizer_state_bytes,
            2 * local(&trainable, u64::from(r.rank)),
            "rank {}",
            r.rank
        );
        let sum: u64 = r.at_peak.iter().map(|(_, b)| b).sum();
        assert_eq!(sum, r.peak_allocated, "rank {}", r.rank);
    }
}

/// Three blocks in a module list, each one's linear layer frozen and block 1's adapter
/// too: each block is a unit (block 1 one with nothing to train: all-gathered, never
/// reduce-scattered); each rank holds every parameter's padded shard and AdamW's states
/// of the trainable ones' local shards, by hand from PyTorch's shapes.
#[test]
fn a_unit_with_nothing_to_train_is_sharded_all_the_same() {
    use tch_memprof::estimate::{Fsdp, Gpu, Mode, Model, Optimizer, Options, ShardedCategory};
    let Some(dir) = cases() else { return };
    let _serial = common::serial();
    let (trainable, frozen) = described(&dir.join("lora-stack.json"));
    assert_eq!((trainable.len(), frozen.len()), (4, 8));
    let model = Model::from_file(&dir.join("lora-stack.pt2")).unwrap();
    let input = Input::parse("4x256", None).unwrap();
    let options = Options::for_gpu(Gpu::named("h200").unwrap());
    let ranks = model
        .estimate_sharded(
            std::slice::from_ref(&input),
            Mode::Train(Optimizer::AdamW),
            &options,
            &Fsdp::over(4),
        )
        .unwrap();
    let padded = |ps: &Described| padded_shards(ps, 4);
    let local = |ps: &Described, rank: u64| local_shards(ps, 4, rank);
    for r in &ranks {
        println!(
            "rank {}: units {:?}, sharded parameters {} B, optimizer state {} B, at the peak {:?}",
            r.rank, r.units, r.sharded_parameter_bytes, r.optimizer_state_bytes, r.at_peak
        );
        assert_eq!(r.units, ["layers.0", "layers.1", "layers.2"]);
        assert_eq!(
            r.sharded_parameter_bytes,
            padded(&trainable) + padded(&frozen)
        );
        assert_eq!(
            r.optimizer_state_bytes,
            2 * local(&trainable, u64::from(r.rank))
        );
        let sum: u64 = r.at_peak.iter().map(|(_, b)| b).sum();
        assert_eq!(sum, r.peak_allocated, "rank {}", r.rank);
        // A reduce-scatter live at the peak is a trainable block's: the world times its
        // adapter's padded shards (the frozen layer's are all-gathered, never reduced).
        let at = |c: ShardedCategory| r.at_peak.iter().find(|(k, _)| *k == c).unwrap().1;
        let rs = at(ShardedCategory::ReduceScatter);
        assert!(
            rs == 0 || rs == 4 * padded_shards(&trainable[..2].to_vec(), 4),
            "{rs}"
        );
    }
}

/// A parameter saved with requires_grad False (a fine-tune's frozen base weights) takes
/// no gradient and no optimizer state in a training step, as in PyTorch's: the estimate
/// of a linear layer with a rank-8 adapter beside it, the layer frozen, holds gradients
/// of the adapter's bytes and AdamW's two states of them; the same module with nothing
/// frozen, of every parameter's. The bytes are PyTorch's count (lora.json; each a
/// multiple of the allocator's 512-byte blocks).
#[test]
fn frozen_parameters_take_no_gradient_and_no_optimizer_state() {
    let Some(dir) = cases() else { return };
    let (trainable_ps, frozen_ps) = lora_parameters(dir);
    let sum = |ps: &[([u64; 2], u64)]| -> u64 { ps.iter().map(|(_, b)| b).sum() };
    let (trainable, frozen) = (sum(&trainable_ps), sum(&frozen_ps));
    assert!(trainable > 0 && frozen > trainable);
    let train = ["--input", "4x256", "--train", "--optimizer", "adamw"];
    let tuned = category_maxima(&dir.join("lora.pt2"), &train);
    let whole = category_maxima(&dir.join("lora-trained.pt2"), &train);
    println!("frozen base: {tuned:?}\nnothing frozen: {whole:?}");
    assert_eq!(tuned["grad_bytes"], trainable);
    assert_eq!(tuned["opt_bytes"], 2 * trainable);
    assert_eq!(whole["grad_bytes"], trainable + frozen);
    assert_eq!(whole["opt_bytes"], 2 * (trainable + frozen));
    // The frozen ones named in a note on standard error: how many and their bytes.
    let lora = dir.join("lora.pt2");
    let mut all = vec!["estimate", lora.to_str().unwrap(), "--csv"];
    all.extend(train);
    let out = common::cli(&all);
    let stderr = common::text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let kib = format!("{:.2} KiB", frozen as f64 / 1024.0);
    assert!(
        stderr.contains(&format!(
            "note: {} parameter(s) of lora.pt2 ({kib}) were saved with requires_grad=False",
            frozen_ps.len()
        )) && stderr.lines().count() == 1,
        "{stderr}"
    );
    // Every parameter frozen (a module exported for inference): a training estimate
    // trains them all, as of the same module with nothing frozen, and says so.
    let inference = dir.join("lora-inference.pt2");
    assert_eq!(category_maxima(&inference, &train), whole);
    let mut all = vec!["estimate", inference.to_str().unwrap(), "--csv"];
    all.extend(train);
    let out = common::cli(&all);
    let stderr = common::text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("every parameter of lora-inference.pt2 was saved with requires_grad=False")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
    // Held all the same: the trainable parameters as parameters, the frozen ones with
    // the buffers (no gradient, no state).
    assert_eq!(tuned["param_bytes"], trainable);
    assert_eq!(tuned["buffer_bytes"], frozen);
    assert_eq!(whole["param_bytes"], trainable + frozen);
}

#[test]
fn a_dynamic_batch_takes_the_sizes_its_range_allows() {
    let Some(dir) = cases() else { return };
    let dynamic = dir.join("dynamic.pt2");
    let at = |b: u32, train: bool| {
        let input = format!("{b}x3x32x32");
        let mut args = vec!["--input", input.as_str()];
        if train {
            args.push("--train");
        }
        estimate(&dynamic, &args).unwrap()
    };
    let (w4, p4) = at(4, true);
    let (w16, p16) = at(16, true);
    assert_eq!(w4, w16);
    // A training step keeps the batch's activations for backward: 12 more images hold
    // at least one more 16x32x32 f32 feature map each (the convolution's output).
    assert!(p16 >= p4 + 12 * 16 * 32 * 32 * 4, "{p4} -> {p16}");
    // Outside Dim("batch", min=2, max=16): refused, naming the dimension and its range.
    refuses(
        &dynamic,
        &["--input", "32x3x32x32"],
        &["dimension 0", "2..=16"],
    );
    // No shape given: a dynamic program needs one.
    refuses(&dynamic, &[], &["dynamic dimensions", "--input"]);
    // A static program takes its own shape (by default) and refuses another.
    let static_ = dir.join("static.pt2");
    assert_eq!(estimate(&static_, &[]).unwrap(), at(4, false));
    refuses(
        &static_,
        &["--input", "8x3x32x32"],
        &["static sizes 4x3x32x32", "dimension 0"],
    );
}

/// An input of the type the model does not read, said in the crate's words (which input,
/// what the model reads it as, the `--input` that gives it), where libtorch's were
/// "Expected tensor for argument #1 'indices' to have one of the following scalar
/// types" and "mean(): could not infer output dtype".
#[test]
fn an_input_of_the_wrong_type_says_which_and_what_to_give() {
    let Some(dir) = cases() else { return };
    refuses(
        &dir.join("bert.pt2"),
        &["--input", "2x32:f32"],
        &[
            "in module embeddings.word_embeddings",
            "input 1 (2x32, f32) is read as token ids",
            "--input 2x32:i64",
        ],
    );
    for file in ["resnet18.pt", "resnet18.pt2"] {
        refuses(
            &dir.join(file),
            &["--input", "2x3x64x64:i64"],
            &[
                "input 1 (2x3x64x64, i64) is integer, where the model computes in floating point",
                "--input 2x3x64x64 (f32",
            ],
        );
    }
}

#[test]
fn what_the_reader_does_not_run_refuses_in_one_line() {
    let Some(dir) = cases() else { return };
    refuses(&dir.join("cond.pt2"), &[], &["control flow", "torch.cond"]);
    refuses(
        &dir.join("custom.pt2"),
        &[],
        &["custom op memprof_test::twice"],
    );
    refuses(
        &dir.join("autocast.pt2"),
        &[],
        &["turns autocast on", "--autocast"],
    );
}

/// Copies the archive `src` to `dst`, each record through `f` (None drops it).
fn rewrite(src: &Path, dst: &Path, f: impl Fn(&str, Vec<u8>) -> Option<Vec<u8>>) {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(src).unwrap()).unwrap();
    let mut out = zip::ZipWriter::new(std::fs::File::create(dst).unwrap());
    let stored =
        zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for k in 0..zip.len() {
        let mut entry = zip.by_index(k).unwrap();
        let name = entry.name().to_string();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        if let Some(bytes) = f(&name, bytes) {
            out.start_file(name, stored).unwrap();
            out.write_all(&bytes).unwrap();
        }
    }
    out.finish().unwrap();
}

#[test]
fn damaged_archives_refuse_in_one_line() {
    let Some(dir) = cases() else { return };
    let good = dir.join("static.pt2");
    let tmp = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(&good).unwrap();
    // Cut short (a copy that did not finish): not a readable zip.
    let cut = tmp.path().join("cut.pt2");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    refuses(&cut, &["--input", "4x3x32x32"], &["cut.pt2"]);
    // An archive version this reader does not know.
    let future = tmp.path().join("future.pt2");
    rewrite(&good, &future, |name, b| {
        Some(if name.ends_with("/archive_version") {
            b"9".to_vec()
        } else {
            b
        })
    });
    refuses(&future, &[], &["archive version \"9\""]);
    // A serialization schema of another major version.
    let schema = tmp.path().join("schema.pt2");
    rewrite(&good, &schema, |name, b| {
        Some(if name.ends_with("models/model.json") {
            String::from_utf8(b)
                .unwrap()
                .replacen("\"major\": 8", "\"major\": 99", 1)
                .into_bytes()
        } else {
            b
        })
    });
    refuses(&schema, &[], &["serialization schema 99."]);
    // No program in it.
    let empty = tmp.path().join("empty.pt2");
    rewrite(&good, &empty, |name, b| {
        (!name.ends_with("models/model.json")).then_some(b)
    });
    refuses(&empty, &[], &["models/model.json"]);
    // A weight record cut short: refused at opening, before any weight is read.
    let weights = tmp.path().join("weights.pt2");
    rewrite(&good, &weights, |name, b| {
        Some(if name.ends_with("data/weights/weight_0") {
            b[..b.len() / 2].to_vec()
        } else {
            b
        })
    });
    refuses(&weights, &[], &["weight_0", "damaged"]);
    let out = common::cli(&[
        "profile",
        weights.to_str().unwrap(),
        "--output-dir",
        tmp.path().join("out").to_str().unwrap(),
    ]);
    let stderr = common::text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("weight_0"), "{stderr}");
    // No such file.
    refuses(&tmp.path().join("missing.pt2"), &[], &["no such file"]);
}

#[test]
fn profile_runs_a_real_training_step_of_a_program() {
    let Some(dir) = cases() else { return };
    let _serial = common::serial();
    let out = tempfile::tempdir().unwrap();
    let input = [Input {
        shape: vec![2, 3, 64, 64],
        kind: Kind::Float,
    }];
    let program = tch_memprof::profile_file(
        &dir.join("resnet18.pt2"),
        &input,
        true,
        Device::Cpu,
        &out.path().join("pt2"),
    )
    .unwrap();
    for f in [
        "step.png",
        "timeline.csv",
        "layers.csv",
        "idle.csv",
        "summary.txt",
    ] {
        assert!(out.path().join("pt2").join(f).is_file(), "{f}");
    }
    let script = tch_memprof::profile_file(
        &dir.join("resnet18.pt"),
        &input,
        true,
        Device::Cpu,
        &out.path().join("pt"),
    )
    .unwrap();
    let (a, b) = (&program.profile, &script.profile);
    println!(
        "ResNet-18 training step on the CPU: .pt2 peak {} B, .pt peak {} B",
        a.peak.bytes, b.peak.bytes
    );
    // The same parameters (11.2 M for 10 classes, f32), read from the archive.
    assert_eq!(
        a.peak.breakdown.get(Category::Param),
        b.peak.breakdown.get(Category::Param)
    );
    assert!(within(a.peak.bytes, b.peak.bytes, 0.05));
    // Layers named from the program's module stack, as from the TorchScript file's.
    let layers = |p: &tch_memprof::ProfiledStep| -> Vec<String> {
        let mut l: Vec<String> = p.profile.layers.iter().map(|l| l.layer.clone()).collect();
        l.sort();
        l
    };
    let named = layers(&program);
    for l in ["conv1", "layer1.0.conv1", "layer4.1.bn2", "fc"] {
        assert!(named.iter().any(|n| n == l), "{l} not in {named:?}");
    }
}

#[test]
fn infinite_floats_storage_views_and_the_largest_batch_a_program_takes() {
    let Some(dir) = cases() else { return };
    // A causal mask filled with float("-inf"): the schema writes it as "-Infinity".
    estimate(&dir.join("causal.pt2"), &["--train"]).unwrap();
    // Buffers viewing one storage (a slice at an offset, a transpose): one 100x8 f32
    // table, the linear layer's 8x8 weight and 8 biases, and nothing more.
    let (weights, _) = estimate(&dir.join("views.pt2"), &["--train"]).unwrap();
    assert_eq!(weights, (100 * 8 + 8 * 8 + 8) * 4);
    let out = tempfile::tempdir().unwrap();
    let profiled = common::cli(&[
        "profile",
        dir.join("views.pt2").to_str().unwrap(),
        "--train",
        "--output-dir",
        out.path().to_str().unwrap(),
    ]);
    assert!(
        profiled.status.success(),
        "{}",
        common::text(&profiled.stderr)
    );
    // The largest batch is searched within the batch's range constraint (2..=16):
    // with memory for any batch, the row found is batch 16.
    let out = common::cli(&[
        "estimate",
        dir.join("dynamic.pt2").to_str().unwrap(),
        "--input",
        "4x3x32x32",
        "--train",
        "--memory",
        "1GB",
        "--csv",
    ]);
    let csv = common::text(&out.stdout);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let largest: Vec<&str> = csv.lines().filter(|l| l.contains(",true,")).collect();
    assert_eq!(largest.len(), 1, "{csv}");
    assert!(largest[0].starts_with("dynamic.pt2,16,"), "{csv}");
}

/// `--memory` on one ResNet-18 three ways: as `torch.export.export` writes it by default
/// (static sizes, batch 2), exported with a dynamic batch, and traced. The static
/// program's one batch is never called the largest that fits (the line says it was not
/// searched and how to export for a search; no CSV row is marked, standard error says
/// why in one line); the dynamic program's answer is the traced file's, whose batch is
/// free (the two forms estimate alike: `both_forms_torch_export_writes_estimate_alike`).
#[test]
fn a_static_program_never_answers_the_largest_batch() {
    let Some(dir) = cases() else { return };
    let run = |file: &str, extra: &[&str]| {
        let path = dir.join(file);
        let mut args = vec!["estimate", path.to_str().unwrap()];
        args.extend(["--train", "--optimizer", "adamw", "--memory", "2GiB"]);
        args.extend(extra);
        let out = common::cli(&args);
        assert!(
            out.status.success(),
            "{file}: {}",
            common::text(&out.stderr)
        );
        out
    };
    let text = common::text(&run("resnet18.pt2", &[]).stdout);
    assert!(
        text.contains(
            "largest batch not searched: the program was exported with static sizes and \
             takes batch 2 only; it fits in 2.00 GiB"
        ),
        "{text}"
    );
    assert!(text.contains("dynamic_shapes=({0: torch.export.Dim(\"batch\")},)"));
    assert!(!text.contains("largest batch that fits"), "{text}");

    let csv = run("resnet18.pt2", &["--csv"]);
    let rows = common::text(&csv.stdout);
    assert!(!rows.lines().any(|l| l.contains(",true,")), "{rows}");
    let stderr = common::text(&csv.stderr);
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning: largest batch not searched"))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");

    let largest = |file: &str| -> i64 {
        let out = run(file, &["--input", "2x3x64x64", "--csv"]);
        let rows = common::text(&out.stdout);
        let header: Vec<&str> = rows.lines().next().unwrap().split(',').collect();
        let col = header.iter().position(|h| *h == "batch").unwrap();
        let marked: Vec<&str> = rows.lines().filter(|l| l.contains(",true,")).collect();
        assert_eq!(marked.len(), 1, "{file}: {rows}");
        marked[0].split(',').nth(col).unwrap().parse().unwrap()
    };
    let dynamic = largest("resnet18-dynamic.pt2");
    let traced = largest("resnet18.pt");
    assert!(
        dynamic > 16,
        "the dynamic program's largest batch: {dynamic}"
    );
    assert!(
        (dynamic - traced).abs() <= traced / 100,
        "the dynamic program's largest batch {dynamic}, the traced file's {traced}"
    );
}

/// `plan` of a static program answers first: the configurations its batch cannot take
/// (every micro-batch split) are counted in one line under the answer, by reason, and
/// listed one by one only with `--verbose`.
#[test]
fn plan_counts_what_it_left_out_in_one_line() {
    let Some(dir) = cases() else { return };
    let path = dir.join("static.pt2");
    let run = |verbose: bool| {
        let mut args = vec!["plan", path.to_str().unwrap(), "--memory", "1GB"];
        if verbose {
            args.push("--verbose");
        }
        let out = common::cli(&args);
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        common::text(&out.stdout)
    };
    let text = run(false);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[2].starts_with("As it is: peak reserved"), "{text}");
    let left: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with("Left out of the search: "))
        .collect();
    assert_eq!(left.len(), 1, "{text}");
    let n: usize = left[0]
        .trim_start_matches("Left out of the search: ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(n > 0);
    assert!(
        left[0].contains(&format!(
            "{n} because the program was exported with static sizes"
        )),
        "{}",
        left[0]
    );
    assert!(!text.contains("skipped ("), "{text}");
    let verbose = run(true);
    assert_eq!(
        verbose
            .lines()
            .filter(|l| l.starts_with("skipped ("))
            .count(),
        n
    );
}

/// `plan` of a file PyTorch wrote gives plan 1 as PyTorch code too, beside tch's: the
/// loop over the module the file was made from, in the estimate's order, which Python
/// compiles (the wheel's Python; the shell line of an allocator setting aside). A tch
/// model's plan gives tch's only.
#[test]
fn plan_of_a_program_gives_its_pytorch_code() {
    let Some(dir) = cases() else { return };
    let python = common::corpus_python("plan's PyTorch code").unwrap();
    let path = dir.join("resnet18-dynamic.pt2");
    let input = ["--input", "16x3x64x64"];
    let mut args = vec!["estimate", path.to_str().unwrap(), "--train", "--csv"];
    args.extend(input);
    let out = common::cli(&args);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let reserved: u64 = common::csv_cell(&common::text(&out.stdout), "peak_reserved_bytes")
        .parse()
        .unwrap();
    // A budget the step as it is does not fit: plan 1 pulls a lever.
    let budget = format!("{}B", reserved * 7 / 10);
    let mut args = vec!["plan", path.to_str().unwrap(), "--memory", &budget];
    args.extend(input);
    let out = common::cli(&args);
    let text = common::text(&out.stdout);
    assert!(out.status.success(), "{text}{}", common::text(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("Plan 1 in PyTorch"))
        .unwrap_or_else(|| panic!("{text}"));
    let end = lines
        .iter()
        .position(|l| *l == "Plan 1 in a tch loop:")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(start < end, "{text}");
    let code: Vec<&str> = lines[start + 1..end]
        .iter()
        .map(|l| l.strip_prefix("    ").unwrap_or_else(|| panic!("{l:?}")))
        .filter(|l| !l.starts_with("export PYTORCH_CUDA_ALLOC_CONF="))
        .collect();
    assert!(code.iter().any(|l| l.contains("loss.backward()")), "{text}");
    assert!(code.iter().any(|l| l.contains("opt.step()")), "{text}");
    let program = code.join("\n");
    let out = Command::new(&python)
        .args([
            "-c",
            "import sys; compile(sys.argv[1], 'plan 1', 'exec')",
            &program,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program}\n{}",
        common::text(&out.stderr)
    );
    // tch code: no PyTorch.
    let out = common::cli(&["plan", "--model", "resnet18", "--memory", "200MB"]);
    let text = common::text(&out.stdout);
    assert!(text.contains("Plan 1 in a tch loop:"), "{text}");
    assert!(!text.contains("Plan 1 in PyTorch"), "{text}");
}
