//! A run's files followed as the profiler writes them: each CSV read from where the last
//! read stopped, complete lines only (a row being written is read once its line ends),
//! and the state `watch` draws.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::de::DeserializeOwned;

use crate::runs::schema::{EPOCHS, LEAKS, META, PARAMETERS, SUMMARY};
use crate::runs::{EpochRow, LeakRow, MetaRow, ParameterRow, SummaryRow};

/// Variables kept per set of parameter rows for the view's list, largest first.
pub(super) const TOP_VARIABLES: usize = 12;

/// One CSV file followed: the bytes read so far, a line not yet ended, its header.
struct Tail {
    path: PathBuf,
    /// The file read (device and inode): another at the path is a file made anew.
    id: Option<(u64, u64)>,
    offset: u64,
    pending: Vec<u8>,
    headers: Option<csv::StringRecord>,
}

/// What a poll of a file found.
enum Polled<T> {
    /// Rows after those read before.
    More(Vec<T>),
    /// The file was made anew (another file at the path, or shorter than what was
    /// read): these are all its rows.
    Again(Vec<T>),
}

impl Tail {
    fn new(path: PathBuf) -> Tail {
        Tail {
            path,
            id: None,
            offset: 0,
            pending: Vec::new(),
            headers: None,
        }
    }

    /// The rows whose lines ended since the last poll (none while the file is missing).
    fn poll<T: DeserializeOwned>(&mut self) -> Result<Polled<T>, String> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Polled::More(Vec::new()))
            }
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", self.path.display()))?;
        let len = meta.len();
        // Made anew: another file at the path (a run folder deleted and recreated, whose
        // parameters file may come back as long as it was), or a shorter one.
        let id = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        let again = len < self.offset || self.id.is_some_and(|old| old != id);
        self.id = Some(id);
        if again {
            self.offset = 0;
            self.pending.clear();
            self.headers = None;
        }
        if len > self.offset {
            file.seek(SeekFrom::Start(self.offset))
                .and_then(|_| file.take(len - self.offset).read_to_end(&mut self.pending))
                .map_err(|e| format!("cannot read {}: {e}", self.path.display()))?;
            self.offset = len;
        }
        // Complete lines only: a row being written waits for its line end.
        let Some(end) = self.pending.iter().rposition(|&b| b == b'\n') else {
            return Ok(wrap(again, Vec::new()));
        };
        let lines: Vec<u8> = self.pending.drain(..=end).collect();
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(&lines[..]);
        let mut rows = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| self.not_ours(&e.to_string()))?;
            match &self.headers {
                None => self.headers = Some(record),
                Some(h) => rows.push(
                    record
                        .deserialize(Some(h))
                        .map_err(|e| self.not_ours(&e.to_string()))?,
                ),
            }
        }
        Ok(wrap(again, rows))
    }

    /// A file whose rows are not this version's, in one line.
    fn not_ours(&self, why: &str) -> String {
        let why = match why.split_once("missing field `") {
            Some((_, rest)) => format!(
                "it has no column {}",
                rest.split('`').next().unwrap_or(rest)
            ),
            None => "a row does not read as this version writes it".to_string(),
        };
        format!(
            "{} is not a file of a tch-memprof run: {why}",
            self.path.display()
        )
    }
}

fn wrap<T>(again: bool, rows: Vec<T>) -> Polled<T> {
    if again {
        Polled::Again(rows)
    } else {
        Polled::More(rows)
    }
}

/// A variable's bytes at one reported iteration: its weight (or buffer) and its gradient.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct VarBytes {
    pub name: String,
    pub weight: u64,
    pub gradient: u64,
}

/// What `watch` shows of one run, from its files.
pub(super) struct Watched {
    /// The stem its files share.
    pub stem: PathBuf,
    /// `<run>_run.csv`: versions, device, label.
    pub meta: HashMap<String, String>,
    pub summary: Vec<SummaryRow>,
    pub epochs: Vec<EpochRow>,
    pub leaks: Vec<LeakRow>,
    /// The largest variables of each set of parameter rows, by the (epoch, iteration)
    /// that wrote it: an iteration's are those of the latest set at or before it
    /// ([`Watched::variables_at`]).
    pub top: BTreeMap<(u64, u64), Vec<VarBytes>>,
    /// When the summary file was last written.
    pub written: Option<SystemTime>,
    tails: [Tail; 5],
}

