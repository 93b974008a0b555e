//! A run's files, read back: what `tch-memprof diff` compares and `tch-memprof report`
//! draws. The columns of every file are defined once, in its row type ([`SummaryRow`], ...), and used both by the
//! profiler that writes them and by [`Run::open`] that reads them.
//!
//! A run is named by its stem (`memory_csv_data/20261122-171500`), by one of its files
//! (`..._summary.csv`), or by a folder that holds exactly one run. Files written by a
//! process that was killed may end in a row cut short: such a row is left out with a
//! warning. A file that lacks a column this version writes is an error that names the
//! file and the column (but the timeline's `idle_bytes`, newer than its other columns,
//! which reads as 0).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

pub mod diff;
pub(crate) mod html;
mod naming;
pub(crate) mod schema;

pub(crate) use naming::check_label;
pub use naming::names;

pub use schema::{
    EpochRow, EstimateRow, IdleRow, LayerRow, LeakRow, MetaRow, ParameterRow, PlanRow, ReplayRow,
    SummaryRow, TimelineRow,
};
use schema::{EPOCHS, IDLE, LAYERS, LEAKS, META, PARAMETERS, SUMMARY, TIMELINE};

/// One run's files, as read.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Run {
    /// The stem its files share (`memory_csv_data/20261122-171500`).
    pub stem: PathBuf,
    /// The summary rows (one per reported iteration).
    pub summary: Vec<SummaryRow>,
    /// The epoch rows.
    pub epochs: Vec<EpochRow>,
    /// The parameter rows (every variable and gradient, a set at each report where
    /// they changed and at each epoch's first report; each set whole).
    pub parameters: Vec<ParameterRow>,
    /// Empty without the timeline.
    pub layers: Vec<LayerRow>,
    /// The peak step's ops (empty without the timeline).
    pub timeline: Vec<TimelineRow>,
    /// The step asked for with `timeline_step` (the `timeline_step` row of
    /// `<run>_run.csv`): the one examined for idle blocks.
    pub examined_step: Option<u64>,
    /// That step's ops, from `<run>_step<n>_timeline.csv` (empty before it ran).
    pub examined: Vec<TimelineRow>,
    /// Leak suspects (empty when none was found).
    pub leaks: Vec<LeakRow>,
    /// The blocks idle at the profiled step's peak (empty without `idle_at_peak`).
    pub idle: Vec<IdleRow>,
    /// Out-of-memory reports: each `<run>_oom<N>.txt`'s file name and text.
    pub ooms: Vec<(String, String)>,
    /// `<run>_run.csv`: what made the run (`tch_memprof` and `libtorch` versions,
    /// `device`, `started`, `print_period`, `label`, `timeline_step`); empty for runs
    /// written before it existed.
    pub meta: BTreeMap<String, String>,
    /// What the user calls the run: the profiler's `.label(...)` (the `label` row of
    /// `<run>_run.csv`), or one set after reading (`tch-memprof report --label`). See
    /// [`names`] for how runs are named.
    pub label: Option<String>,
    /// What was left out while reading (rows cut short by a killed process).
    pub warnings: Vec<String>,
}

