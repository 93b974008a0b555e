//! `tch-memprof plan` and `Model::plan`: the plan that fits stays within the budget, a
//! tighter budget never gives a higher predicted peak, the step as it is comes first when
//! it fits, and the exit status says whether anything fits.

mod common;

use common::{cli, text};
use tch::Kind;
use tch_memprof::estimate::{Input, Mode, Model, Optimizer, Options};

const MIB: u64 = 1 << 20;

#[test]
fn tighter_budgets_never_give_a_higher_peak_and_the_plan_stays_within() {
    let _serial = common::serial();
    let model = Model::builtin("resnet18").unwrap();
    let input = Input::new(&[8, 3, 64, 64], Kind::Float);
    let options = Options::default();
    let asis = model
        .estimate(
            std::slice::from_ref(&input),
            Mode::Train(Optimizer::AdamW),
            &options,
        )
        .unwrap();
    // From above the step as it is down to where nothing fits.
    let mut last: Option<u64> = None;
    let mut saw_none = false;
    let mut budget = asis.peak_reserved + 64 * MIB;
    while budget > 16 * MIB {
        let plans = model
            .plan(
                std::slice::from_ref(&input),
                Optimizer::AdamW,
                &options,
                budget,
            )
            .unwrap();
        match plans.fits.first() {
            Some(p) => {
                assert!(p.estimate.peak_reserved <= budget);
                assert_eq!(p.micro_batch * i64::from(p.config.accumulate), 8);
                if let Some(prev) = last {
                    assert!(
                        p.estimate.peak_reserved <= prev,
                        "budget {budget}: {} > {prev}",
                        p.estimate.peak_reserved
                    );
                }
                last = Some(p.estimate.peak_reserved);
                assert!(
                    !saw_none,
                    "a plan fits {budget} though none fit a larger budget"
                );
            }
            None => {
                saw_none = true;
                let s = plans.smallest.expect("the smallest peak reached");
                assert!(s.estimate.peak_reserved > budget);
            }
        }
        budget = budget * 3 / 4;
    }
    assert!(saw_none, "the sweep reaches budgets nothing fits");
}

#[test]
fn the_step_as_it_is_comes_first_when_it_fits() {
    let _serial = common::serial();
    let model = Model::builtin("resnet18").unwrap();
    let input = Input::new(&[4, 3, 64, 64], Kind::Float);
    let options = Options::default();
    let asis = model
        .estimate(
            std::slice::from_ref(&input),
            Mode::Train(Optimizer::Adam),
            &options,
        )
        .unwrap();
    let plans = model
        .plan(
            std::slice::from_ref(&input),
            Optimizer::Adam,
            &options,
            asis.peak_reserved,
        )
        .unwrap();
    let first = &plans.fits[0];
    assert_eq!(first.config.accumulate, 1);
    assert_eq!(first.config.optimizer, Optimizer::Adam);
    assert!(first.config.allocator_conf.is_empty());
    assert_eq!(first.estimate.peak_reserved, asis.peak_reserved);
    assert_eq!(first.estimate.peak_allocated, asis.peak_allocated);
    // The breakdown is the predicted step's categories at its peak, in the bytes the
    // caching allocator charges: each block its request rounded up to 512 B, and its
    // unsplit rest (under 512 B in the small pool, at most 1 MiB in the large one). So
    // the weights are torchvision's ResNet-18 tensors (tch's, here) each charged that
    // way, and Adam's state is two float32 tensors per trainable one.
    let parts = tch_memprof::estimate::breakdown(first);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _net = tch::vision::resnet::resnet18(&vs.root(), 1000);
    let bound = |trainable_only: bool| {
        let vars = vs.variables();
        let trainable: Vec<_> = vs
            .trainable_variables()
            .iter()
            .map(|t| t.data_ptr())
            .collect();
        let (mut raw, mut slack) = (0u64, 0u64);
        for t in vars.values() {
            if trainable_only && !trainable.contains(&t.data_ptr()) {
                continue;
            }
            let bytes = t.numel() as u64 * 4;
            raw += bytes;
            slack += if bytes > 1 << 20 {
                (1 << 20) + 511
            } else {
                511
            };
        }
        (raw, slack)
    };
    let (weights, slack) = bound(false);
    assert_eq!(weights, model.weights_bytes());
    assert!(
        parts[0].1 >= weights && parts[0].1 <= weights + slack,
        "weights {} B charged against {weights} B (+{slack} B at most)",
        parts[0].1
    );
    let (trainable, slack) = bound(true);
    assert!(
        parts[2].1 >= 2 * trainable && parts[2].1 <= 2 * (trainable + slack),
        "Adam's state {} B charged against 2 x {trainable} B",
        parts[2].1
    );
    // The gradients are gone at the peak (set to none after the forward pass, remade in
    // backward) or there: at most one per trainable tensor.
    assert!(
        parts[1].1 <= trainable + slack,
        "gradients {} B against {trainable} B: {parts:?}",
        parts[1].1
    );
    assert_eq!(
        parts.iter().map(|p| p.1).sum::<u64>(),
        first.estimate.peak_allocated
    );
}

