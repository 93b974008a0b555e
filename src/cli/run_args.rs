//! The runs `report` and `diff` read: each opened with its warnings said, and the
//! labels given to them.

use std::path::Path;
use std::process::ExitCode;

use crate::runs::Run;

/// A label: one line, no control characters.
pub fn parse_label(text: &str) -> Result<String, String> {
    crate::runs::check_label(text)
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