impl Watched {
    /// The run whose files share `stem`, read as far as they are written; an error in
    /// one line when a file is not a run's of this version.
    pub fn open(stem: &Path) -> Result<Watched, String> {
        let file = |suffix: &str| {
            let mut p = stem.as_os_str().to_owned();
            p.push(suffix);
            Tail::new(PathBuf::from(p))
        };
        let mut w = Watched {
            stem: stem.to_path_buf(),
            meta: HashMap::new(),
            summary: Vec::new(),
            epochs: Vec::new(),
            leaks: Vec::new(),
            top: BTreeMap::new(),
            written: None,
            tails: [
                file(SUMMARY),
                file(EPOCHS),
                file(LEAKS),
                file(PARAMETERS),
                file(META),
            ],
        };
        w.poll()?;
        Ok(w)
    }

    /// Reads what was written since the last poll; whether anything new came.
    pub fn poll(&mut self) -> Result<bool, String> {
        let [summary, epochs, leaks, parameters, meta] = &mut self.tails;
        let mut new = false;
        new |= take(&mut self.summary, summary.poll()?);
        new |= take(&mut self.epochs, epochs.poll()?);
        new |= take(&mut self.leaks, leaks.poll()?);
        let mut rows: Vec<MetaRow> = Vec::new();
        take(&mut rows, meta.poll()?);
        for r in rows {
            self.meta.insert(r.key, r.value);
        }
        match parameters.poll::<ParameterRow>()? {
            Polled::Again(rows) => {
                self.top.clear();
                new |= add_variables(&mut self.top, rows);
            }
            Polled::More(rows) => new |= add_variables(&mut self.top, rows),
        }
        self.written = std::fs::metadata(&summary.path)
            .and_then(|m| m.modified())
            .ok();
        Ok(new)
    }

    /// The variables at `(epoch, iteration)`, largest first: those of the latest set of
    /// parameter rows written at or before it (the profiler writes the set when it
    /// changes and at an epoch's first report, not at every report).
    pub fn variables_at(&self, epoch: u64, iteration: u64) -> Vec<VarBytes> {
        self.top
            .range(..=(epoch, iteration))
            .next_back()
            .map(|(_, v)| largest(v))
            .unwrap_or_default()
    }

    /// The run's name: its label, else its stem's file name.
    pub fn name(&self) -> String {
        let stem = self
            .stem
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match self.meta.get("label") {
            Some(l) => format!("{l} ({stem})"),
            None => stem,
        }
    }

    /// The device the run measures (`cpu`, `cuda:0`).
    pub fn device(&self) -> &str {
        self.summary
            .last()
            .map(|r| r.device.as_str())
            .or(self.meta.get("device").map(String::as_str))
            .unwrap_or("?")
    }

    /// A CPU run: the reserved columns hold the process's resident memory.
    pub fn on_cpu(&self) -> bool {
        self.device() == "cpu"
    }
}

/// Adds `polled`'s rows to `rows` (all of them anew if the file was rewritten); whether
/// any came.
fn take<T>(rows: &mut Vec<T>, polled: Polled<T>) -> bool {
    match polled {
        Polled::More(more) => {
            let any = !more.is_empty();
            rows.extend(more);
            any
        }
        Polled::Again(all) => {
            *rows = all;
            true
        }
    }
}

/// Each reported iteration's variables, largest first (weight and gradient together),
/// the first [`TOP_VARIABLES`] kept.
fn add_variables(top: &mut BTreeMap<(u64, u64), Vec<VarBytes>>, rows: Vec<ParameterRow>) -> bool {
    let any = !rows.is_empty();
    let mut touched = Vec::new();
    for r in rows {
        let key = (r.epoch, r.iteration);
        let vars = top.entry(key).or_default();
        if !touched.contains(&key) {
            touched.push(key);
        }
        let i = match vars.iter().position(|v| v.name == r.parameter) {
            Some(i) => i,
            None => {
                vars.push(VarBytes {
                    name: r.parameter.clone(),
                    ..VarBytes::default()
                });
                vars.len() - 1
            }
        };
        if r.kind == "gradient" {
            vars[i].gradient += r.bytes;
        } else {
            vars[i].weight += r.bytes;
        }
    }
    // Trimmed once an iteration's rows are all in: when a later iteration's begin.
    let newest = touched.iter().max().copied();
    for key in touched {
        if Some(key) != newest {
            trim(top.get_mut(&key));
        }
    }
    if let Some(key) = newest {
        let older: Vec<(u64, u64)> = top
            .iter()
            .filter(|(k, v)| **k < key && v.len() > TOP_VARIABLES)
            .map(|(k, _)| *k)
            .collect();
        for k in older {
            trim(top.get_mut(&k));
        }
    }
    any
}

fn trim(vars: Option<&mut Vec<VarBytes>>) {
    if let Some(v) = vars {
        v.sort_by(|a, b| {
            (b.weight + b.gradient)
                .cmp(&(a.weight + a.gradient))
                .then(a.name.cmp(&b.name))
        });
        v.truncate(TOP_VARIABLES);
    }
}

