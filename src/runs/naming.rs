//! What runs are called on the page, in `diff`'s header and anywhere several runs are
//! shown together: names a person can tell apart.
//!
//! A run is called, in order of preference:
//! - by its label: the profiler's `.label("batch 16")` (the `label` row of
//!   `<run>_run.csv`) or `tch-memprof report --label`;
//! - else by its folder: the folder that holds the CSV folder when that one has the
//!   default name (`memory_csv_data`, or `profile_results` of `tch-memprof profile`),
//!   else the CSV folder itself (`a/memory_csv_data/20261123-073855` is `a`);
//!
//! followed by `rank N` when its stem has `-rankN` (the ranks of one job). Runs that
//! still share a name are told apart by the shortest end of their folders' paths that
//! differs (`x/a`, `y/a`), then by their stems (runs of one folder), and last by
//! ` (2)`, ` (3)` (the same run given twice).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use super::Run;

/// CSV folders named by the folder that holds them.
const DEFAULT_CSV_DIRS: [&str; 2] = ["memory_csv_data", "profile_results"];

/// Checks a run label: one line of text, no control characters, not blank, at most 200
/// characters. Returns why not.
pub fn check_label(label: &str) -> std::result::Result<(), String> {
    if label.trim().is_empty() {
        return Err("is empty".into());
    }
    if label.contains(['\n', '\r']) {
        return Err("must be one line".into());
    }
    if label.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if label.chars().count() > 200 {
        return Err("is longer than 200 characters".into());
    }
    Ok(())
}

/// What a run's name is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parts {
    /// The user's label.
    pub label: Option<String>,
    /// The run's folder (absolute): see the module docs.
    pub folder: PathBuf,
    /// `N` of `-rankN` in the stem.
    pub rank: Option<String>,
    /// The stem's file name (`20261123-073855`).
    pub stem: String,
}

impl Parts {
    pub(crate) fn of(run: &Run) -> Parts {
        let stem = run.name();
        let csv_dir = match run.stem.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let csv_dir = std::fs::canonicalize(&csv_dir).unwrap_or_else(|_| {
            std::env::current_dir()
                .map(|cwd| cwd.join(&csv_dir))
                .unwrap_or(csv_dir)
        });
        let folder = match csv_dir.file_name().and_then(|n| n.to_str()) {
            Some(n) if DEFAULT_CSV_DIRS.contains(&n) => csv_dir
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| csv_dir.clone()),
            _ => csv_dir,
        };
        Parts {
            label: run.label.clone(),
            folder,
            rank: rank_of(&stem),
            stem,
        }
    }
}

