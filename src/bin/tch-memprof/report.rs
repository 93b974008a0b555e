//! `tch-memprof report RUN... [-o report.html]`: one self-contained HTML page.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use tch_memprof::runs::Run;

/// Arguments of `tch-memprof report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Each run: its stem (memory_csv_data/20261122-171500), one of its CSV files, or
    /// a folder holding one run.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Where to write it.
    #[arg(short, long, default_value = "report.html")]
    output: PathBuf,
}

/// Reads a run, printing its warnings; bad input is exit status 2.
pub fn open(path: &Path) -> Result<Run, ExitCode> {
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

pub fn run(args: &ReportArgs) -> ExitCode {
    let (paths, output) = (&args.runs, &args.output);
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
