//! Several GPUs: the sharded estimate (`--fsdp N`, FSDP2) and the replicated one
//! (`--ddp N`). A rank's model states held to the padded-shard arithmetic of FSDP2's
//! source, computed here by hand for GPT-2; what sharding and DDP's buckets change in the
//! peak held to what an NVIDIA H200 measured (tests/data/gpu-truth/h200-2026-12-04, ranks
//! on one GPU with PyTorch's fake process group); bad input refused in one line.

mod common;

use std::collections::HashMap;
use std::path::Path;

use tch_memprof::estimate::{Ddp, Fsdp, Gpu, Input, Mode, Model, Optimizer, Options};

/// GPT-2 small's parameters by hand, as `[rows, row]` (dim 0, then the rest): the token
/// and position embeddings, 12 blocks, the final layer norm (the LM head is tied).
fn gpt2_params() -> Vec<[u64; 2]> {
    let (v, d, ctx) = (50257, 768, 1024);
    let mut p = vec![[v, d], [ctx, d], [d, 1], [d, 1]];
    for _ in 0..12 {
        // ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj: weights of d x out, biases.
        for (rows, row) in [(d, 1), (d, 1), (d, 3 * d), (3 * d, 1), (d, d), (d, 1)] {
            p.push([rows, row]);
        }
        for (rows, row) in [(d, 1), (d, 1), (d, 4 * d), (4 * d, 1), (4 * d, d), (d, 1)] {
            p.push([rows, row]);
        }
    }
    p
}

#[test]
fn gpt2_by_hand_is_124_million_parameters() {
    let n: u64 = gpt2_params().iter().map(|[r, c]| r * c).sum();
    assert_eq!(n, 124_439_808);
}

#[test]
fn sharded_weights_and_optimizer_state_are_the_padded_shard_arithmetic() {
    // One dry run at a time in a process.
    let _serial = common::serial();
    let model = Model::builtin("gpt2").unwrap();
    let input = Input::parse("8x1024", Some("i64")).unwrap();
    let options = Options::for_gpu(Gpu::named("h200").unwrap());
    // FSDP2's defaults, and bf16 mixed precision, which leaves the shards and the
    // optimizer state in the parameters' f32.
    let mixed = Fsdp {
        param_dtype: Some(tch::Kind::BFloat16),
        reduce_dtype: Some(tch::Kind::Float),
        ..Fsdp::over(8)
    };
    let mut ranks = Vec::new();
    for fsdp in [Fsdp::over(8), mixed] {
        let these = model
            .estimate_sharded(
                std::slice::from_ref(&input),
                Mode::Train(Optimizer::AdamW),
                &options,
                &fsdp,
            )
            .unwrap();
        assert_eq!(these.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 7]);
        ranks.extend(these);
    }
    // FSDP2: dim 0 split in ceil(d / 8) rows, every rank holding the padded shard; AdamW's
    // two moments the unpadded local shard (rank 7 of the 50257 vocabulary rows: 6276).
    // Whichever way a weight is laid out, only the vocabulary's 50257 rows do not divide
    // by 8, and they are the embedding's dim 0.
    let padded: u64 = gpt2_params()
        .iter()
        .map(|[r, c]| r.div_ceil(8) * c * 4)
        .sum();
    let local = |rank: u64| -> u64 {
        gpt2_params()
            .iter()
            .map(|[r, c]| {
                let rows = r.div_ceil(8);
                r.saturating_sub(rank * rows).min(rows) * c * 4
            })
            .sum()
    };
    assert_eq!(padded, (10_730_304 + 6283 * 768) * 4);
    for r in &ranks {
        assert_eq!(r.sharded_parameter_bytes, padded, "rank {}", r.rank);
        assert_eq!(
            r.optimizer_state_bytes,
            2 * local(u64::from(r.rank)),
            "rank {}",
            r.rank
        );
        // The categories at the peak add up to it.
        let sum: u64 = r.at_peak.iter().map(|(_, b)| b).sum();
        assert_eq!(sum, r.peak_allocated, "rank {}", r.rank);
        assert!(r.peak_reserved >= r.peak_allocated);
    }
    assert_eq!(local(7), local(0) - 7 * 768 * 4);
}