/// `N` of a stem `YYYYmmdd-HHMMSS-rankN[-k]`.
fn rank_of(stem: &str) -> Option<String> {
    let at = stem.rfind("-rank")?;
    let rank: String = stem[at + 5..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    (!rank.is_empty()).then_some(rank)
}

/// The last `n` components of `path`, joined by `/` (`x/a`).
fn tail(path: &Path, n: usize) -> String {
    let parts: Vec<String> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    parts[parts.len().saturating_sub(n)..].join("/")
}

/// The names of `runs`, in order, all different (see the module docs).
pub fn names<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Vec<String> {
    unique(runs.into_iter().map(Parts::of).collect())
}

fn with_rank(base: String, p: &Parts) -> String {
    match &p.rank {
        Some(r) if !base.contains(&format!("rank {r}")) => format!("{base} rank {r}"),
        _ => base,
    }
}

/// Indices of the entries of `names` that share their name with another.
fn colliding(names: &[String]) -> Vec<Vec<usize>> {
    let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in names.iter().enumerate() {
        groups.entry(n).or_default().push(i);
    }
    let mut out: Vec<Vec<usize>> = groups.into_values().filter(|g| g.len() > 1).collect();
    out.sort();
    out
}

pub(crate) fn unique(parts: Vec<Parts>) -> Vec<String> {
    // The label or the folder's name, and the rank.
    let mut names: Vec<String> = parts
        .iter()
        .map(|p| {
            let base = p.label.clone().unwrap_or_else(|| tail(&p.folder, 1));
            if base.is_empty() {
                p.stem.clone() // the root folder: nothing else to go by
            } else {
                with_rank(base, p)
            }
        })
        .collect();
    // Still together: the shortest ends of their folders' paths that tell them apart.
    for group in colliding(&names) {
        let mut n = 1;
        let depth = group
            .iter()
            .map(|&i| parts[i].folder.components().count())
            .max()
            .unwrap_or(1);
        let distinct = |n: usize| {
            let mut seen: Vec<String> = group.iter().map(|&i| tail(&parts[i].folder, n)).collect();
            seen.sort();
            seen.dedup();
            seen.len()
        };
        let folders = distinct(depth);
        if folders < 2 {
            continue; // one folder: their stems tell them apart
        }
        while n < depth && distinct(n) < folders {
            n += 1;
        }
        for &i in &group {
            let p = &parts[i];
            let path = tail(&p.folder, n);
            names[i] = match &p.label {
                Some(l) => with_rank(format!("{l} ({path})"), p),
                None => with_rank(path, p),
            };
        }
    }
    // Runs of one folder: their stems (which hold the rank).
    let one_folder = parts.iter().all(|p| p.folder == parts[0].folder);
    for group in colliding(&names) {
        for &i in &group {
            let p = &parts[i];
            names[i] = match &p.label {
                Some(l) => format!("{l} ({})", p.stem),
                // The folder tells no run apart: the stem alone.
                None if one_folder => p.stem.clone(),
                None => format!("{} ({})", names[i], p.stem),
            };
        }
    }
    // The same run twice: numbered.
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in &names {
        if !out.contains(name) {
            out.push(name.clone());
            continue;
        }
        let numbered = (2..)
            .map(|k| format!("{name} ({k})"))
            .find(|c| !out.contains(c) && !names.contains(c))
            .expect("an unused number exists");
        out.push(numbered);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(label: Option<&str>, folder: &str, stem: &str) -> Parts {
        Parts {
            label: label.map(String::from),
            folder: PathBuf::from(folder),
            rank: rank_of(stem),
            stem: stem.into(),
        }
    }

    #[test]
    fn labels_win_then_folders_then_ranks() {
        let names = unique(vec![
            parts(Some("batch 16"), "/w/a", "20261123-073855"),
            parts(None, "/w/b", "20261123-073855"),
            parts(None, "/w/c", "20261123-073855-rank3"),
        ]);
        assert_eq!(names, ["batch 16", "b", "c rank 3"]);
    }

    #[test]
    fn ranks_of_one_job_in_one_folder_are_named_by_rank() {
        let names = unique(vec![
            parts(None, "/w/job", "20261123-073855-rank0"),
            parts(None, "/w/job", "20261123-073855-rank1"),
        ]);
        assert_eq!(names, ["job rank 0", "job rank 1"]);
        // The same label for every rank: the rank tells them apart.
        let names = unique(vec![
            parts(Some("batch 16"), "/w/job", "20261123-073855-rank0"),
            parts(Some("batch 16"), "/w/job", "20261123-073855-rank1"),
        ]);
        assert_eq!(names, ["batch 16 rank 0", "batch 16 rank 1"]);
    }

    #[test]
    fn folders_of_the_same_name_are_told_apart_by_the_part_that_differs() {
        let names = unique(vec![
            parts(None, "/w/x/a", "20261123-073855"),
            parts(None, "/w/y/a", "20261123-073855"),
            parts(None, "/w/b", "20261123-073855"),
        ]);
        assert_eq!(names, ["x/a", "y/a", "b"]);
        let names = unique(vec![
            parts(Some("base"), "/w/x/a", "20261123-073855"),
            parts(Some("base"), "/w/y/a", "20261123-073855"),
        ]);
        assert_eq!(names, ["base (x/a)", "base (y/a)"]);
    }

    #[test]
    fn runs_of_one_folder_are_named_by_their_stems() {
        let names = unique(vec![
            parts(None, "/w/p", "20261122-172024"),
            parts(None, "/w/p", "20261122-172027"),
        ]);
        assert_eq!(names, ["20261122-172024", "20261122-172027"]);
        let names = unique(vec![
            parts(Some("l"), "/w/p", "20261122-172024"),
            parts(Some("l"), "/w/p", "20261122-172024-2"),
        ]);
        assert_eq!(names, ["l (20261122-172024)", "l (20261122-172024-2)"]);
    }

    #[test]
    fn the_same_run_twice_is_numbered_and_every_name_is_unique() {
        let names = unique(vec![
            parts(None, "/w/p", "20261122-172024"),
            parts(None, "/w/p", "20261122-172024"),
            parts(None, "/w/p", "20261122-172024"),
        ]);
        assert_eq!(
            names,
            [
                "20261122-172024",
                "20261122-172024 (2)",
                "20261122-172024 (3)"
            ]
        );
        // A label that is another run's folder name.
        let names = unique(vec![
            parts(Some("a"), "/w/z", "s1"),
            parts(None, "/w/a", "s2"),
        ]);
        assert_eq!(names.len(), 2);
        assert_ne!(names[0], names[1]);
    }

    #[test]
    fn fifty_runs_of_a_sweep_get_fifty_names() {
        let ps: Vec<Parts> = (0..50)
            .map(|i| {
                parts(
                    None,
                    &format!("/sweep/lr{}/out", i % 10),
                    &format!("2026-{}", i / 10),
                )
            })
            .collect();
        let names = unique(ps);
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 50, "{names:?}");
        assert_eq!(names[0], "lr0/out (2026-0)");
    }

    #[test]
    fn ranks_are_read_from_stems() {
        assert_eq!(rank_of("20261123-073855-rank12"), Some("12".into()));
        assert_eq!(rank_of("20261123-073855-rank1-2"), Some("1".into()));
        assert_eq!(rank_of("20261123-073855"), None);
        assert_eq!(rank_of("x-rank"), None);
    }

    #[test]
    fn labels_are_one_line_of_printable_text() {
        assert!(check_label("batch 16").is_ok());
        assert!(check_label("lr=3e-4, ResNet-50 ✓").is_ok());
        assert_eq!(check_label("  "), Err("is empty".into()));
        assert_eq!(check_label("a\nb"), Err("must be one line".into()));
        assert!(check_label("a\u{1b}[31m").is_err());
        assert!(check_label(&"x".repeat(201)).is_err());
    }

    #[test]
    fn the_default_csv_folder_is_named_by_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let header = "timestamp,epoch,iteration,device,allocated_bytes,peak_allocated_bytes,reserved_bytes,peak_reserved_bytes,weights_bytes,buffers_bytes,gradients_bytes,feature_maps_bytes,intermediate_gradients_bytes,optimizer_state_bytes,other_bytes,step,backward_passes\nt,1,1,cpu,1,1,1,1,1,0,0,0,0,0,0,1,1\n";
        let mut runs = Vec::new();
        for (folder, csv) in [
            ("a", "memory_csv_data"),
            ("b", "memory_csv_data"),
            ("c", "out"),
        ] {
            let d = dir.path().join(folder).join(csv);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("20261123-073855_summary.csv"), header).unwrap();
            runs.push(Run::open(&d).unwrap());
        }
        assert_eq!(names(&runs), ["a", "b", "out"]);
        runs[1].label = Some("batch 48".into());
        assert_eq!(names(&runs), ["a", "batch 48", "out"]);
    }
}
