//! `scripts/export.py`, the one-step export a PyTorch user runs (docs/export.md), held to
//! the model corpus: one model of each package the corpus takes from PyPI (torchvision's
//! ResNet-18, timm's ResNet-10-T, transformers' GPT-2 at the corpus's small
//! configuration) exported by the script with the corpus's settings, and the same models
//! made by `scripts/corpus.py` as the corpus makes them (traced; exported at a fixed
//! batch). Each of the script's files estimates within 0.5% of the corpus's file of the
//! same format and model, for inference and for an AdamW training step; its `.pt2` takes
//! another batch (the batch is dynamic, where the corpus's program takes its own only),
//! and `--memory` answers the largest batch for it. Bad input to the script is one line
//! and exit status 2.

mod common;

use std::path::Path;
use std::process::{Command, Output};

/// The script's model, its `--set`s, the corpus's name of the same model, its input.
const MODELS: &[(&str, &[&str], &str, &str)] = &[
    (
        "torchvision:resnet18",
        &["num_classes=10"],
        "tv-resnet18",
        "1x3x224x224",
    ),
    (
        "timm:resnet10t",
        &["num_classes=10"],
        "timm-resnet10t",
        "1x3x224x224",
    ),
    (
        "transformers:GPT2LMHeadModel",
        // scripts/corpus.py's hf-gpt2: its SMALL configuration, GPT-2's own names.
        &[
            "vocab_size=1000",
            "n_embd=64",
            "n_layer=2",
            "n_head=4",
            "n_positions=128",
        ],
        "hf-gpt2",
        "2x64:i64",
    ),
];

/// The estimate's error the script's files are held to, against the corpus's.
const WITHIN: f64 = 0.005;

fn run(python: &str, args: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    Command::new(python)
        .args(args.iter().map(|a| {
            if a.starts_with("scripts/") {
                root.join(a).into_os_string()
            } else {
                a.into()
            }
        }))
        .output()
        .expect("runs the wheel's Python")
}

/// `estimate FILE --input INPUT [--train --optimizer adamw] --csv`: the peak allocated.
fn peak(file: &Path, input: &str, train: bool) -> u64 {
    let mut args = vec![
        "estimate",
        file.to_str().unwrap(),
        "--input",
        input,
        "--csv",
    ];
    if train {
        args.extend(["--train", "--optimizer", "adamw"]);
    }
    let out = common::cli(&args);
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        common::text(&out.stderr)
    );
    common::csv_cell(&common::text(&out.stdout), "peak_allocated_bytes")
        .parse()
        .unwrap()
}

#[test]
fn the_scripts_files_estimate_as_the_corpuss_and_take_another_batch() {
    let Some(python) = common::corpus_python("scripts/export.py") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (corpus, mine) = (dir.path().join("corpus"), dir.path().join("script"));
    let names: Vec<&str> = MODELS.iter().map(|m| m.2).collect();
    for format in [&[][..], &["--pt2"][..]] {
        let mut args = vec!["scripts/corpus.py"];
        args.extend(format);
        args.extend(["--out", corpus.to_str().unwrap()]);
        args.extend(&names);
        let out = run(&python, &args);
        assert!(out.status.success(), "{}", common::text(&out.stderr));
    }
    for &(model, sets, name, input) in MODELS {
        let mut args = vec!["scripts/export.py", model, "--input", input];
        for s in sets {
            args.extend(["--set", s]);
        }
        args.extend(["--out", mine.to_str().unwrap(), "--name", name]);
        let out = run(&python, &args);
        let stdout = common::text(&out.stdout);
        assert!(
            out.status.success(),
            "{model}: {}",
            common::text(&out.stderr)
        );
        // What it wrote, each file in a line, and what to run next (docs/export.md shows
        // ResNet-18's lines).
        assert!(stdout.contains("input 0's batch dynamic"), "{stdout}");
        if name == "tv-resnet18" {
            let p = mine.join(name);
            let p = p.display();
            assert_eq!(
                stdout,
                format!(
                    "{p}.pt2: torch.export, eval mode, the training IR; input 0's batch \
                     dynamic\n{p}.pt: torch.jit.trace, eval mode (TorchScript takes other \
                     sizes)\nnext: tch-memprof estimate {p}.pt2 --input 1x3x224x224 --memory \
                     h100\n"
                )
            );
        }
        assert!(
            stdout.contains(&format!(
                "next: tch-memprof estimate {}",
                mine.join(name).display()
            )),
            "{stdout}"
        );
        for ext in ["pt", "pt2"] {
            let (theirs, ours) = (
                corpus.join(format!("{name}.{ext}")),
                mine.join(format!("{name}.{ext}")),
            );
            for train in [false, true] {
                let (want, got) = (peak(&theirs, input, train), peak(&ours, input, train));
                let err = got as f64 / want as f64 - 1.0;
                println!(
                    "{name}.{ext} {}: corpus {want} B, script {got} B ({:+.3}%)",
                    if train { "training" } else { "inference" },
                    100.0 * err
                );
                assert!(
                    err.abs() <= WITHIN,
                    "{name}.{ext}: the script's file estimates {got} B, the corpus's {want} B"
                );
            }
        }
        // The batch is dynamic: another batch estimates, and --memory searches it.
        let bigger = format!("3{}", &input[1..]);
        peak(&mine.join(format!("{name}.pt2")), &bigger, true);
        let file = mine.join(format!("{name}.pt2"));
        let out = common::cli(&[
            "estimate",
            file.to_str().unwrap(),
            "--input",
            input,
            "--memory",
            "4GiB",
        ]);
        let stdout = common::text(&out.stdout);
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        assert!(stdout.contains("largest batch that fits in"), "{stdout}");
        assert!(!stdout.contains("largest batch not searched"), "{stdout}");
    }
}