impl Run {
    /// Reads the run named by `arg`: its stem, one of its files, or a folder holding
    /// exactly one run.
    pub fn open(arg: impl AsRef<Path>) -> Result<Run> {
        let stem = resolve(arg.as_ref())?;
        let mut warnings = Vec::new();
        let summary = read_rows(&with_suffix(&stem, SUMMARY), true, &mut warnings)?;
        if summary.is_empty() {
            return Err(Error::Run(format!(
                "{} has no complete row",
                with_suffix(&stem, SUMMARY).display()
            )));
        }
        let meta: BTreeMap<String, String> =
            read_rows::<MetaRow>(&with_suffix(&stem, META), false, &mut warnings)?
                .into_iter()
                .map(|r| (r.key, r.value))
                .collect();
        let examined_step = meta.get("timeline_step").and_then(|v| match v.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                warnings.push(format!(
                    "{}: timeline_step is {v:?}, not a step number; the step's timeline is left out",
                    with_suffix(&stem, META).display()
                ));
                None
            }
        });
        // A run of `tch-memprof profile` keeps its one step under the folder's plain names
        // (timeline.csv, layers.csv, idle.csv): that step is the one asked for and the
        // run's peak step alike.
        let (step, steps) = schema::STEP_FILES;
        let plain = meta.get(step).is_some_and(|v| v == steps);
        let beside = |name: &str| stem.parent().unwrap_or(Path::new("")).join(name);
        let step_file = |suffix: &str, plain_name: &str| {
            if plain {
                beside(plain_name)
            } else {
                with_suffix(&stem, suffix)
            }
        };
        let examined = match examined_step {
            Some(n) => read_rows(
                &step_file(&format!("_step{n}{TIMELINE}"), "timeline.csv"),
                false,
                &mut warnings,
            )?,
            None => Vec::new(),
        };
        Ok(Run {
            examined_step,
            examined,
            label: meta.get("label").cloned(),
            epochs: read_rows(&with_suffix(&stem, EPOCHS), false, &mut warnings)?,
            parameters: read_rows(&with_suffix(&stem, PARAMETERS), false, &mut warnings)?,
            layers: read_rows(&step_file(LAYERS, "layers.csv"), false, &mut warnings)?,
            timeline: read_rows(&step_file(TIMELINE, "timeline.csv"), false, &mut warnings)?,
            leaks: read_rows(&with_suffix(&stem, LEAKS), false, &mut warnings)?,
            idle: read_rows(&step_file(IDLE, "idle.csv"), false, &mut warnings)?,
            meta,
            ooms: read_ooms(&stem)?,
            summary,
            stem,
            warnings,
        })
    }

    /// The run's stem's file name (`20261123-073855`), for messages about its files.
    /// Where runs are shown together, [`names`] tells them apart.
    pub fn name(&self) -> String {
        self.stem
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.stem.display().to_string())
    }

    /// The devices its rows name (`cpu`, `cuda:0`), in order of appearance.
    pub fn devices(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for r in &self.summary {
            if !out.contains(&r.device.as_str()) {
                out.push(&r.device);
            }
        }
        out
    }

    /// The largest value of each category over the reported iterations: the peaks a
    /// diff compares, by the summary's column names.
    pub fn peaks(&self) -> BTreeMap<&'static str, u64> {
        type Column = (&'static str, fn(&SummaryRow) -> u64);
        let cols: [Column; 10] = [
            ("peak_allocated_bytes", |r| r.peak_allocated_bytes),
            ("peak_reserved_bytes", |r| r.peak_reserved_bytes),
            ("weights_bytes", |r| r.weights_bytes),
            ("buffers_bytes", |r| r.buffers_bytes),
            ("gradients_bytes", |r| r.gradients_bytes),
            ("optimizer_state_bytes", |r| r.optimizer_state_bytes),
            ("feature_maps_bytes", |r| r.feature_maps_bytes),
            ("intermediate_gradients_bytes", |r| {
                r.intermediate_gradients_bytes
            }),
            ("other_bytes", |r| r.other_bytes),
            ("allocated_bytes", |r| r.allocated_bytes),
        ];
        cols.iter()
            .map(|(name, f)| (*name, self.summary.iter().map(f).max().unwrap_or(0)))
            .collect()
    }

    /// Bytes of each variable and gradient at the last reported iteration, by
    /// `name` (weights and buffers) and `name grad`.
    pub fn last_parameters(&self) -> BTreeMap<String, u64> {
        let Some(last) = self.parameters.last() else {
            return BTreeMap::new();
        };
        let (e, i) = (last.epoch, last.iteration);
        self.parameters
            .iter()
            .filter(|p| p.epoch == e && p.iteration == i)
            .map(|p| {
                let key = if p.kind == "gradient" {
                    format!("{} grad", p.parameter)
                } else {
                    p.parameter.clone()
                };
                (key, p.bytes)
            })
            .collect()
    }
}

