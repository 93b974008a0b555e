//! `tch-memprof diff BASE NEW [--max-increase 5%]`: compare two runs' peaks, exit 1 when
//! one grew beyond the threshold.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::text::commands::diff_text;
use crate::runs::diff;
use clap::Args;

use crate::cli::run_args::{apply_labels, open, parse_label};

/// Arguments of `tch-memprof diff`.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The base run: its stem (memory_csv_data/20261122-171500), one of its CSV files,
    /// or a folder holding one run.
    base: PathBuf,
    /// The new run, named the same ways.
    new: PathBuf,
    /// Largest growth tolerated, in percent of the base (5%, 0.5, 0%).
    #[arg(long, default_value = "5%", value_parser = diff::parse_percent)]
    max_increase: f64,
    /// What to call the two runs in the header: `--label BASE --label NEW` (without
    /// labels, runs are called by their own label, folder, rank or stem).
    #[arg(long = "label", value_name = "TEXT", value_parser = parse_label)]
    labels: Vec<String>,
    /// Layers and parameters shown, those that changed most.
    #[arg(long, default_value_t = 10)]
    top: usize,
}

pub fn run(args: &DiffArgs) -> ExitCode {
    let (max, top) = (args.max_increase, args.top);
    let base = match open(&args.base) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let new = match open(&args.new) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let mut runs = [base, new];
    if let Err(code) = apply_labels(&mut runs, &args.labels) {
        return code;
    }
    let d = diff::compare(&runs[0], &runs[1]);
    let (text, grew) = diff_text(&d, top, max);
    print!("{text}");
    match grew {
        None => ExitCode::SUCCESS,
        Some(line) => {
            eprintln!("{line}");
            ExitCode::from(1)
        }
    }
}
