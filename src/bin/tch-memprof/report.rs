//! `tch-memprof report RUN... [--label TEXT]... [-o report.html]`: one self-contained
//! HTML page.

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
    /// What to call each run, in the order of the runs: one --label per run
    /// (`--label "batch 16" --label "batch 48"`). Replaces the label the run was made
    /// with; without labels, runs are called by their folders.
    #[arg(long = "label", value_name = "TEXT", value_parser = parse_label)]
    labels: Vec<String>,
    /// Where to write it.
    #[arg(short, long, default_value = "report.html")]
    output: PathBuf,
}

/// A label: one line, no control characters.
pub fn parse_label(text: &str) -> Result<String, String> {
    tch_memprof::runs::check_label(text)
        .map(|()| text.to_string())
        .map_err(|why| format!("the label {text:?} {why}"))
}

/// Sets `labels` on `runs` in order: none, or one per run.
pub fn apply_labels(runs: &mut [Run], labels: &[String]) -> Result<(), ExitCode> {
    if labels.is_empty() {
        return Ok(());
    }
    if labels.len() != runs.len() {
        eprintln!(
            "tch-memprof: {} label(s) for {} run(s): give one --label per run, in the order of the runs",
            labels.len(),
            runs.len()
        );
        return Err(ExitCode::from(2));
    }
    for (run, label) in runs.iter_mut().zip(labels) {
        run.label = Some(label.clone());
    }
    Ok(())
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
    if let Err(code) = apply_labels(&mut runs, &args.labels) {
        return code;
    }
    let bytes = match tch_memprof::report::html_page::write_page(&runs, output) {
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
