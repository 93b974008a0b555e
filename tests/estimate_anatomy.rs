//! The predicted step read as a profiled step is: `tch-memprof estimate --output-dir`
//! writes the files `tch-memprof profile` writes, from the same replay passes, in the
//! bytes the caching allocator charges. GPT-2 small (the built-in) trained with AdamW at
//! 4x512 tokens: the timeline's highest point is the predicted peak allocated, its
//! weights are the model's (as the allocator holds them), and AdamW's state reaches two
//! float32 tensors per weight.

mod common;

use std::collections::HashMap;

use common::{cli, text};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use tch_memprof::estimate::{Input, Mode, Model, Optimizer, Options};
use tch_memprof::Category;

/// GPT-2 small's published parameter count (tied head).
const GPT2_PARAMS: u64 = 124_439_808;

/// GPT-2 small's variables by size: 148 tensors, 50 of them above 1 MiB (the two
/// embeddings, and per block the attention's two weights and the MLP's two).
const GPT2_TENSORS: u64 = 148;
const GPT2_LARGE_TENSORS: u64 = 50;

/// The header of the timeline a profiled step writes, read from the file the profiler
/// writes for a small loop.
fn profiled_header() -> Vec<String> {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::linear(vs.root() / "fc", 16, 4, Default::default());
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut prof = common::quiet_csv(&vs, dir.path())
        .timeline_step(1)
        .build()
        .unwrap();
    let xs = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
    opt.backward_step(&net.forward(&xs).sum(Kind::Float));
    prof.record_stats();
    prof.epoch_end();
    let files = prof.peak_step_files().expect("the step's files");
    let mut r = csv::Reader::from_path(&files.timeline_csv).unwrap();
    r.headers().unwrap().iter().map(String::from).collect()
}

#[test]
fn the_predicted_step_is_written_as_a_profiled_step() {
    let header = profiled_header();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("gpt2");
    let args = [
        "estimate",
        "--model",
        "gpt2",
        "--input",
        "4x512:i64",
        "--train",
        "--optimizer",
        "adamw",
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--csv",
    ];
    let out = {
        let _serial = common::serial();
        cli(&args)
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let row: Vec<&str> = stdout.lines().nth(1).unwrap().split(',').collect();
    let weights: u64 = row[3].parse().unwrap();
    let peak: u64 = row[4].parse().unwrap();
    assert_eq!(weights, 4 * GPT2_PARAMS);
    for f in [
        "step.png",
        "step.svg",
        "timeline.csv",
        "layers.csv",
        "idle.csv",
        "summary.txt",
    ] {
        assert!(out_dir.join(f).is_file(), "{f} missing");
    }

    // The library's estimate of the same step: its weights as the allocator holds them.
    let e = {
        let _serial = common::serial();
        Model::builtin("gpt2")
            .unwrap()
            .estimate(
                &[Input::new(&[4, 512], Kind::Int64)],
                Mode::Train(Optimizer::AdamW),
                &Options::default(),
            )
            .unwrap()
    };
    assert_eq!(e.peak_allocated, peak);
    // Each block is charged its request rounded up to 512 B, plus the rest of a segment
    // too small to split: under 512 B in the small pool, at most 1 MiB in the large one.
    let slack = GPT2_TENSORS * 511 + GPT2_LARGE_TENSORS * (1 << 20);
    assert!(
        e.weights_allocated >= weights && e.weights_allocated <= weights + slack,
        "weights {weights} B held as {} B",
        e.weights_allocated
    );

    let mut r = csv::Reader::from_path(out_dir.join("timeline.csv")).unwrap();
    let got: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(got, header, "the header of a profiled step's timeline");
    let col: HashMap<&str, usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| (h.as_str(), i))
        .collect();
    let mut rows = 0;
    let (mut highest, mut highest_weights, mut opt_max) = (0u64, 0u64, 0u64);
    let mut phases = Vec::new();
    for rec in r.records() {
        let rec = rec.unwrap();
        let get = |c: &str| rec[col[c]].parse::<u64>().unwrap();
        let cats: u64 = Category::ALL
            .iter()
            .map(|c| get(&format!("{}_bytes", c.label().to_lowercase())))
            .sum();
        assert_eq!(cats, get("total_bytes"), "{rec:?}");
        assert!(get("peak_bytes") >= get("total_bytes"), "{rec:?}");
        // The weights are live through the step, as the allocator holds them.
        assert_eq!(
            get("param_bytes") + get("buffer_bytes"),
            e.weights_allocated,
            "{rec:?}"
        );
        if get("peak_bytes") > highest {
            highest = get("peak_bytes");
            highest_weights = get("param_bytes") + get("buffer_bytes");
        }
        opt_max = opt_max.max(get("opt_bytes"));
        let phase = rec[col["phase"]].to_string();
        if phases.last() != Some(&phase) {
            phases.push(phase);
        }
        rows += 1;
    }
    assert!(rows > 100, "{rows} ops");
    assert_eq!(phases, ["forward", "backward", "optimizer"]);
    // The timeline's highest point is the predicted peak allocated.
    assert_eq!(highest, peak);
    assert_eq!(highest_weights, e.weights_allocated);
    // AdamW's state: two float32 tensors per weight (charged as the weights are).
    assert!(
        opt_max >= 2 * weights && opt_max <= 2 * (weights + slack),
        "optimizer state {opt_max} B against 2 x {weights} B"
    );
    eprintln!(
        "gpt2 4x512 AdamW: peak {peak} B; weights {weights} B held as {} B; optimizer state up to {opt_max} B; {rows} ops",
        e.weights_allocated
    );

    // The step's profile in the library says the same.
    let step = e.step.as_ref().expect("the predicted step");
    assert_eq!(step.peak.bytes, peak);
    assert_eq!(step.peak.breakdown.total(), peak);
    assert_eq!(step.rows.len(), rows);
    assert_eq!(u64::from(e.peak_step), step.step);
    // Layers by GPT-2's module names, with the FLOPs of their matrix products: the
    // first block's attention projection, 4 x 512 tokens x 768 x 2304, 2 FLOPs each,
    // and the attention that follows it (its ops read no variable: they belong to the
    // layer that ran last), its two products over the full 512 x 512 scores of 12 heads
    // of 64, as PyTorch's FlopCounterMode counts them: 4 x 4 x 512^2 x 768.
    let qkv = step
        .layers
        .iter()
        .find(|l| l.layer == "transformer.h.0.attn.c_attn")
        .unwrap_or_else(|| {
            panic!(
                "layers: {:?}",
                step.layers.iter().map(|l| &l.layer).collect::<Vec<_>>()
            )
        });
    assert_eq!(
        qkv.forward_flops,
        2 * 4 * 512 * 768 * 2304 + 4 * 4 * 512 * 512 * 768
    );
}

#[test]
fn the_anatomy_of_the_predicted_step_is_on_the_terminal() {
    let out = {
        let _serial = common::serial();
        cli(&[
            "estimate",
            "--model",
            "resnet18",
            "--input",
            "8x3x64x64",
            "--train",
        ])
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let anatomy = stdout
        .split_once("anatomy")
        .map(|(_, a)| a)
        .unwrap_or_else(|| panic!("no anatomy:\n{stdout}"));
    for c in Category::ALL {
        assert!(
            anatomy.contains(c.label()),
            "{} missing:\n{stdout}",
            c.label()
        );
    }
    assert!(anatomy.contains("layers by activations"), "{stdout}");
}
