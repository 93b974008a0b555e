//! `<run>_report.html`: the run's HTML report (the page `runs::html` renders), rebuilt from the
//! run's CSV files at each `epoch_end`, when a new peak step's files are written, and when
//! the profiler drops; and the page of several runs `tch-memprof report` writes.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::leaks::LeakReport;
use crate::runs::Run;
use crate::stats::EpochStats;
use crate::timeline::{StepKind, StepProfile};

use super::Report;

/// Writes the HTML report of `runs` (as `tch-memprof report` does) to `path`, through a
/// temporary file and a rename: a reader, or a process killed while it writes, never
/// leaves a part of a page there. A path that is there and is not a file (`/dev/stdout`,
/// a pipe) is written to as it is. Returns the page's bytes.
pub fn write_page(runs: &[Run], path: &Path) -> Result<usize> {
    let page = crate::runs::html::render(runs);
    let stream = std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir());
    let written = if stream {
        std::fs::write(path, page.as_bytes()).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    } else {
        crate::fs::write_atomic(path, page.as_bytes())
    };
    match written {
        Ok(()) => Ok(page.len()),
        Err(Error::Io { source, .. }) => Err(Error::Io {
            path: path.to_path_buf(),
            source,
        }),
        Err(e) => Err(e),
    }
}

pub(crate) struct HtmlReport {
    /// The run's stem (`<dir>/<run>`).
    stem: PathBuf,
    path: PathBuf,
}

impl HtmlReport {
    pub(crate) fn new(stem: PathBuf) -> Self {
        let mut path = stem.as_os_str().to_owned();
        path.push("_report.html");
        HtmlReport {
            stem,
            path: PathBuf::from(path),
        }
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn rebuild(&self) -> Result<()> {
        let mut summary = self.stem.as_os_str().to_owned();
        summary.push("_summary.csv");
        if !PathBuf::from(summary).exists() {
            return Ok(()); // nothing reported yet
        }
        let run = Run::open(&self.stem)?;
        crate::fs::write_atomic(&self.path, crate::runs::html::render(&[run]).as_bytes())
    }
}

impl Report for HtmlReport {
    fn epoch(&mut self, _stats: &EpochStats) -> Result<()> {
        self.rebuild()
    }
    fn step_profile(&mut self, _profile: &StepProfile, _kind: StepKind) -> Result<()> {
        self.rebuild()
    }
    fn leaks(&mut self, _report: &LeakReport) -> Result<()> {
        self.rebuild()
    }
    fn finish(&mut self) -> Result<()> {
        self.rebuild()
    }
    fn name(&self) -> &'static str {
        "html"
    }
}