/// A measured case: name, world, rank, resharded after forward (FSDP2) or gradients as
/// bucket views (DDP), peak allocated.
type Case = (String, u32, u32, bool, u64);

/// The one-GPU run's peak allocated of `model` (the script's name), and its f32 cases of
/// `kind` (`fsdp2`, `ddp`) the H200 measured.
fn measured(model: &str, kind: &str) -> (u64, Vec<Case>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu-truth/h200-2026-12-04/ranks/measured.csv");
    let mut reader = csv::Reader::from_path(&path).expect("measured.csv");
    let headers = reader.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect(name);
    let rows: Vec<HashMap<&str, String>> = reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            [
                "case",
                "kind",
                "model",
                "world",
                "rank",
                "precision",
                "reshard",
                "measured_allocated",
            ]
            .into_iter()
            .map(|c| (c, r[col(c)].to_string()))
            .collect()
        })
        .collect();
    let single = rows
        .iter()
        .find(|r| r["case"] == format!("single.{model}"))
        .expect("the single-GPU case")["measured_allocated"]
        .parse()
        .unwrap();
    let cases = rows
        .iter()
        .filter(|r| r["kind"] == kind && r["model"] == model && r["precision"] == "f32")
        .map(|r| {
            (
                r["case"].clone(),
                r["world"].parse().unwrap(),
                r["rank"].parse().unwrap(),
                r["reshard"] == "reshard" || r["reshard"] == "view",
                r["measured_allocated"].parse().unwrap(),
            )
        })
        .collect();
    (single, cases)
}

/// Each measured f32 case of `kind` (GPT-2 small at 4x1024, ViT-B/16 at 32x3x224x224)
/// held as the two tests below say: the measured rank less the measured one-GPU run,
/// against `predict`'s rank less the one-GPU estimate in the same loop, in shares of the
/// measured one-GPU peak, within -0.5% to +2.5%. `predict` gives a case's predicted peak
/// allocated. Returns how many cases were held.
fn hold_changes(
    kind: &str,
    at_least: usize,
    predict: impl Fn(&Model, &[Input], &Options, &Case) -> u64,
) -> usize {
    // One dry run at a time in a process.
    let _serial = common::serial();
    let mut worst = 0f64;
    let mut failures = Vec::new();
    let mut held = 0;
    for (measured_model, builtin, shape, dtype) in [
        ("hf_gpt2", "gpt2", "4x1024", Some("i64")),
        ("hf_vit_base", "vit-b16", "32x3x224x224", None),
    ] {
        let (single, cases) = measured(measured_model, kind);
        assert!(
            cases.len() >= at_least,
            "{measured_model}: {} cases only",
            cases.len()
        );
        let model = Model::builtin(builtin).unwrap();
        let inputs = [Input::parse(shape, dtype).unwrap()];
        // The measured loop: zero_grad(set_to_none=True) after the loss, before
        // backward (scripts/gpu/ranks_truth.py), tch's placement and the default.
        let options = Options::for_gpu(Gpu::named("h200").unwrap());
        let ours_single = model
            .estimate(&inputs, Mode::Train(Optimizer::AdamW), &options)
            .unwrap()
            .peak_allocated;
        for case in cases {
            let ours = predict(&model, &inputs, &options, &case);
            let (name, allocated) = (&case.0, case.4);
            let measured_change = allocated as f64 - single as f64;
            let predicted_change = ours as f64 - ours_single as f64;
            let off = (predicted_change - measured_change) / single as f64;
            println!(
                "{name}: measured change {:+.3} GiB, predicted {:+.3} GiB ({:+.2}% of the one-GPU peak)",
                measured_change / 2f64.powi(30),
                predicted_change / 2f64.powi(30),
                100.0 * off
            );
            worst = worst.max(off.abs());
            held += 1;
            if !(-0.005..=0.025).contains(&off) {
                failures.push(name.clone());
            }
        }
    }
    println!("{held} ranks, worst: {:.2}%", 100.0 * worst);
    assert!(
        failures.is_empty(),
        "below -0.5% or above +2.5% of the one-GPU peak: {failures:?}"
    );
    held
}

