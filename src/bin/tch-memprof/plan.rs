//! `tch-memprof plan`: the cheapest configurations of a training step that fit a memory
//! budget.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tch_memprof::estimate::{parse_autocast, AllocatorConfig, Optimizer, Options, Plans};

use crate::estimate::{gpu_and_memory, load_model};
use crate::{fail, parse_inputs};

/// Arguments of `tch-memprof plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A model file: an exported program (.pt2, from torch.export.save) or a TorchScript
    /// file (torch.jit.trace or torch.jit.script, saved with .save()).
    #[arg(required_unless_present = "model", conflicts_with = "model")]
    path: Option<PathBuf>,
    /// A built-in model instead of a file (as for `estimate`).
    #[arg(long)]
    model: Option<String>,
    /// An input shape, batch first, with an optional dtype after a colon; once per
    /// input. Built-in models have a default.
    #[arg(long = "input")]
    inputs: Vec<String>,
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
}

pub fn run(a: &PlanArgs) -> ExitCode {
    let optimizer = match Optimizer::parse(&a.optimizer) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if let Some(b) = a.batch.filter(|b| *b <= 0) {
        return fail(format!("invalid batch {b}: must be positive"));
    }
    let mut inputs = match parse_inputs(&a.inputs) {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    let allocator = match AllocatorConfig::from_env() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let (gpu, memory) = match gpu_and_memory(a.gpu.as_deref(), Some(&a.memory)) {
        Ok((g, Some(m))) => (g, m),
        Ok((_, None)) => return fail("give the budget with --memory (24GB or a GPU name)"),
        Err(e) => return fail(e),
    };
    let model = match load_model(
        a.path.as_deref(),
        a.model.as_deref(),
        &mut inputs,
        &a.inputs,
    ) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    if let Some(b) = a.batch {
        inputs = inputs.iter().map(|i| i.with_batch(b)).collect();
    }
    let autocast = match a.autocast.as_deref().map(parse_autocast).transpose() {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let options = Options {
        gpu,
        allocator,
        autocast,
        ..Options::default()
    };
    let plans = match model.plan(&inputs, optimizer, &options, memory) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let label = model.label().to_string();
    if a.csv {
        return match write_csv(&label, &plans) {
            Ok(()) if plans.fits.is_empty() => {
                if let Some(line) = plans.nothing_fits() {
                    eprintln!("tch-memprof: {line}");
                }
                ExitCode::from(1)
            }
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(format!("writing CSV to standard output: {e}")),
        };
    }
    println!(
        "tch-memprof plan: {label}, training with {} at batch {}, {}",
        optimizer.name(),
        plans.batch,
        options.describe(tch_memprof::estimate::Mode::Train(optimizer))
    );
    print!("{plans}");
    if plans.fits.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn write_csv(label: &str, plans: &Plans) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_writer(std::io::stdout().lock());
    for row in plans.csv_rows(label) {
        w.serialize(row)?;
    }
    w.flush()?;
    Ok(())
}
