//! `tch-memprof replay SNAPSHOT... [--alloc-conf CONF]... [--memory 24GB|h100] [--csv]
//! [--output-dir DIR]`:
//! a recorded CUDA run (PyTorch's memory snapshot with its allocator history) replayed
//! through the model of the caching allocator, under the settings it ran with and under
//! others; several snapshots (or a folder of them) are a job's ranks, side by side.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::text::commands::ReplayOutput;
use crate::cli::text::estimate_text::csv_to_stdout;
use crate::cli::text::replay_text::cheapest_fit;
use crate::estimate::recorded::Recording;
use crate::estimate::{gpu_memory, AllocatorConfig};
use crate::runs::ReplayRow;
use clap::Args;

use crate::cli::fail;
use crate::report::write_step_files;

mod ranks;

/// What-ifs tried when `--alloc-conf` names none.
const DEFAULT_WHAT_IFS: [&str; 2] = ["expandable_segments:True", "max_split_size_mb:128"];

/// Arguments of `tch-memprof replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A memory snapshot with its allocator history: torch.cuda.memory._dump_snapshot's
    /// pickle, after torch.cuda.memory._record_memory_history() (or the CSV of a history:
    /// seq,action,addr,size,...). Several, or a folder of them (its .pickle, .pickle.gz
    /// and .csv files): one per rank of a job, side by side, with the rank of the highest
    /// peak reserved
    #[arg(required = true, value_name = "SNAPSHOT")]
    snapshots: Vec<PathBuf>,
    /// Allocator settings to replay the run under besides its own, as
    /// PYTORCH_CUDA_ALLOC_CONF takes them (expandable_segments:True,
    /// max_split_size_mb:256, roundup_power2_divisions:4); once per setting. Default:
    /// expandable_segments:True and max_split_size_mb:128
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_confs: Vec<String>,
    /// The memory the peak reserved must stay within: a size (80GiB, 24GB) or a GPU name
    /// (its memory less 1 GiB for the CUDA context); adds a fits column
    #[arg(long)]
    memory: Option<String>,
    /// Segments listed with the blocks that split them, the most free bytes first
    #[arg(long, default_value_t = 3)]
    top: usize,
    /// Write the run, replayed under its own settings, into DIR as `tch-memprof
    /// profile` writes a measured step: step.png, step.svg, timeline.csv, layers.csv,
    /// idle.csv, summary.txt. Each allocation is an op, named by where it was asked for
    /// (its first frame outside PyTorch, when the history kept Python frames; `alloc`
    /// otherwise), which is also its layer
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// The device whose history is replayed
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Print CSV to standard output: alloc_conf, peak_allocated_bytes,
    /// peak_reserved_bytes (the first row: as recorded, alloc_conf `recorded`; a history
    /// captured without a GPU: `captured`), fits (with --memory)
    #[arg(long)]
    csv: bool,
}

impl ReplayArgs {
    /// `--memory` in bytes.
    fn budget(&self) -> crate::Result<Option<u64>> {
        Ok(self
            .memory
            .as_deref()
            .map(gpu_memory)
            .transpose()?
            .map(|(size, _)| size))
    }

    /// The GPU `--memory` names, if it names one (a captured history's cuBLAS
    /// workspaces are that GPU's).
    fn gpu(&self) -> Option<crate::estimate::Gpu> {
        self.memory
            .as_deref()
            .and_then(|m| crate::estimate::Gpu::named(m).ok())
    }

    /// The settings tried besides the run's own: `--alloc-conf`, or the defaults.
    fn what_ifs(&self) -> Vec<String> {
        if self.alloc_confs.is_empty() {
            DEFAULT_WHAT_IFS.iter().map(|s| s.to_string()).collect()
        } else {
            self.alloc_confs.clone()
        }
    }
}

pub fn run(a: &ReplayArgs) -> ExitCode {
    replay(a).unwrap_or_else(fail)
}