/// What sharding changes: each measured rank's peak allocated less the measured
/// single-GPU peak of the same step (PyTorch's eager model of transformers, AdamW), against
/// the same difference predicted (the built-in model of the same architecture: its sharded
/// rank less its one-GPU estimate in the same loop). The one-GPU dry run of a built-in is
/// not PyTorch's eager run (docs/estimate.md); the sharding's own change is what this
/// holds, in shares of the measured one-GPU peak: never more than 0.5% lower than the
/// GPU's (a rank predicted too small costs a failed run), at most 2.5% higher. GPT-2
/// small at 4x1024 (measured: -0.00% to +2.03%) and ViT-B/16 at 32x3x224x224 (-0.17% to
/// -0.07%); the measured SmolLM2 has no built-in of its size. The loop is the measured
/// one: gradients set to none after the loss.
#[test]
fn what_sharding_changes_is_what_an_h200_measured() {
    hold_changes("fsdp2", 6, |model, inputs, options, case| {
        let (_, world, rank, reshard, _) = *case;
        // The script passed reshard_after_forward to the root too.
        let fsdp = Fsdp {
            reshard_after_forward: reshard,
            reshard_root: reshard,
            ..Fsdp::over(world)
        };
        let ranks = model
            .estimate_sharded(inputs, Mode::Train(Optimizer::AdamW), options, &fsdp)
            .unwrap();
        ranks
            .iter()
            .find(|r| r.rank == rank)
            .expect("rank 0 and N-1")
            .peak_allocated
    });
}

#[test]
fn bad_sharding_is_refused_in_one_line() {
    let base = [
        "estimate", "--model", "gpt2", "--input", "2x64:i64", "--train",
    ];
    for (extra, phrase) in [
        (&["--fsdp", "0"][..], "0"),
        (
            &["--fsdp", "2", "--fsdp-units", "model.layers.*"][..],
            "model.layers.*",
        ),
        (&["--fsdp", "2", "--memory", "h100"][..], "--memory"),
        (&["--fsdp-keep-unsharded"][..], "--fsdp"),
        (&["--fsdp", "2", "--ddp", "2"][..], "--ddp"),
        (&["--ddp", "0"][..], "0"),
        (
            &["--ddp", "2", "--fsdp-keep-unsharded"][..],
            "--fsdp-keep-unsharded",
        ),
        (
            &["--fsdp", "2", "--ddp-bucket-view"][..],
            "--ddp-bucket-view",
        ),
        (&["--ddp", "2", "--checkpoint", "1"][..], "checkpoint"),
        (
            &[
                "--fsdp",
                "2",
                "--fsdp-keep-unsharded",
                "--fsdp-reshard-root",
            ][..],
            "--fsdp-reshard-root",
        ),
        (&["--fsdp", "2", "--fsdp-param-dtype", "int8"][..], "int8"),
        (&["--fsdp-reduce-dtype", "f32"][..], "--fsdp"),
        (
            &["--ddp", "2", "--fsdp-param-dtype", "bf16"][..],
            "--fsdp-param-dtype",
        ),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = common::cli(&args);
        let err = common::text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(phrase), "{args:?}: {err}");
        assert!(
            !err.contains("libtorch") && !err.contains("panicked"),
            "{err}"
        );
    }
}