#[test]
fn the_exit_status_says_whether_a_plan_fits() {
    let _serial = common::serial();
    let base = ["plan", "--model", "resnet18", "--input", "8x3x64x64"];
    let fits = cli(&[&base[..], &["--memory", "4GiB"]].concat());
    assert_eq!(fits.status.code(), Some(0), "{}", text(&fits.stderr));
    assert!(text(&fits.stdout).contains("plan(s) fit in 4.00 GiB"));

    let none = cli(&[&base[..], &["--memory", "20MiB"]].concat());
    assert_eq!(none.status.code(), Some(1), "{}", text(&none.stderr));
    let out = text(&none.stdout);
    assert!(out.contains("nothing fits in 20.00 MiB"), "{out}");
    assert!(out.contains("dominated by"), "{out}");

    for (args, says) in [
        (&["--memory", "lots"][..], "lots"),
        (&["--memory", "4GiB", "--optimizer", "lion"][..], "lion"),
        (&["--memory", "4GiB", "--batch", "0"][..], "batch 0"),
    ] {
        let bad = cli(&[&base[..], args].concat());
        assert_eq!(bad.status.code(), Some(2));
        let err = text(&bad.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }

    // CSV with nothing that fits: no row, the reason on standard error, exit 1.
    let none_csv = cli(&[&base[..], &["--memory", "20MiB", "--csv"]].concat());
    assert_eq!(none_csv.status.code(), Some(1));
    let err = text(&none_csv.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("nothing fits in 20.00 MiB"), "{err}");

    let csv = cli(&[&base[..], &["--memory", "4GiB", "--csv"]].concat());
    assert_eq!(csv.status.code(), Some(0));
    let mut r = csv::Reader::from_reader(csv.stdout.as_slice());
    let headers = r.headers().unwrap().clone();
    let reserved = headers
        .iter()
        .position(|h| h == "peak_reserved_bytes")
        .unwrap();
    for row in r.records() {
        let row = row.unwrap();
        assert!(row[reserved].parse::<u64>().unwrap() <= 4 << 30);
    }
}

/// Where neither the step as it is nor any allocator setting fits, a model given as a
/// chain (GPT-2 here, one sequence, SGD, already in bf16 with the gradients set to none
/// first: checkpointing and the allocator are the only levers) is planned with checkpointing: every plan checkpoints,
/// each one's peak is the estimate of its configuration, the first checkpoints the fewest
/// segments that fit, and its recomputed share is the FLOPs of the two estimates, with
/// and without checkpointing.
#[test]
fn checkpointing_is_planned_when_nothing_cheaper_fits() {
    use tch_memprof::estimate::AllocatorConfig;

    let _serial = common::serial();
    let model = Model::builtin("gpt2").unwrap();
    assert_eq!(model.segments(), Some(14));
    let input = Input::new(&[1, 1024], Kind::Int64);
    let base = Options {
        autocast: Some(Kind::BFloat16),
        zero_grad_first: true,
        ..Options::default()
    };
    let allocators = [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
    ];
    let estimate = |checkpoint: Option<u32>, conf: &str| {
        let options = Options {
            checkpoint,
            allocator: AllocatorConfig::parse(conf).unwrap(),
            ..base.clone()
        };
        model
            .estimate(
                std::slice::from_ref(&input),
                Mode::Train(Optimizer::Sgd),
                &options,
            )
            .unwrap()
    };
    let smallest = |checkpoint: Option<u32>| {
        allocators
            .iter()
            .map(|c| estimate(checkpoint, c).peak_reserved)
            .min()
            .unwrap()
    };
    let (plain, every_2nd, every) = (smallest(None), smallest(Some(2)), smallest(Some(1)));
    eprintln!("smallest peak reserved: as is {plain}, every 2nd segment {every_2nd}, every segment {every}");
    assert!(every < every_2nd && every_2nd < plain);
    let budget = plain - 1;
    let plans = model
        .plan(std::slice::from_ref(&input), Optimizer::Sgd, &base, budget)
        .unwrap();
    assert!(!plans.fits.is_empty());
    for p in &plans.fits {
        let k = p.config.checkpoint.expect("only checkpointing fits");
        let e = estimate(Some(k), &p.config.allocator_conf);
        assert_eq!(p.estimate.peak_reserved, e.peak_reserved, "{:?}", p.config);
        assert!(p.estimate.peak_reserved <= budget);
    }
    let first = &plans.fits[0];
    assert_eq!(first.config.checkpoint, Some(2), "{:?}", first.config);
    let (with, without) = (
        estimate(Some(2), "").step_flops,
        estimate(None, "").step_flops,
    );
    let share = (with - without) as f64 / without as f64;
    eprintln!(
        "every 2nd segment recomputes {:.1}% of the step's FLOPs",
        share * 100.0
    );
    assert!((first.cost.recompute - share).abs() < 1e-12);
    assert!(first.cost.recompute > 0.0 && first.cost.recompute < 1.0 / 3.0);
    // The plan the code of `tch-memprof plan` prints: `Checkpointed::new(&vs)` ...
    // `.mixed_precision(Kind::BFloat16)`.
    assert_eq!(
        first.config.autocast,
        Some(Kind::BFloat16),
        "{:?}",
        first.config
    );
}