#[test]
fn bad_input_to_the_script_is_one_line_and_exit_2() {
    let Some(python) = common::corpus_python("scripts/export.py") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    for (args, says) in [
        (
            &["torchvision:resnet1000"][..],
            "torchvision has no model 'resnet1000'",
        ),
        (&["resnet18"][..], "is not PACKAGE:NAME or FILE.py:NAME"),
        (
            &["keras:resnet18"][..],
            "'keras' is not torchvision, timm, transformers",
        ),
        (&["timm:nope"][..], "timm has no model 'nope'"),
        (
            &["transformers:NopeForCausalLM"][..],
            "has no model class 'NopeForCausalLM'",
        ),
        (&["missing.py:Net"][..], "missing.py: no such file"),
        (
            &["torchvision:resnet18", "--input", "2x3xq"][..],
            "--input '2x3xq': the shape must be sizes",
        ),
        (
            &["torchvision:resnet18", "--input", "2x3:f8"][..],
            "the type 'f8' is not one of",
        ),
        (
            &["torchvision:resnet18", "--set", "x"][..],
            "--set 'x': give KEY=VALUE",
        ),
        (
            &["torchvision:resnet18", "--bogus"][..],
            "unrecognized arguments: --bogus",
        ),
    ] {
        let mut all = vec!["scripts/export.py"];
        all.extend(args);
        all.extend(["--out", out_dir]);
        let out = run(&python, &all);
        let stderr = common::text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("export: "), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?}: {stderr:?} does not say {says:?}"
        );
    }
    // A user's own module, from its file.
    let file = dir.path().join("net.py");
    std::fs::write(
        &file,
        "import torch\n\
         class Net(torch.nn.Module):\n\
         \x20   def __init__(self, width=8):\n\
         \x20       super().__init__()\n\
         \x20       self.fc = torch.nn.Linear(4, width)\n\
         \x20   def forward(self, x):\n\
         \x20       return self.fc(x).relu()\n",
    )
    .unwrap();
    let spec = format!("{}:Net", file.display());
    let out = run(&python, &["scripts/export.py", &spec, "--out", out_dir]);
    let stderr = common::text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("give its forward's inputs with --input"),
        "{stderr}"
    );
    let out = run(
        &python,
        &[
            "scripts/export.py",
            &spec,
            "--set",
            "width=16",
            "--input",
            "8x4",
            "--out",
            out_dir,
        ],
    );
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    // Its weights: a 4 -> 16 linear layer, 16 x 4 + 16 floats.
    let out = common::cli(&[
        "estimate",
        dir.path().join("Net.pt2").to_str().unwrap(),
        "--input",
        "8x4",
        "--csv",
    ]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let weights: u64 = common::csv_cell(&common::text(&out.stdout), "weights_bytes")
        .parse()
        .unwrap();
    assert_eq!(weights, 4 * (16 * 4 + 16));
}