#[test]
fn the_command_prints_rank_0_and_rank_n_minus_1() {
    let out = common::cli(&[
        "estimate",
        "--model",
        "gpt2",
        "--input",
        "2x128:i64",
        "--train",
        "--optimizer",
        "adamw",
        "--fsdp",
        "8",
    ]);
    let text = common::text(&out.stdout);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    for phrase in [
        "FSDP2 over 8 ranks",
        "rank 0",
        "rank 7",
        "units: 12 (transformer.h.0 to transformer.h.11) and the root",
        "sharded parameters",
        "optimizer state",
        "NCCL",
    ] {
        assert!(text.contains(phrase), "{phrase}: {text}");
    }
    let out = common::cli(&[
        "estimate",
        "--model",
        "gpt2",
        "--input",
        "2x128:i64",
        "--train",
        "--ddp",
        "4",
    ]);
    let text = common::text(&out.stdout);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    for phrase in ["DDP over 4 ranks", "every rank", "gradient buckets", "NCCL"] {
        assert!(text.contains(phrase), "{phrase}: {text}");
    }
}

/// DDP's buckets, held the same way: each measured rank less the measured one-GPU run,
/// against the predicted rank less the one-GPU estimate, in shares of the measured
/// one-GPU peak: never more than 0.5% lower, at most 2.5% higher. GPT-2 small and
/// ViT-B/16, gradients copied into the buckets and as views into them: -0.13% to +0.01%.
#[test]
fn what_ddp_changes_is_what_an_h200_measured() {
    let held = hold_changes("ddp", 2, |model, inputs, options, case| {
        let ddp = Ddp {
            world: case.1,
            gradient_as_bucket_view: case.3,
        };
        model
            .estimate_replicated(inputs, Mode::Train(Optimizer::AdamW), options, &ddp)
            .unwrap()
            .peak_allocated
    });
    assert!(held >= 4, "{held} DDP ranks only");
}

