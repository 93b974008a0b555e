//! The `tch-memprof` command: profile a step, predict its CUDA peak without a GPU, plan
//! what makes it fit, and read the files of profiled runs back.
//!
//! ```text
//! tch-memprof report RUN... [--label TEXT]... [-o report.html]
//! tch-memprof diff BASE NEW [--max-increase 5%] [--label BASE --label NEW]
//! tch-memprof estimate MODEL.pt2|MODEL.pt --input 1x3x224x224 [--train --optimizer adam]
//!             [--batch-sizes 1,8,32] [--memory 80GiB|h100] [--gpu h100] [--csv]
//!             [--autocast bf16|f16] [--attention auto|flash|efficient|cudnn|math]
//!             [--accumulate K]
//! tch-memprof estimate --model resnet50 ...
//! tch-memprof plan (MODEL.pt2 | MODEL.pt | --model NAME) --memory 24GB|h100 [--input ...]
//!             [--optimizer adamw] [--batch B] [--gpu h100] [--autocast bf16] [--csv]
//! tch-memprof profile MODEL.pt2|MODEL.pt --input 1x3x224x224 [--train] [--device cpu|cuda]
//! tch-memprof replay SNAPSHOT.pickle... [--alloc-conf CONF]... [--memory 24GB|h100] [--csv]
//! tch-memprof watch [DIR] [--run NAME] [--memory 24GB|h100] [--snapshot 120x30]
//! ```
//!
//! A `.pt2` file (torch.export.save) is told from a TorchScript file by its contents;
//! it takes its exported input shapes and dtypes where `--input` leaves them out.
//!
//! Exit status: 0 on success; `diff`: 1 when a peak grew beyond the threshold (the
//! message names what grew and by how much); `plan`: 1 when no plan fits (the message
//! names the smallest peak reached and what dominates it); 2 for bad input (a missing run or model
//! file, an unreadable file, a shape the model rejects, a bad argument): one line on
//! standard error, never a panic trace.

mod diff;
mod estimate;
mod model_args;
mod plan;
mod profile;
mod progress;
mod replay;
mod report;
mod run_args;
pub(crate) mod text;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tch-memprof",
    version,
    about = "Where the memory of a tch model goes: profile a step, predict its CUDA peak \
             without a GPU, plan what makes it fit, and read runs back"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write one self-contained HTML report (works offline) of one run, or of several
    /// side by side (ranks, experiments).
    Report(report::ReportArgs),
    /// Compare the peaks of two runs (per category, per layer of the profiled step, per
    /// parameter); exit 1 when one grew beyond --max-increase.
    Diff(diff::DiffArgs),
    /// Predict the CUDA peak allocated and reserved memory of a model without a GPU
    /// (a dry run on libtorch's meta device replayed through a model of PyTorch's CUDA
    /// caching allocator), and the largest batch that fits.
    ///
    /// Measured on an NVIDIA H200: models written in tch within 0.2% allocated and 2.4%
    /// reserved; real-world models traced from transformers, torchvision and timm and
    /// run from their files as tch runs them, within 2% allocated in all 45 cases and 22
    /// held-out ones: inference within 8 KiB, training within 0.6% in f32 and 0.2% under
    /// bf16 autocast (reserved never more than 2.2% under; cuDNN's convolution workspaces
    /// charged on the safe side, up to +10.5%). By family and mode: docs/estimate.md,
    /// "Measured on a GPU".
    Estimate(estimate::EstimateArgs),
    /// The cheapest configurations of a training step (mixed precision, gradient
    /// accumulation, optimizer, allocator settings) whose predicted peak fits a memory
    /// budget; exit 1 when none does.
    Plan(plan::PlanArgs),
    /// Profile one step of a model file (an exported program .pt2 or a TorchScript file)
    /// for real (timeline by category, layers, FLOPs, plot, summary).
    Profile(profile::ProfileArgs),
    /// Replay a recorded CUDA run (PyTorch's memory snapshot with its allocator history)
    /// through the model of the caching allocator, as recorded and under other
    /// allocator settings: the peaks of each, and which fit --memory. Several snapshots
    /// (or a folder): a job's ranks side by side, and the rank that peaked highest.
    Replay(replay::ReplayArgs),
    /// Watch a run as the profiler writes it (.csv(true)), from another terminal: memory
    /// over iterations, each category, an iteration's breakdown and largest variables,
    /// the epochs with their leak verdicts. A finished run opens the same way.
    Watch(watch::WatchArgs),
}

/// The command: parses the arguments, runs the subcommand, and says how it ended.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(msg) = spaced_size(&args) {
        return fail(msg);
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return argument_error(&e, &args),
    };
    match cli.command {
        Command::Report(args) => report::run(&args),
        Command::Diff(args) => diff::run(&args),
        Command::Estimate(args) => estimate::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Watch(args) => watch::run(&args),
    }
}

/// `--memory 24 GB`: the shell split the size from its unit, which the parser would take
/// for a model file.
fn spaced_size(args: &[String]) -> Option<String> {
    const UNITS: &[&str] = &[
        "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "kB", "gb", "mb", "gib", "mib",
    ];
    args.windows(3).find_map(|w| {
        (w[0] == "--memory" && w[1].parse::<f64>().is_ok() && UNITS.contains(&w[2].as_str())).then(
            || {
                format!(
                    "--memory {} {}: the size and its unit in one word, --memory {}{}",
                    w[1], w[2], w[1], w[2]
                )
            },
        )
    })
}

/// The argument parser's error in one line (its first, with the subcommand's --help
/// named); help and the version print as they are.
fn argument_error(e: &clap::Error, args: &[String]) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        _ => {}
    }
    let sub = args
        .get(1)
        .filter(|a| !a.starts_with('-'))
        .map_or(String::new(), |a| format!(" {a}"));
    let text = e.to_string();
    let mut lines = text.lines();
    let mut first = lines
        .next()
        .unwrap_or("")
        .trim_start_matches("error: ")
        .to_string();
    // "the following required arguments were not provided:" lists them below, indented.
    if first.ends_with(':') {
        let listed: Vec<&str> = lines
            .take_while(|l| l.starts_with("  "))
            .map(str::trim)
            .collect();
        first = format!("{} {}", first, listed.join(", "));
    }
    let model_needed =
        matches!(e.kind(), ErrorKind::MissingRequiredArgument) && first.contains("<PATH>");
    if model_needed {
        return fail(format!(
            "{}: which model? A file (a TorchScript .pt or an exported .pt2) or --model NAME \
             (built in: {})",
            sub.trim(),
            crate::models::BUILTIN.join(", ")
        ));
    }
    fail(format!(
        "{first} (tch-memprof{sub} --help lists the options)"
    ))
}

/// Bad input: one line on standard error, exit status 2.
fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("tch-memprof: {msg}");
    ExitCode::from(2)
}
