//! `tch-memprof replay rank0.pickle rank1.pickle ...`: a job's ranks side by side. Each
//! rank's snapshot is read and replayed as one is; the text says each rank's recorded
//! peaks and its replay as it ran, which rank peaked highest and by how much it exceeds
//! the median rank, and with `--memory` the allocator setting under which every rank
//! fits.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};

use super::ReplayArgs;
use crate::cli::text::estimate_text::csv_to_stdout;
use crate::cli::text::replay_text::{cheapest_fit, fits_cell, on_streams};
use crate::estimate::recorded::{Peaks, Recording};
use crate::estimate::AllocatorConfig;
use crate::format::bytes;
use crate::report::write_step_files;
use crate::runs::schema::RankRow;

/// One rank: its snapshot replayed under each setting asked for.
struct Rank {
    name: String,
    recorded: Peaks,
    /// The run's own settings first (`own`), then each asked for, in order.
    replays: Vec<Peaks>,
    own: String,
    streams: usize,
    /// What it holds when its replay (as it ran) first reaches its peak reserved: the
    /// bytes of its live blocks by where they were asked for (a frame), or by block
    /// size where the history kept no frames.
    holds: HashMap<String, u64>,
}

/// The live blocks at the peak reserved by their frame (or size), bytes each.
fn holdings(recording: &Recording, config: &AllocatorConfig) -> HashMap<String, u64> {
    let mut holds = HashMap::new();
    let Some(view) = recording.at_reserved_peak(config) else {
        return holds;
    };
    for (id, size) in view.segments.iter().flat_map(|s| &s.live) {
        let key = match view
            .sites
            .get(id)
            .and_then(|&i| recording.sites.get(i as usize))
        {
            Some(site) => site.clone(),
            None => format!("blocks of {}", bytes(*size)),
        };
        *holds.entry(key).or_insert(0) += size;
    }
    holds
}

/// What `peak` holds beyond `median`, the largest differences first (at most `n`):
/// `+96.00 MiB from forward (file:line)`.
fn beyond(peak: &Rank, median: &Rank, n: usize) -> Vec<String> {
    let mut more: Vec<(u64, &String)> = peak
        .holds
        .iter()
        .filter_map(|(k, &b)| {
            let other = median.holds.get(k).copied().unwrap_or(0);
            (b > other).then(|| (b - other, k))
        })
        .collect();
    more.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    more.into_iter()
        .take(n)
        .map(|(b, k)| {
            if k.starts_with("blocks of ") {
                format!("+{} in {k}", bytes(b))
            } else {
                format!("+{} from {k}", bytes(b))
            }
        })
        .collect()
}

