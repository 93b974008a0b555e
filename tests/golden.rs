//! Golden files of what the CLI prints and writes: `estimate` (terminal, CSV, the
//! predicted step's files), `plan` (terminal, CSV; of a model and of a recorded run),
//! `replay` of a real PyTorch snapshot (terminal, CSV), and a profiled run's CSV files,
//! each held byte for byte to its snapshot in `tests/snapshots/` (insta). A change to
//! the code that prints them must leave them as they are, or change the snapshot in the
//! same commit, where the diff shows what a user will see differently.
//!
//! What varies from run to run is filtered out before the comparison: the dry run's
//! wall time in the estimate's table and the process's resident memory.
//!
//! The snapshots were made with PyTorch 2.11's libtorch; under another (the compat
//! suite) a dry run may take other kernels' sizes, so they are held under 2.11 only, and
//! skipped by name otherwise (`tests/data/version-keyed.txt`).
//!
//! After a deliberate change: `INSTA_UPDATE=always scripts/with-libtorch.sh cargo test
//! --test golden`, then read the diff of `tests/snapshots/` before committing it
//! (`cargo insta review` does the same, where cargo-insta is installed).

mod common;

use std::path::Path;

/// The run-to-run variation of the outputs, as insta filters: (pattern, replacement).
const FILTERS: &[(&str, &str)] = &[
    // The estimate table's time column: the dry run's wall time (its padding with it;
    // a run of 10 s or more would widen the column and still differ).
    (r" +\d+\.\d\d s ([┆│])", " [time] $1"),
    (
        r"This estimate's host memory: [0-9.]+ [KMG]?i?B",
        "This estimate's host memory: [rss]",
    ),
];

/// Holds `text` to the snapshot `name`, the run's variation filtered out (under the
/// libtorch the snapshots were made with; see [`made_with_this_libtorch`]).
fn golden(name: &str, args: &[&str], text: &str) {
    if !made_with_this_libtorch() {
        return;
    }
    let mut settings = insta::Settings::clone_current();
    for (pattern, replacement) in FILTERS {
        settings.add_filter(pattern, *replacement);
    }
    settings.set_description(format!("tch-memprof {}", args.join(" ")));
    settings.set_omit_expression(true);
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, text));
}

/// Whether this libtorch is the one the snapshots were made with (2.11); otherwise the
/// comparisons are skipped by name (`tests/data/version-keyed.txt`), said once. The
/// commands still run (and must succeed) there.
fn made_with_this_libtorch() -> bool {
    static SAME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAME.get_or_init(|| common::on_the_measured_libtorch("golden::comparisons"))
}

/// A command's standard output held to its snapshot.
fn golden_stdout(name: &str, args: &[&str]) {
    golden(name, args, &common::cli_ok(args));
}

#[test]
fn estimate_terminal_output() {
    golden_stdout(
        "estimate_resnet18_train",
        &[
            "estimate", "--model", "resnet18", "--train", "--gpu", "h100",
        ],
    );
    golden_stdout(
        "estimate_gpt2_batches_memory",
        &[
            "estimate",
            "--model",
            "gpt2",
            "--input",
            "1x256",
            "--batch-sizes",
            "1,4",
            "--train",
            "--autocast",
            "bf16",
            "--memory",
            "rtx4090",
        ],
    );
    golden_stdout(
        "estimate_vit_inference_all_idle",
        &[
            "estimate",
            "--model",
            "vit-b16",
            "--gpu",
            "a100-80gb",
            "--all-idle",
            "--top",
            "3",
        ],
    );
    golden_stdout(
        "estimate_bert_checkpoint",
        &[
            "estimate",
            "--model",
            "bert-base",
            "--input",
            "2x128",
            "--train",
            "--optimizer",
            "sgd-momentum",
            "--checkpoint",
            "2",
            "--gpu",
            "h200",
        ],
    );
}

#[test]
fn estimate_csv() {
    golden_stdout(
        "estimate_csv_bert_batches",
        &[
            "estimate",
            "--model",
            "bert-base",
            "--input",
            "1x128",
            "--batch-sizes",
            "1,8",
            "--memory",
            "24GB",
            "--csv",
        ],
    );
    golden_stdout(
        "estimate_csv_resnet50_train",
        &[
            "estimate",
            "--model",
            "resnet50",
            "--train",
            "--optimizer",
            "adam",
            "--gpu",
            "h200",
            "--csv",
        ],
    );
}

