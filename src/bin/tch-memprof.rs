//! The `tch-memprof` command: work with the files a profiled run left.
//!
//!     tch-memprof report RUN... [-o report.html]
//!     tch-memprof diff BASE NEW [--max-increase 5%]
//!     tch-memprof estimate MODEL.pt --input 1x3x224x224 [--train --optimizer adam]
//!                 [--batch-sizes 1,8,32] [--memory 80GiB|h100] [--gpu h100] [--csv]
//!     tch-memprof estimate --model resnet50 ...
//!     tch-memprof profile MODEL.pt --input 1x3x224x224 [--train] [--device cpu|cuda]
//!
//! Exit status: 0 on success; `diff`: 1 when a peak grew beyond the threshold (the
//! message names what grew and by how much); 2 for bad input (a missing run or model
//! file, an unreadable file, a shape the model rejects, a bad argument): one line on
//! standard error, never a panic trace.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tch_memprof::runs::diff;
use tch_memprof::runs::Run;

#[path = "tch-memprof/estimate.rs"]
mod estimate_cmd;

#[derive(Parser)]
#[command(
    name = "tch-memprof",
    version,
    about = "Work with the files of tch-memprof runs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write one self-contained HTML report (works offline) of one run, or of several
    /// side by side (ranks, experiments).
    Report {
        /// Each run: its stem (memory_csv_data/20261122-171500), one of its CSV files, or
        /// a folder holding one run.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Where to write it.
        #[arg(short, long, default_value = "report.html")]
        output: PathBuf,
    },
    /// Compare the peaks of two runs (per category, per layer of the profiled step, per
    /// parameter); exit 1 when one grew beyond --max-increase.
    Diff {
        /// The base run: its stem (memory_csv_data/20261122-171500), one of its CSV files,
        /// or a folder holding one run.
        base: PathBuf,
        /// The new run, named the same ways.
        new: PathBuf,
        /// Largest growth tolerated, in percent of the base (5%, 0.5, 0%).
        #[arg(long, default_value = "5%", value_parser = diff::parse_percent)]
        max_increase: f64,
        /// Layers and parameters shown, those that changed most.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Predict the CUDA peak allocated and reserved memory of a model without a GPU
    /// (a dry run on libtorch's meta device replayed through a model of PyTorch's CUDA
    /// caching allocator), and the largest batch that fits.
    Estimate(estimate_cmd::EstimateArgs),
    /// Profile one step of a TorchScript model for real (timeline by category, layers,
    /// FLOPs, plot, summary).
    Profile(estimate_cmd::ProfileArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Report { runs, output } => run_report(&runs, &output),
        Command::Diff {
            base,
            new,
            max_increase,
            top,
        } => run_diff(&base, &new, max_increase, top),
        Command::Estimate(args) => estimate_cmd::run_estimate(&args),
        Command::Profile(args) => estimate_cmd::run_profile(&args),
    }
}

fn open(path: &std::path::Path) -> Result<Run, ExitCode> {
    match Run::open(path) {
        Ok(run) => {
            for w in &run.warnings {
                eprintln!("tch-memprof: warning: {w}");
            }
            Ok(run)
        }
        Err(e) => {
            eprintln!("tch-memprof: {e}");
            Err(ExitCode::from(2))
        }
    }
}

fn run_report(paths: &[PathBuf], output: &std::path::Path) -> ExitCode {
    let mut runs = Vec::with_capacity(paths.len());
    for p in paths {
        match open(p) {
            Ok(r) => runs.push(r),
            Err(code) => return code,
        }
    }
    let page = tch_memprof::runs::html::render(&runs);
    if let Err(e) = std::fs::write(output, page.as_bytes()) {
        eprintln!("tch-memprof: cannot write {}: {e}", output.display());
        return ExitCode::from(2);
    }
    println!(
        "tch-memprof: wrote {} ({} run{}, {} bytes)",
        output.display(),
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        page.len()
    );
    ExitCode::SUCCESS
}

fn run_diff(base: &std::path::Path, new: &std::path::Path, max: f64, top: usize) -> ExitCode {
    let base = match open(base) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let new = match open(new) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let d = diff::compare(&base, &new);
    println!("tch-memprof diff: {} -> {}", d.base, d.new);
    for n in &d.notes {
        println!("note: {n}");
    }
    println!("{}", d.table(top));
    let grew = d.regressions(max);
    if grew.is_empty() {
        println!("no peak grew by more than {max}%");
        return ExitCode::SUCCESS;
    }
    let what: Vec<String> = grew.iter().take(5).map(|c| c.describe()).collect();
    let more = if grew.len() > 5 {
        format!(" and {} more", grew.len() - 5)
    } else {
        String::new()
    };
    eprintln!(
        "tch-memprof: {} peak(s) grew by more than {max}%: {}{more}",
        grew.len(),
        what.join("; ")
    );
    ExitCode::from(1)
}