/// `plan --gpus 8` for Llama 3 8B with AdamW on H100s: the cheapest sharding that fits is
/// named with its per-rank peak reserved, which is the peak `estimate --fsdp 8` gives for
/// the same levers, within the budget; every plan listed before it is over the budget.
#[test]
fn plan_over_gpus_names_the_cheapest_sharding_that_fits() {
    let base = [
        "--model",
        "llama3-8b",
        "--input",
        "1x4096:i64",
        "--optimizer",
        "adamw",
    ];
    let mut args = vec!["plan"];
    args.extend(base);
    args.extend(["--memory", "h100", "--gpus", "8"]);
    let out = common::cli(&args);
    let text = common::text(&out.stdout);
    assert!(out.status.success(), "{text}{}", common::text(&out.stderr));
    let line = text
        .lines()
        .find(|l| l.starts_with("cheapest that fits on 8 GPUs: plan "))
        .unwrap_or_else(|| panic!("no cheapest plan named: {text}"));
    // "plan K (X GiB per rank reserved)"
    let k: usize = line["cheapest that fits on 8 GPUs: plan ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("│ ")
                && l[4..]
                    .trim_start()
                    .starts_with(|c: char| c.is_ascii_digit())
        })
        .collect();
    assert!(rows.len() >= 3, "{text}");
    for row in &rows[..k - 1] {
        assert!(
            row.contains("no,"),
            "a cheaper plan fits but is not named: {row}"
        );
    }
    assert!(rows[k - 1].contains("yes,"), "{}", rows[k - 1]);
    // As docs/estimate.md says: neither DDP nor FSDP2 alone (plans 1 to 3) fits, FSDP2
    // with bf16 mixed precision does.
    assert!(
        k > 3 && rows[k - 1].contains("bf16 mixed precision"),
        "{text}"
    );
    // Plan K's levers through estimate: the same per-rank peak reserved.
    let named = rows[k - 1];
    let mut est = vec!["estimate"];
    est.extend(base);
    est.extend(["--train", "--gpu", "h100", "--fsdp", "8"]);
    if named.contains("kept") {
        est.push("--fsdp-keep-unsharded");
    }
    if named.contains("bf16") {
        est.extend(["--fsdp-param-dtype", "bf16", "--fsdp-reduce-dtype", "f32"]);
    }
    if named.contains("checkpointing") {
        est.extend(["--checkpoint", "1"]);
    }
    let out = common::cli(&est);
    let etext = common::text(&out.stdout);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let reserved_row = etext
        .lines()
        .find(|l| l.contains("peak reserved"))
        .expect("peak reserved row");
    let cells: Vec<&str> = reserved_row
        .split('┆')
        .map(|c| c.trim().trim_end_matches('│').trim())
        .collect();
    let biggest = cells[1..].iter().max_by(|a, b| {
        let v = |s: &str| s.split(' ').next().unwrap().parse::<f64>().unwrap();
        v(a).total_cmp(&v(b))
    });
    let biggest = biggest.unwrap();
    assert!(
        line.contains(&format!("({biggest} per rank reserved)")),
        "{line} vs {reserved_row}"
    );
    let out = common::cli(&["plan", "--model", "gpt2", "--memory", "h100", "--gpus", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::text(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--gpus 0"), "{err}");
}

/// `plan --gpus N` where nothing fits says how many GPUs would do: the leanest plan on N
/// GPUs (the smallest peak) fits on the world it names, with the peak it names (`plan
/// --gpus W` lists that plan as fitting, at that peak), and not on half of it; and where
/// no world up to 1024 would do (a rank's activations stay), it says so, and `plan --gpus
/// 1024` agrees.
#[test]
fn plan_over_too_few_gpus_says_how_many_would_do() {
    let plan = |batch: &str, gpus: u32| {
        let input = format!("{batch}x4096:i64");
        let gpus = gpus.to_string();
        let out = common::cli(&[
            "plan",
            "--model",
            "llama3-8b",
            "--input",
            &input,
            "--optimizer",
            "adamw",
            "--memory",
            "24GiB",
            "--gpus",
            &gpus,
        ]);
        (out.status.code(), common::text(&out.stdout))
    };
    // Row `k` of a plan table: its peak reserved and whether it fits.
    let row = |text: &str, k: usize| -> (String, bool) {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("│ {k} ┆")))
            .unwrap_or_else(|| panic!("no plan {k}: {text}"));
        let cells: Vec<&str> = line.split('┆').map(str::trim).collect();
        (cells[2].to_string(), cells[3].starts_with("yes"))
    };
    // The "with more GPUs" line of a plan where nothing fits (exit status 1).
    let more = |batch: &str, gpus: u32| -> String {
        let (code, text) = plan(batch, gpus);
        assert_eq!(code, Some(1), "{text}");
        text.lines()
            .find(|l| l.starts_with("with more GPUs: plan "))
            .unwrap_or_else(|| panic!("no world named: {text}"))
            .to_string()
    };
    let line = more("1", 2);
    // "with more GPUs: plan K fits on W (X GiB per rank reserved; ..."
    let words: Vec<&str> = line.split(' ').collect();
    let k: usize = words[4].parse().unwrap();
    assert_eq!(words[5..7], ["fits", "on"], "{line}");
    let world: u32 = words[7].parse().unwrap();
    let peak = line
        .split('(')
        .nth(1)
        .unwrap()
        .split(" per rank")
        .next()
        .unwrap();
    assert!(world > 2 && world.is_power_of_two(), "{line}");
    let (there, fits) = row(&plan("1", world).1, k);
    assert!(fits, "plan {k} on {world} GPUs does not fit: {there}");
    assert_eq!(there, peak, "{line}");
    if world / 2 > 2 {
        let (half, fits) = row(&plan("1", world / 2).1, k);
        assert!(!fits, "plan {k} fits on {} GPUs already: {half}", world / 2);
    }

    let line = more("64", 8);
    assert!(line.contains("does not fit on up to 1024"), "{line}");
    let k: usize = line.split(' ').nth(4).unwrap().parse().unwrap();
    let (code, most) = plan("64", 1024);
    assert_eq!(code, Some(1), "{most}");
    assert!(!row(&most, k).1, "{most}");
}