#[test]
fn estimate_output_dir_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let args = [
        "estimate",
        "--model",
        "alexnet",
        "--input",
        "2x3x224x224",
        "--train",
        "--gpu",
        "h100",
        "--output-dir",
        out,
    ];
    common::cli_ok(&args);
    // The plots are pictures of the same numbers (tests/timeline_files.rs checks them).
    for file in ["summary.txt", "timeline.csv", "layers.csv", "idle.csv"] {
        let text = std::fs::read_to_string(Path::new(out).join(file)).unwrap();
        golden(&format!("estimate_output_dir_{file}"), &args[..9], &text);
    }
}

#[test]
fn plan_output() {
    golden_stdout(
        "plan_gpt2",
        &[
            "plan", "--model", "gpt2", "--memory", "24GB", "--input", "8x1024",
        ],
    );
    golden_stdout(
        "plan_gpt2_csv",
        &[
            "plan", "--model", "gpt2", "--memory", "24GB", "--input", "8x1024", "--csv",
        ],
    );
    golden_stdout(
        "plan_resnet50_h100",
        &[
            "plan", "--model", "resnet50", "--memory", "h100", "--batch", "256",
        ],
    );
}

#[test]
fn replay_and_plan_of_a_pytorch_snapshot() {
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu-truth/h200-2026-11-26/leak-graph.allocator-snapshot.pickle");
    let path = snapshot.to_str().unwrap();
    let cases: [(&str, &[&str]); 5] = [
        ("replay_leak_graph", &["replay"]),
        (
            "replay_leak_graph_csv",
            &["replay", "--csv", "--memory", "95MiB"],
        ),
        (
            "replay_leak_graph_csv_conf",
            &[
                "replay",
                "--csv",
                "--alloc-conf",
                "expandable_segments:True",
            ],
        ),
        ("plan_recorded", &["plan", "--memory", "95MiB"]),
        ("plan_recorded_csv", &["plan", "--memory", "95MiB", "--csv"]),
    ];
    for (name, args) in cases {
        let mut with_path = vec![args[0], path];
        with_path.extend(&args[1..]);
        // The path as the tests name it, not this checkout's.
        let text = common::cli_ok(&with_path).replace(env!("CARGO_MANIFEST_DIR"), "<repo>");
        with_path[1] = "<snapshot>";
        golden(name, &with_path, &text);
    }
}

/// What varies from run to run in the profiler's CSV files, as columns or as the keys
/// of the run file's key,value rows: when a row was written or the run started, the
/// process's resident memory (the test's, not the model's), and the versions.
const VARYING: &[&str] = &[
    "timestamp",
    "resident_bytes",
    "peak_resident_bytes",
    "started",
    "libtorch",
    "tch_memprof",
];

/// A CSV file with what [`VARYING`] names blanked.
fn steady_csv(path: &Path) -> String {
    let mut r = csv::Reader::from_path(path).unwrap();
    let header = r.headers().unwrap().clone();
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(&header).unwrap();
    for row in r.records() {
        let row = row.unwrap();
        let varying_key = header.get(0) == Some("key") && VARYING.contains(&&row[0]);
        let cells = header.iter().zip(row.iter()).map(|(h, v)| {
            if VARYING.contains(&h) || varying_key && h == "value" {
                "-"
            } else {
                v
            }
        });
        w.write_record(cells).unwrap();
    }
    String::from_utf8(w.into_inner().unwrap()).unwrap()
}

/// A profiled run's CSV files: the reference MLP trained with Adam on the CPU, two
/// epochs of two iterations, every CSV the profiler writes (the wide per-variable one
/// included).
#[test]
fn profiled_run_csv_files() {
    let _guard = common::serial();
    tch::manual_seed(0);
    let dir = tempfile::tempdir().unwrap();
    let mut mlp = common::mlp_with_adam(1e-3);
    let mut profiler = common::quiet_csv(&mlp.vs, dir.path())
        .wide_csv(true)
        .build()
        .unwrap();
    for _ in 0..2 {
        for _ in 0..2 {
            mlp.step();
            profiler.record_stats();
        }
        profiler.epoch_end();
    }
    assert_eq!(profiler.failures(), 0);
    drop(profiler);
    let mut paths: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for path in paths {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // The files are named after the run (its start time): the part after it.
        let kind = name.split_once('_').map_or(name.as_str(), |(_, k)| k);
        golden(
            &format!("profiled_{kind}"),
            &["(profiled MLP, CPU)"],
            &steady_csv(&path),
        );
    }
}