/// A rank's name: its file's name without `.pickle`, `.pickle.gz` or `.csv`.
fn rank_name(path: &Path) -> String {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("snapshot");
    [".pickle.gz", ".pickle", ".csv"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
        .to_string()
}

/// The replay of several snapshots, a rank each; bad input in one names its file.
pub(super) fn replay_ranks(
    a: &ReplayArgs,
    paths: &[PathBuf],
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let budget = a.budget()?;
    let asked = a.what_ifs();
    let asked_configs = asked
        .iter()
        .map(|c| AllocatorConfig::parse(c).map_err(|e| format!("--alloc-conf {c:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut progress = crate::cli::progress::Progress::new("replay");
    let mut ranks = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        progress.say(&format!(
            "rank {} of {}: {}",
            i + 1,
            paths.len(),
            path.display()
        ));
        let mut recording = Recording::read(path, a.device)?;
        recording.gpu = a.gpu();
        let own = recording.alloc_conf.clone().unwrap_or_default();
        let own_config = AllocatorConfig::parse(&own).map_err(|e| {
            format!(
                "{}: the run's PYTORCH_CUDA_ALLOC_CONF {own:?}: {e}",
                path.display()
            )
        })?;
        let name = rank_name(path);
        if let Some(dir) = &a.output_dir {
            progress.clear();
            let step = recording.step(&own_config)?;
            let title = format!("{} (recorded)", path.display());
            for f in write_step_files(&step, &dir.join(&name), &title)? {
                eprintln!("wrote {}", f.display());
            }
        }
        let replays = std::iter::once(&own_config)
            .chain(&asked_configs)
            .map(|c| recording.replay(c).replayed)
            .collect();
        ranks.push(Rank {
            name,
            recorded: recording.recorded_peaks(),
            replays,
            own,
            streams: recording.streams(),
            holds: holdings(&recording, &own_config),
        });
    }
    progress.clear();
    // Every rank under each setting: the largest peaks among them. The first is each
    // rank as it ran (its own settings).
    let settings: Vec<(String, Peaks)> = std::iter::once(ranks[0].own.clone())
        .chain(asked.iter().cloned())
        .enumerate()
        .map(|(i, conf)| {
            let worst = Peaks {
                allocated: ranks
                    .iter()
                    .map(|r| r.replays[i].allocated)
                    .max()
                    .unwrap_or(0),
                reserved: ranks
                    .iter()
                    .map(|r| r.replays[i].reserved)
                    .max()
                    .unwrap_or(0),
            };
            (conf, worst)
        })
        .collect();
    let fit = budget.map(|b| cheapest_fit(&settings, b));
    let status = match &fit {
        Some((None, _)) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    };
    let streams = ranks.iter().map(|r| r.streams).max().unwrap_or(1);
    if a.csv {
        let rows = ranks.iter().flat_map(|r| {
            let recorded = row(&r.name, "recorded", r.recorded, budget);
            let confs = std::iter::once(r.own.as_str()).chain(asked.iter().map(String::as_str));
            std::iter::once(recorded).chain(
                confs
                    .zip(&r.replays)
                    .map(|(conf, p)| row(&r.name, conf, *p, budget)),
            )
        });
        csv_to_stdout(rows).map_err(|e| format!("writing CSV to standard output: {e}"))?;
        if let Some((None, line)) = &fit {
            eprintln!("tch-memprof: every rank: {line}");
        }
        return Ok(status);
    }
    print!(
        "{}",
        text(a.device, &ranks, budget, fit.map(|f| f.1), streams)
    );
    Ok(status)
}

fn row(rank: &str, conf: &str, p: Peaks, budget: Option<u64>) -> RankRow {
    RankRow {
        rank: rank.to_string(),
        alloc_conf: if conf.is_empty() {
            "default".to_string()
        } else {
            conf.to_string()
        },
        peak_allocated_bytes: p.allocated,
        peak_reserved_bytes: p.reserved,
        fits: budget.map(|b| p.reserved <= b),
    }
}

/// The ranks' table, the peak rank and its excess over the median rank, and where
/// every rank fits.
fn text(
    device: usize,
    ranks: &[Rank],
    budget: Option<u64>,
    fit: Option<String>,
    streams: usize,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tch-memprof replay: {} ranks, device {device}{}: each rank's recorded peaks, and its \
         replay under the settings it ran with",
        ranks.len(),
        on_streams(streams)
    );
    let mut t = Table::new();
    let mut header = vec![
        "rank",
        "peak allocated",
        "peak reserved",
        "replayed reserved",
    ];
    if budget.is_some() {
        header.push("fits");
    }
    t.load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    for r in ranks {
        let mut row = vec![
            r.name.clone(),
            bytes(r.recorded.allocated),
            bytes(r.recorded.reserved),
            bytes(r.replays[0].reserved),
        ];
        if let Some(b) = budget {
            row.push(fits_cell(r.recorded.reserved, b));
        }
        t.add_row(row);
    }
    for c in 1..4 {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    crate::report::keep_words(&mut t);
    let _ = writeln!(out, "{t}");
    // The median rank: the middle one by recorded peak reserved (the lower of the two
    // middle ones for an even count).
    let mut by_reserved: Vec<&Rank> = ranks.iter().collect();
    by_reserved.sort_by_key(|r| r.recorded.reserved);
    let median = by_reserved[(by_reserved.len() - 1) / 2];
    let peak = by_reserved[by_reserved.len() - 1];
    let excess = peak.recorded.reserved - median.recorded.reserved;
    let _ = writeln!(
        out,
        "the peak rank: {}, peak reserved {}: {} ({:.1}%) above the median rank's ({}, {})",
        peak.name,
        bytes(peak.recorded.reserved),
        bytes(excess),
        100.0 * excess as f64 / median.recorded.reserved.max(1) as f64,
        median.name,
        bytes(median.recorded.reserved)
    );
    let more = beyond(peak, median, 3);
    if excess > 0 && !more.is_empty() {
        let _ = writeln!(
            out,
            "what it holds at its peak beyond the median rank's at its own: {}",
            more.join("; ")
        );
    }
    if let Some(line) = fit {
        let _ = writeln!(out, "every rank: {line}");
    }
    out
}