/// `<stem>_oom<N>.txt` files, in N order.
fn read_ooms(stem: &Path) -> Result<Vec<(String, String)>> {
    let dir = match stem.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let prefix = format!(
        "{}_oom",
        stem.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    let mut found: Vec<(u64, String, PathBuf)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let n = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".txt"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(n) = n {
                found.push((n, name, entry.path()));
            }
        }
    }
    found.sort();
    found
        .into_iter()
        .map(|(_, name, path)| {
            std::fs::read_to_string(&path)
                .map(|text| (name, text))
                .map_err(|e| Error::Run(format!("cannot read {}: {e}", path.display())))
        })
        .collect()
}

fn with_suffix(stem: &Path, suffix: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The run's stem of a requested step's files (`<run>` of `<run>_step3`, the stem of
/// `<run>_step3_timeline.csv`), when `<run>_step3` is no run itself and `<run>` is one.
fn step_file_stem(stem: &str) -> Option<&str> {
    let (run, n) = stem.rsplit_once("_step")?;
    let numbered = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    let is_run = |s: &str| with_suffix(Path::new(s), SUMMARY).is_file();
    (numbered && !is_run(stem) && is_run(run)).then_some(run)
}

/// The stem of the run `arg` names.
fn resolve(arg: &Path) -> Result<PathBuf> {
    if arg.is_dir() {
        let mut stems = Vec::new();
        let entries = std::fs::read_dir(arg)
            .map_err(|e| Error::Run(format!("cannot read the folder {}: {e}", arg.display())))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(SUMMARY) {
                stems.push(arg.join(stem));
            }
        }
        stems.sort();
        return match stems.len() {
            1 => Ok(stems.remove(0)),
            0 => Err(Error::Run(format!(
                "{} holds no run (no *{SUMMARY} file)",
                arg.display()
            ))),
            n => Err(Error::Run(format!(
                "{} holds {n} runs; name one by its stem: {}",
                arg.display(),
                stems
                    .iter()
                    .map(|s| s.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        };
    }
    let text = arg.to_string_lossy();
    for suffix in [
        SUMMARY, EPOCHS, PARAMETERS, LAYERS, TIMELINE, LEAKS, IDLE, META,
    ] {
        if let Some(stem) = text.strip_suffix(suffix) {
            let step_file = [TIMELINE, LAYERS].contains(&suffix);
            return Ok(PathBuf::from(
                step_file
                    .then(|| step_file_stem(stem))
                    .flatten()
                    .unwrap_or(stem),
            ));
        }
    }
    if with_suffix(arg, SUMMARY).is_file() {
        return Ok(arg.to_path_buf());
    }
    Err(Error::Run(format!(
        "no run at {}: expected a folder holding one run, a run's stem (with {} next to it) or one of its CSV files",
        arg.display(),
        with_suffix(arg, SUMMARY).display()
    )))
}

/// The rows of one CSV file. A missing optional file is no rows; a last row without its
/// line end (a killed writer) is left out with a warning.
fn read_rows<T: for<'de> Deserialize<'de>>(
    path: &Path,
    required: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<T>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(Vec::new()),
        Err(e) => return Err(Error::Run(format!("cannot read {}: {e}", path.display()))),
    };
    let mut text = &bytes[..];
    if !text.is_empty() && !text.ends_with(b"\n") {
        let cut = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        warnings.push(format!(
            "{}: its last row is cut short (the process was killed while writing it?); read up to the row before",
            path.display()
        ));
        text = &text[..cut];
    }
    let mut reader = csv::Reader::from_reader(text);
    let headers = reader
        .headers()
        .map_err(|e| Error::Run(format!("{}: unreadable header: {e}", path.display())))?
        .clone();
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record =
            record.map_err(|e| Error::Run(format!("{}: row {}: {e}", path.display(), i + 2)))?;
        let row: T = record.deserialize(Some(&headers)).map_err(|e| {
            let what = match e.kind() {
                csv::ErrorKind::Deserialize { err, .. } => err.to_string(),
                _ => e.to_string(),
            };
            Error::Run(format!("{}: row {}: {what}", path.display(), i + 2))
        })?;
        out.push(row);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    const HEADER: &str = "timestamp,epoch,iteration,device,allocated_bytes,peak_allocated_bytes,reserved_bytes,peak_reserved_bytes,weights_bytes,buffers_bytes,gradients_bytes,feature_maps_bytes,intermediate_gradients_bytes,optimizer_state_bytes,other_bytes,step,backward_passes\n";

    fn row(step: u64, allocated: u64) -> String {
        format!(
            "t,1,{step},cpu,{allocated},{},0,0,10,0,10,5,3,20,{},{step},1\n",
            allocated + 7,
            allocated - 40
        )
    }

    #[test]
    fn a_row_cut_short_is_left_out_with_a_warning_and_peaks_are_maxima() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{HEADER}{}{}t,1,3,cpu,99", row(1, 100), row(2, 300));
        write(dir.path(), "r_summary.csv", &text);
        let run = Run::open(dir.path()).unwrap();
        assert_eq!(run.summary.len(), 2);
        assert_eq!(run.warnings.len(), 1, "{:?}", run.warnings);
        assert!(run.warnings[0].contains("cut short"));
        let p = run.peaks();
        assert_eq!(p["peak_allocated_bytes"], 307);
        assert_eq!(p["other_bytes"], 260);
        assert_eq!(run.name(), "r");
        assert_eq!(run.devices(), ["cpu"]);
    }

    #[test]
    fn a_step_file_names_its_run_and_a_run_named_like_a_step_stays_itself() {
        let dir = tempfile::tempdir().unwrap();
        let summary = format!("{HEADER}{}", row(1, 100));
        write(dir.path(), "exp_summary.csv", &summary);
        write(dir.path(), "exp_run.csv", "key,value\ntimeline_step,3\n");
        write(dir.path(), "exp_step3_timeline.csv", "op_index,op,phase,layer,param_bytes,buffer_bytes,grad_bytes,act_bytes,temp_bytes,opt_bytes,other_bytes,total_bytes\n0,aten::mm,forward,l1,1,0,0,0,2,0,0,3\n");
        let run = Run::open(dir.path().join("exp_step3_timeline.csv")).unwrap();
        assert_eq!(run.stem, dir.path().join("exp"));
        assert_eq!(run.examined_step, Some(3));
        // A file from before the idle column: its idle bytes read as 0.
        assert_eq!((run.examined.len(), run.examined[0].total_bytes), (1, 3));
        assert_eq!(run.examined[0].idle_bytes, 0);
        // A run of its own whose stem ends like a step's.
        write(dir.path(), "exp_step5_summary.csv", &summary);
        let other = Run::open(dir.path().join("exp_step5_summary.csv")).unwrap();
        assert_eq!(other.stem, dir.path().join("exp_step5"));
        // A step number that is none is said, and the run still opens.
        write(
            dir.path(),
            "exp_run.csv",
            "key,value\ntimeline_step,three\n",
        );
        let run = Run::open(dir.path().join("exp")).unwrap();
        assert_eq!(run.examined_step, None);
        assert!(
            run.warnings.iter().any(|w| w.contains("\"three\"")),
            "{:?}",
            run.warnings
        );
    }

    #[test]
    fn a_missing_column_names_the_file_and_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let header = HEADER.replace("feature_maps_bytes,", "");
        let r = row(1, 100).replacen(",5,", ",", 1);
        write(dir.path(), "r_summary.csv", &format!("{header}{r}"));
        let e = Run::open(dir.path().join("r")).unwrap_err().to_string();
        assert!(
            e.contains("r_summary.csv") && e.contains("feature_maps_bytes"),
            "{e}"
        );
    }

    #[test]
    fn a_folder_with_two_runs_or_none_is_an_error_that_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let e = Run::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("holds no run"), "{e}");
        write(
            dir.path(),
            "a_summary.csv",
            &format!("{HEADER}{}", row(1, 100)),
        );
        write(
            dir.path(),
            "b_summary.csv",
            &format!("{HEADER}{}", row(1, 100)),
        );
        let e = Run::open(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("holds 2 runs") && e.contains("a") && e.contains("b"),
            "{e}"
        );
        // Named by one of its files.
        let run = Run::open(dir.path().join("b_summary.csv")).unwrap();
        assert_eq!(run.name(), "b");
        let e = Run::open(dir.path().join("nothing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no run at"), "{e}");
    }
}
