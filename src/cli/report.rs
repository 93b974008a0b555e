//! `tch-memprof report RUN... [--label TEXT]... [-o report.html]`: one self-contained
//! HTML page.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cli::run_args::{apply_labels, open, parse_label};

/// Arguments of `tch-memprof report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Each run: its stem (memory_csv_data/20261122-171500), one of its CSV files, or
    /// a folder holding one run.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// What to call each run, in the order of the runs: one --label per run
    /// (`--label "batch 16" --label "batch 48"`). Replaces the label the run was made
    /// with; without labels, runs are called by their folders.
    #[arg(long = "label", value_name = "TEXT", value_parser = parse_label)]
    labels: Vec<String>,
    /// Where to write it.
    #[arg(short, long, default_value = "report.html")]
    output: PathBuf,
}

pub fn run(args: &ReportArgs) -> ExitCode {
    let (paths, output) = (&args.runs, &args.output);
    let mut runs = Vec::with_capacity(paths.len());
    for p in paths {
        match open(p) {
            Ok(r) => runs.push(r),
            Err(code) => return code,
        }
    }
    if let Err(code) = apply_labels(&mut runs, &args.labels) {
        return code;
    }
    let bytes = match crate::report::html_page::write_page(&runs, output) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("tch-memprof: cannot write {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "tch-memprof: wrote {} ({} run{}, {bytes} bytes)",
        output.display(),
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
    );
    ExitCode::SUCCESS
}