/// `--csv` with `--fsdp` or `--ddp`: a row per rank (0 and N-1; DDP's one), the peaks,
/// and the categories at the peak, which add up to the peak allocated.
#[test]
fn ranks_as_csv_add_up_to_their_peaks() {
    for (flag, ranks) in [("--fsdp", vec!["0", "7"]), ("--ddp", vec!["0"])] {
        let out = common::cli(&[
            "estimate",
            "--model",
            "gpt2",
            "--input",
            "2x128:i64",
            "--train",
            flag,
            "8",
            "--csv",
        ]);
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        let text = common::text(&out.stdout);
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let headers = reader.headers().unwrap().clone();
        let col = |name: &str| headers.iter().position(|h| h == name).expect(name);
        let mut seen = Vec::new();
        for row in reader.records() {
            let row = row.unwrap();
            assert_eq!(&row[col("parallel")], &flag[2..], "{text}");
            assert_eq!(&row[col("world")], "8");
            seen.push(row[col("rank")].to_string());
            let value = |name: &str| -> u64 { row[col(name)].parse().unwrap() };
            let sum: u64 = headers
                .iter()
                .filter(|h| h.ends_with("_bytes") && !h.starts_with("peak_"))
                .map(value)
                .sum();
            assert_eq!(sum, value("peak_allocated_bytes"), "{text}");
            assert!(value("peak_reserved_bytes") >= value("peak_allocated_bytes"));
        }
        assert_eq!(seen, ranks, "{text}");
    }
}

/// Every row of the H200's ranks file for `model` (the script's name), by column.
fn measured_rows(model: &str) -> Vec<HashMap<String, String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu-truth/h200-2026-12-04/ranks/measured.csv");
    let mut reader = csv::Reader::from_path(&path).expect("measured.csv");
    let headers = reader.headers().unwrap().clone();
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            headers
                .iter()
                .zip(r.iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        })
        .filter(|r| r["model"] == model)
        .collect()
}

/// FSDP2 as a measured case ran it: `fully_shard` on each block and on the root with the
/// case's `reshard_after_forward` (the script passed it to the root too), and for
/// `bf16` `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`.
fn fsdp_of(row: &HashMap<String, String>) -> Fsdp {
    let reshard = row["reshard"] == "reshard";
    let bf16 = row["precision"] == "bf16";
    Fsdp {
        reshard_after_forward: reshard,
        reshard_root: reshard,
        param_dtype: bf16.then_some(tch::Kind::BFloat16),
        reduce_dtype: bf16.then_some(tch::Kind::Float),
        ..Fsdp::over(row["world"].parse().unwrap())
    }
}

/// ViT-B/16 (torchvision's architecture; the measured model is transformers' ViT, the
/// same layers) at 32x3x224x224 with AdamW: every rank the H200 measured (one GPU; FSDP2
/// at N = 2, 4, 8, ranks 0 and N-1, f32 and bf16 mixed precision, resharded and kept;
/// DDP at N = 4), each rank's own predicted peaks against the measured ones: allocated
/// within 2%, reserved within 3%, as the issue asks of a sharded estimate. Measured with
/// this version: allocated -0.0% to +0.5%, reserved -1.3% to +1.8%.
#[test]
fn vit_ranks_are_what_an_h200_measured() {
    let _serial = common::serial();
    let model = Model::builtin("vit-b16").unwrap();
    let inputs = [Input::parse("32x3x224x224", None).unwrap()];
    let options = Options::for_gpu(Gpu::named("h200").unwrap());
    let mode = Mode::Train(Optimizer::AdamW);
    let mut failures = Vec::new();
    let mut held = 0;
    for row in measured_rows("hf_vit_base") {
        let (alloc, reserved) = match row["kind"].as_str() {
            "single" => {
                let e = model.estimate(&inputs, mode, &options).unwrap();
                (e.peak_allocated, e.peak_reserved)
            }
            "fsdp2" => {
                let rank: u32 = row["rank"].parse().unwrap();
                let ranks = model
                    .estimate_sharded(&inputs, mode, &options, &fsdp_of(&row))
                    .unwrap();
                let r = ranks
                    .iter()
                    .find(|r| r.rank == rank)
                    .expect("rank 0 or N-1");
                (r.peak_allocated, r.peak_reserved)
            }
            "ddp" => {
                let ddp = Ddp {
                    world: row["world"].parse().unwrap(),
                    gradient_as_bucket_view: row["reshard"] == "view",
                };
                let r = model
                    .estimate_replicated(&inputs, mode, &options, &ddp)
                    .unwrap();
                (r.peak_allocated, r.peak_reserved)
            }
            other => panic!("a case of kind {other}"),
        };
        let off = |ours: u64, theirs: &str| {
            let theirs: f64 = theirs.parse().unwrap();
            (ours as f64 - theirs) / theirs
        };
        let (a, r) = (
            off(alloc, &row["measured_allocated"]),
            off(reserved, &row["measured_reserved"]),
        );
        println!(
            "{}: allocated {:+.2}%, reserved {:+.2}%",
            row["case"],
            100.0 * a,
            100.0 * r
        );
        held += 1;
        if a.abs() > 0.02 || r.abs() > 0.03 {
            failures.push(row["case"].clone());
        }
    }
    assert!(held >= 12, "{held} cases only");
    assert!(
        failures.is_empty(),
        "allocated off by more than 2% or reserved by more than 3%: {failures:?}"
    );
}