/// The README's report is what the quickstart prints at step 60 (its default run, on the
/// CPU, in a folder of its own: it writes CSV there), but the resident memory, which
/// varies from run to run, and the peak allocated, which holds the CPU's convolution
/// temporaries (they vary with the CPU's kernels): that one is held within 5%.
#[test]
fn the_readme_shows_what_the_quickstart_prints() {
    if !made_with_this_libtorch() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/quickstart");
    if !example.exists() {
        common::cannot_run(&format!(
            "the README's quickstart report: {} is not built (a whole `cargo test` builds it)",
            example.display()
        ));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(&example)
        .args(["--device", "cpu"])
        .current_dir(dir.path())
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let printed = common::text(&out.stdout);
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let block = readme
        .split_once("<!-- output quickstart")
        .and_then(|(_, rest)| rest.split_once("```text\n"))
        .and_then(|(_, rest)| rest.split_once("```\n<!-- end quickstart -->"))
        .map(|(block, _)| block)
        .expect("README.md: the quickstart block between its markers");
    let first = block.lines().next().unwrap();
    let start = printed
        .find(first)
        .unwrap_or_else(|| panic!("the quickstart did not print {first:?}:\n{printed}"));
    let lines = block.lines().count();
    let shown: Vec<&str> = printed[start..].lines().take(lines).collect();
    // (the row, the cell's index among the row's cells) of the peak allocated.
    let peak = |text: &str| -> f64 {
        let row = text.lines().find(|l| l.contains("│ allocated ")).unwrap();
        let cell = row.split(['┆', '│']).nth(3).unwrap().trim();
        cell.trim_end_matches(" MiB").parse().unwrap()
    };
    let (readme_peak, printed_peak) = (peak(block), peak(&shown.join("\n")));
    assert!(
        (printed_peak / readme_peak - 1.0).abs() <= 0.05,
        "peak allocated {printed_peak} MiB, the README shows {readme_peak} MiB"
    );
    let steady = |l: &str| -> String {
        if l.contains("resident (process RSS)") {
            "[resident]".into()
        } else if l.contains("│ allocated ") {
            l.rsplit_once('┆').unwrap().0.to_string()
        } else {
            l.to_string()
        }
    };
    let want: Vec<String> = block.lines().map(steady).collect();
    let got: Vec<String> = shown.iter().map(|l| steady(l)).collect();
    assert_eq!(
        got.join("\n"),
        want.join("\n"),
        "README.md's quickstart report against what the quickstart printed"
    );
}

/// The estimate's, the plan's and the replay's tables at 60 columns: each cell wraps
/// between words, so every word of the table (its headers' `allocated`, `reserved`, a
/// setting such as `expandable_segments:True` that a user copies) is whole on one line.
#[test]
fn tables_at_60_columns_split_no_word() {
    let snapshot = "tests/data/gpu-truth/h200-2026-11-26/leak-graph.allocator-snapshot.pickle";
    let runs: [(&[&str], &[&str]); 3] = [
        (
            &[
                "estimate", "--model", "resnet18", "--train", "--memory", "24GB",
            ],
            &["weights", "baseline", "allocated", "reserved"],
        ),
        (
            &[
                "plan", "--model", "resnet18", "--memory", "1GB", "--batch", "64",
            ],
            &["reserved"],
        ),
        (
            &[
                "replay",
                snapshot,
                "--alloc-conf",
                "expandable_segments:True",
            ],
            &["allocated", "reserved", "expandable_segments:True"],
        ),
    ];
    for (args, words) in runs {
        let out = common::cli_at_width(args, 60);
        let text = common::text(&out.stdout);
        // The table's rows: the lines with its borders.
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with('│') || l.starts_with('┌'))
            .collect();
        assert!(!rows.is_empty(), "{args:?}: no table in {text}");
        let cells: Vec<&str> = rows
            .iter()
            .flat_map(|l| l.split(['│', '┆']))
            .flat_map(str::split_whitespace)
            .collect();
        for w in words {
            assert!(cells.contains(w), "{args:?}: {w:?} is not whole in\n{text}");
        }
        // Wrapped: the table is narrower than it is unwrapped.
        let unwrapped = common::text(&common::cli(args).stdout);
        let widest = |t: &str| {
            t.lines()
                .filter(|l| l.starts_with('┌'))
                .map(|l| l.chars().count())
                .max()
        };
        assert!(
            widest(&text) < widest(&unwrapped),
            "{args:?}: not wrapped:\n{text}"
        );
    }
}