/// The variables of an iteration, largest first.
pub(super) fn largest(vars: &[VarBytes]) -> Vec<VarBytes> {
    let mut v = vars.to_vec();
    trim(Some(&mut v));
    v
}

/// The run in `dir` whose summary was written last, or the run named `name` there.
pub(super) fn find_run(dir: &Path, name: Option<&str>) -> Result<PathBuf, String> {
    if !dir.is_dir() {
        // A run's stem or one of its files, as `report` and `diff` take them.
        let text = dir.to_string_lossy();
        let stem = [SUMMARY, EPOCHS, PARAMETERS, LEAKS, META]
            .iter()
            .find_map(|s| text.strip_suffix(s))
            .map_or_else(|| dir.to_path_buf(), PathBuf::from);
        let mut summary = stem.as_os_str().to_owned();
        summary.push(SUMMARY);
        if Path::new(&summary).is_file() {
            return Ok(stem);
        }
        return Err(format!(
            "no run at {}: name the folder the profiler writes its CSV files to \
             (memory_csv_data by default), a run's stem or one of its files",
            dir.display()
        ));
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the folder {}: {e}", dir.display()))?;
    let mut runs: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let stem = file.strip_suffix(SUMMARY)?.to_string();
            let when = e.metadata().and_then(|m| m.modified()).ok()?;
            Some((when, dir.join(stem)))
        })
        .collect();
    runs.sort();
    if let Some(name) = name {
        return runs
            .iter()
            .map(|(_, stem)| stem)
            .find(|stem| stem.file_name().is_some_and(|f| f == name))
            .cloned()
            .ok_or_else(|| {
                let known: Vec<String> = runs
                    .iter()
                    .rev()
                    .take(5)
                    .filter_map(|(_, s)| s.file_name().map(|f| f.to_string_lossy().into_owned()))
                    .collect();
                format!(
                    "--run {name}: {} holds no such run (the newest: {})",
                    dir.display(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            });
    }
    runs.pop().map(|(_, stem)| stem).ok_or_else(|| {
        format!(
            "{} holds no run (no *{SUMMARY} file): the profiler writes one with .csv(true)",
            dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Row {
        a: u64,
        b: String,
    }

    fn rows(p: Polled<Row>) -> Vec<Row> {
        match p {
            Polled::More(r) | Polled::Again(r) => r,
        }
    }

    #[test]
    fn a_row_written_half_at_a_time_is_read_once_its_line_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.csv");
        let mut f = File::create(&path).unwrap();
        let mut tail = Tail::new(path.clone());
        assert!(rows(tail.poll().unwrap()).is_empty());
        f.write_all(b"a,b\n1,on").unwrap();
        f.flush().unwrap();
        assert!(rows(tail.poll().unwrap()).is_empty());
        f.write_all(b"e\n2,tw").unwrap();
        f.flush().unwrap();
        assert_eq!(
            rows(tail.poll().unwrap()),
            [Row {
                a: 1,
                b: "one".into()
            }]
        );
        f.write_all(b"o\n").unwrap();
        f.flush().unwrap();
        assert_eq!(
            rows(tail.poll().unwrap()),
            [Row {
                a: 2,
                b: "two".into()
            }]
        );
        // Rewritten shorter: read again from its start.
        std::fs::write(&path, b"a,b\n3,x\n").unwrap();
        match tail.poll::<Row>().unwrap() {
            Polled::Again(r) => assert_eq!(
                r,
                [Row {
                    a: 3,
                    b: "x".into()
                }]
            ),
            Polled::More(r) => panic!("not seen as rewritten: {r:?}"),
        }
        // Deleted and made anew, longer than what was read (a run folder deleted and
        // recreated): another file, read from its start.
        // (Made beside it and renamed over it, so that it cannot take the old inode.)
        let new = dir.path().join("new.csv");
        std::fs::write(&new, b"a,b\n4,four\n5,five\n").unwrap();
        std::fs::rename(&new, &path).unwrap();
        match tail.poll::<Row>().unwrap() {
            Polled::Again(r) => assert_eq!(
                r,
                [
                    Row {
                        a: 4,
                        b: "four".into()
                    },
                    Row {
                        a: 5,
                        b: "five".into()
                    }
                ]
            ),
            Polled::More(r) => panic!("not seen as made anew: {r:?}"),
        }
    }

    #[test]
    fn another_tools_csv_is_named_with_the_column_it_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.csv");
        std::fs::write(&path, b"a,c\n1,2\n").unwrap();
        let err = Tail::new(path).poll::<Row>().err().unwrap();
        assert!(
            err.ends_with("is not a file of a tch-memprof run: it has no column b"),
            "{err}"
        );
    }
}
