//! `tch-memprof plan`: the cheapest configurations of a training step that fit a memory
//! budget.

use std::path::Path;
use std::process::ExitCode;

use crate::cli::text::commands::{plan_recorded_text, plan_text, Budget};
use crate::cli::text::estimate_text::csv_to_stdout;
use crate::cli::text::replay_text;
use crate::estimate::recorded::{Peaks, Recording};
use crate::estimate::{
    allocator_candidates, parse_autocast, AllocatorConfig, Mode, Optimizer, Options,
};
use crate::runs::ReplayRow;
use clap::Args;

use crate::cli::fail;
use crate::cli::model_args::{gpu_and_memory, ModelArgs};
use crate::cli::text::estimate_text::{
    budget_line, describe_options, nothing_fits, plan_rows, skipped_lines,
};
use crate::cli::text::sharded_text::gpu_plans;

/// What plan's model file may also be.
const PATH_HELP: &str = "A model file: an exported program (.pt2, from torch.export.save) or \
    a TorchScript file (torch.jit.trace or torch.jit.script, saved with .save()). Or a \
    recorded run: PyTorch's memory snapshot with its allocator history (as `replay` reads \
    it), whose lever is then the allocator's settings, resting on the run as recorded";

/// Arguments of `tch-memprof plan`.
#[derive(Args, Debug)]
#[command(mut_arg("path", |a| a.help(PATH_HELP)))]
pub struct PlanArgs {
    #[command(flatten)]
    target: ModelArgs,
    /// The optimizer asked for: sgd, sgd-momentum, adam, adamw.
    #[arg(long, default_value = "adamw")]
    optimizer: String,
    /// The budget the predicted peak reserved must stay within: a size (24GB, 80GiB) or
    /// a GPU name (its memory less 1 GiB for the CUDA context).
    #[arg(long)]
    memory: String,
    /// The GPU (its cuBLAS workspace, its attention kernels, bfloat16 or not); default:
    /// the one --memory names, else a GPU of compute capability 8.0.
    #[arg(long)]
    gpu: Option<String>,
    /// The effective batch to keep (replaces the first size of every input).
    #[arg(long)]
    batch: Option<i64>,
    /// The step already runs under autocast in this dtype (bf16 or f16); otherwise
    /// mixed precision is one of the levers.
    #[arg(long)]
    autocast: Option<String>,
    /// Accepted for symmetry with `estimate`: a plan is always for training.
    #[arg(long, hide = true)]
    train: bool,
    /// Print CSV to standard output, a row per plan that fits.
    #[arg(long)]
    csv: bool,
    /// Plan over N GPUs of --memory each: DDP, FSDP2 kept unsharded or resharded after
    /// forward, and FSDP2 with bf16 mixed precision (MixedPrecisionPolicy: parameters
    /// gathered in bf16, gradients reduced in f32) or activation checkpointing, each with its
    /// largest rank's peak reserved and the bytes it communicates; the cheapest that fits
    /// and the fewest GPUs it fits on (exit 1 when none fits).
    #[arg(long, value_name = "N", conflicts_with = "csv")]
    gpus: Option<u32>,
    /// Also list each configuration left out of the search (its dry run failed) and why;
    /// by default one line counts them by reason.
    #[arg(long)]
    verbose: bool,
}

pub fn run(a: &PlanArgs) -> ExitCode {
    plan(a).unwrap_or_else(fail)
}