/// The command, its bad input as the error.
fn replay(a: &ReplayArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let paths = snapshots(&a.snapshots)?;
    match paths.as_slice() {
        [one] => replay_one(a, one),
        _ => ranks::replay_ranks(a, &paths),
    }
}

/// The snapshots named, a folder's in name order.
fn snapshots(named: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in named {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let entries = std::fs::read_dir(p)
            .map_err(|e| format!("{}: {}", p.display(), crate::fs::io_reason(&e)))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| {
                let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
                f.is_file()
                    && (name.ends_with(".pickle")
                        || name.ends_with(".pickle.gz")
                        || name.ends_with(".csv"))
            })
            .collect();
        if found.is_empty() {
            return Err(format!(
                "{}: a folder with no snapshot in it (.pickle, .pickle.gz or .csv files)",
                p.display()
            ));
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// The replay of one snapshot.
fn replay_one(a: &ReplayArgs, path: &Path) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut progress = crate::cli::progress::Progress::new("replay");
    let recording = Recording::read_with_progress(path, a.device, &mut |read, size| {
        progress.say(&format!(
            "reading {:.0}/{:.0} MB",
            read as f64 / 1e6,
            size as f64 / 1e6
        ))
    });
    progress.clear();
    let mut recording = recording?;
    recording.gpu = a.gpu();
    let budget = a.budget()?;
    let own = recording.alloc_conf.clone().unwrap_or_default();
    let mut confs = vec![own.clone()];
    confs.extend(a.what_ifs().into_iter().filter(|c| *c != own));
    let own_config = AllocatorConfig::parse(&own)
        .map_err(|e| format!("the run's PYTORCH_CUDA_ALLOC_CONF {own:?}: {e}"))?;
    if let Some(dir) = &a.output_dir {
        let written = recording.step(&own_config).and_then(|step| {
            let title = format!("{} (recorded)", path.display());
            write_step_files(&step, dir, &title)
        });
        // Standard output stays CSV with --csv.
        for f in written? {
            eprintln!("wrote {}", f.display());
        }
    }
    let mut rows = Vec::new();
    // Settings PyTorch takes that the model does not (replayed as if absent).
    let mut unmodelled: Vec<String> = Vec::new();
    for conf in &confs {
        let config =
            AllocatorConfig::parse(conf).map_err(|e| format!("--alloc-conf {conf:?}: {e}"))?;
        for key in &config.not_modelled {
            if !unmodelled.contains(key) {
                unmodelled.push(key.clone());
            }
        }
        progress.say(&format!("replaying {} of {}", rows.len() + 1, confs.len()));
        rows.push((conf.clone(), recording.replay(&config)));
    }
    progress.clear();
    let recorded = rows[0].1.recorded;
    // With --memory, no setting that fits is an answer a script must see: exit status 1,
    // as `plan` where nothing fits.
    let nothing_fits = budget.and_then(|b| {
        let peaks: Vec<(String, _)> = rows.iter().map(|(c, r)| (c.clone(), r.replayed)).collect();
        let (fits, line) = cheapest_fit(&peaks, b);
        fits.is_none().then_some(line)
    });
    let status = if nothing_fits.is_some() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if a.csv {
        let rows = std::iter::once(ReplayRow::new(
            if recording.captured() {
                "captured"
            } else {
                "recorded"
            },
            recorded.allocated,
            recorded.reserved,
            budget,
        ))
        .chain(rows.iter().map(|(conf, run)| {
            ReplayRow::new(conf, run.replayed.allocated, run.replayed.reserved, budget)
        }));
        csv_to_stdout(rows).map_err(|e| format!("writing CSV to standard output: {e}"))?;
        if let Some(line) = nothing_fits {
            eprintln!("tch-memprof: {line}");
        }
        return Ok(status);
    }
    let output = ReplayOutput {
        path,
        device: a.device,
        recording: &recording,
        own: &own,
        own_config: &own_config,
        runs: &rows,
        unmodelled: &unmodelled,
        budget,
        top: a.top,
    };
    print!("{}", output.text());
    Ok(status)
}