/// GPT-2 under bf16 mixed precision: the built-in GPT-2's activations are not eager
/// transformers' (docs/estimate.md), and mixed precision halves them, so what is held is
/// what the world size changes between the resharded bf16 ranks the H200 measured (N = 2
/// and 8, ranks 0 and N-1: the shards, gradient shards and AdamW state in f32, the rest
/// the same): each less the measured rank 0 of N = 8, against the same predicted, in
/// shares of the measured one-GPU peak, within -0.5% to +2.5% as the f32 ranks are.
/// Measured with this version: 0.00% to +0.01%. The one kept case (N = 4) is not held
/// here: its peak and the resharded ranks' are at different places (the measured
/// resharded ranks peak in eager's loss, with the root resharded; docs/estimate.md).
#[test]
fn what_sharding_changes_under_mixed_precision_is_what_an_h200_measured() {
    let _serial = common::serial();
    let model = Model::builtin("gpt2").unwrap();
    let inputs = [Input::parse("4x1024", Some("i64")).unwrap()];
    let options = Options::for_gpu(Gpu::named("h200").unwrap());
    let mode = Mode::Train(Optimizer::AdamW);
    let rows = measured_rows("hf_gpt2");
    let single: f64 = rows.iter().find(|r| r["kind"] == "single").unwrap()["measured_allocated"]
        .parse()
        .unwrap();
    let predict = |row: &HashMap<String, String>| -> (f64, f64) {
        let rank: u32 = row["rank"].parse().unwrap();
        let ranks = model
            .estimate_sharded(&inputs, mode, &options, &fsdp_of(row))
            .unwrap();
        let ours = ranks
            .iter()
            .find(|r| r.rank == rank)
            .unwrap()
            .peak_allocated;
        (ours as f64, row["measured_allocated"].parse().unwrap())
    };
    let bf16: Vec<_> = rows
        .iter()
        .filter(|r| r["kind"] == "fsdp2" && r["precision"] == "bf16" && r["reshard"] == "reshard")
        .collect();
    let base = bf16
        .iter()
        .find(|r| r["world"] == "8" && r["rank"] == "0")
        .expect("the bf16 rank 0 of N = 8");
    let (ours_base, theirs_base) = predict(base);
    let mut failures = Vec::new();
    for row in bf16.iter().filter(|r| r["case"] != base["case"]) {
        let (ours, theirs) = predict(row);
        let off = ((ours - ours_base) - (theirs - theirs_base)) / single;
        println!(
            "{}: measured {:+.3} GiB from N = 8's rank 0, predicted {:+.3} GiB ({:+.2}%)",
            row["case"],
            (theirs - theirs_base) / 2f64.powi(30),
            (ours - ours_base) / 2f64.powi(30),
            100.0 * off
        );
        if !(-0.005..=0.025).contains(&off) {
            failures.push(row["case"].clone());
        }
    }
    assert!(bf16.len() >= 4, "{} bf16 cases only", bf16.len());
    assert!(failures.is_empty(), "{failures:?}");
}