/// The command, its bad input as the error.
fn plan(a: &PlanArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let optimizer = Optimizer::parse(&a.optimizer)?;
    if let Some(b) = a.batch.filter(|b| *b <= 0) {
        return Err(format!("invalid batch {b}: must be positive").into());
    }
    let mut inputs = a.target.inputs()?;
    let allocator = AllocatorConfig::from_env()?;
    let (gpu, memory) = match gpu_and_memory(a.gpu.as_deref(), Some(&a.memory))? {
        (g, Some(m)) => (g, m),
        (_, None) => return Err("give the budget with --memory (24GB or a GPU name)".into()),
    };
    if let Some(path) = a.target.path.as_deref().filter(|p| is_recording(p)) {
        return plan_recorded(a, path, memory);
    }
    let model = a.target.load(&mut inputs)?;
    {
        use crate::cli::text::estimate_text::{all_frozen_line, frozen_line};
        if let Some(line) = all_frozen_line(&model).or_else(|| frozen_line(&model)) {
            eprintln!("{line}");
        }
    }
    if let Some(b) = a.batch {
        inputs = inputs.iter().map(|i| i.with_batch(b)).collect();
    }
    let autocast = a.autocast.as_deref().map(parse_autocast).transpose()?;
    let options = Options {
        gpu,
        allocator,
        autocast,
        ..Options::default()
    };
    if let Some(gpus) = a.gpus {
        if gpus == 0 {
            return Err("invalid --gpus 0: plan over at least 1 GPU".into());
        }
        let plans = model.plan_gpus(&inputs, optimizer, &options, memory, gpus)?;
        println!(
            "tch-memprof plan: {}, training with {} at batch {} on {gpus} GPUs, {}",
            model.label(),
            optimizer.name(),
            inputs[0].batch(),
            describe_options(&options, Mode::Train(optimizer))
        );
        println!("{}", budget_line(memory, &a.memory));
        print!("{}", gpu_plans(&plans));
        return Ok(if plans.cheapest.is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let mut progress = crate::cli::progress::Progress::new("tch-memprof plan");
    let plans = model.plan_with_progress(&inputs, optimizer, &options, memory, &mut |n| {
        progress.say(&format!("searching, {n} dry run(s)"))
    });
    progress.clear();
    let plans = plans?;
    let label = model.label().to_string();
    if a.csv {
        csv_to_stdout(plan_rows(&plans, &label))
            .map_err(|e| format!("writing CSV to standard output: {e}"))?;
        if plans.fits.is_empty() {
            if let Some(line) = nothing_fits(&plans) {
                eprintln!("tch-memprof: {line}");
            }
            return Ok(ExitCode::from(1));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let budget = Budget {
        bytes: memory,
        spec: &a.memory,
    };
    print!("{}", plan_text(&label, &options, budget, &plans));
    if a.verbose {
        for line in skipped_lines(&plans) {
            println!("{line}");
        }
    }
    Ok(if plans.fits.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Whether `path` is a recorded run: a pickle (PyTorch's snapshot; model files are zip
/// archives) or a history's CSV.
fn is_recording(path: &Path) -> bool {
    use std::io::Read;
    if path.extension().is_some_and(|e| e == "csv") {
        return true;
    }
    let mut first = [0u8; 1];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut first))
        .is_ok_and(|()| first[0] == 0x80)
}

/// The plan of a recorded run: the run replayed under its own allocator settings and
/// under each the plan tries, and the cheapest that fits `memory`; exit 1 when none does.
fn plan_recorded(
    a: &PlanArgs,
    path: &Path,
    memory: u64,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if !a.target.inputs.is_empty() || a.batch.is_some() || a.autocast.is_some() {
        return Err(format!(
            "{}: a recorded run's only lever is the allocator's settings: --input, --batch \
             and --autocast apply to a model file",
            path.display()
        )
        .into());
    }
    let mut recording = Recording::read(path, 0)?;
    // A captured history's cuBLAS workspaces: the GPU --gpu or --memory names, if one does.
    recording.gpu = [a.gpu.as_deref(), Some(a.memory.as_str())]
        .into_iter()
        .flatten()
        .find_map(|g| crate::estimate::Gpu::named(g).ok());
    let own = recording.alloc_conf.clone().unwrap_or_default();
    let candidates = AllocatorConfig::parse(&own)
        .and_then(|c| allocator_candidates(&c))
        .map_err(|e| format!("the run's PYTORCH_CUDA_ALLOC_CONF {own:?}: {e}"))?;
    let rows: Vec<(String, Peaks)> = candidates
        .iter()
        .map(|(conf, c)| {
            let name = if conf.is_empty() {
                own.clone()
            } else {
                conf.clone()
            };
            (name, recording.replay(c).replayed)
        })
        .collect();
    let fits = replay_text::cheapest_fit(&rows, memory).0;
    if a.csv {
        let rows = rows
            .iter()
            .map(|(conf, p)| ReplayRow::new(conf, p.allocated, p.reserved, Some(memory)));
        csv_to_stdout(rows).map_err(|e| format!("writing CSV to standard output: {e}"))?;
    } else {
        let budget = Budget {
            bytes: memory,
            spec: &a.memory,
        };
        let recorded = recording.recorded_peaks();
        print!(
            "{}",
            plan_recorded_text(path, &own, budget, recorded, &recording, &rows)
        );
    }
    Ok(if fits.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
