//! `tch-memprof watch` on a real run's files: the quickstart example trains on the CPU
//! and writes its CSV; the screen (printed with `--snapshot`, and read from tmux panes
//! of 60 and 120 columns while the run goes on and after it ends) shows the CSV's
//! numbers; `q` and Ctrl-C quit and give the terminal back.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes as a person reads them, written here apart from the crate: binary units, two
/// decimals (`16.72 MiB`, `768 B`).
fn human(n: u64) -> String {
    if n < 1024 {
        return format!("{n} B");
    }
    let units = ["KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", units[u])
}

fn quickstart() -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let example = exe.parent()?.parent()?.join("examples/quickstart");
    if example.exists() {
        Some(example)
    } else {
        common::cannot_run(&format!(
            "watch on the quickstart's files: {} is not built (a whole `cargo test` builds it)",
            example.display()
        ));
        None
    }
}

/// Starts the quickstart on the CPU in `dir` (it writes `memory_csv_data/` there).
fn start_quickstart(example: &Path, dir: &Path, epochs: &str, iterations: &str) -> Child {
    Command::new(example)
        .args([
            "--device",
            "cpu",
            "--epochs",
            epochs,
            "--iterations",
            iterations,
        ])
        .current_dir(dir)
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts the quickstart")
}

/// The rows of the run's `suffix` file in `dir/memory_csv_data`, by column.
fn rows(dir: &Path, suffix: &str) -> Vec<csv::StringRecord> {
    let folder = dir.join("memory_csv_data");
    let file = std::fs::read_dir(&folder)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(suffix))
        .unwrap_or_else(|| panic!("no *{suffix} in {}", folder.display()));
    let mut r = csv::Reader::from_path(file).unwrap();
    let headers = r.headers().unwrap().clone();
    let mut out = vec![headers];
    out.extend(r.records().map(|r| r.unwrap()));
    out
}

fn cell(rows: &[csv::StringRecord], row: &csv::StringRecord, column: &str) -> u64 {
    let i = rows[0].iter().position(|h| h == column).expect(column);
    row[i].parse().unwrap()
}

#[test]
fn the_screen_shows_a_real_runs_csv() {
    let Some(example) = quickstart() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = start_quickstart(&example, dir.path(), "3", "20")
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let summary = rows(dir.path(), "_summary.csv");
    let last = summary.last().unwrap();
    let epochs = rows(dir.path(), "_epochs.csv");
    for (size, narrow) in [("60x24", true), ("120x30", false)] {
        let out = Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
            .args(["watch", "--snapshot", size])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let screen = common::text(&out.stdout);
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        let (cols, lines) = size.split_once('x').unwrap();
        assert_eq!(screen.lines().count(), lines.parse::<usize>().unwrap());
        assert!(screen
            .lines()
            .all(|l| l.chars().count() <= cols.parse().unwrap()));
        let step = cell(&summary, last, "step");
        let title = if narrow {
            format!("epoch 3 it 20 · step {step}")
        } else {
            format!("epoch 3 iteration 20 (step {step})")
        };
        assert!(screen.contains(&title), "{title}:\n{screen}");
        for column in [
            "allocated_bytes",
            "peak_allocated_bytes",
            "resident_bytes",
            "weights_bytes",
            "gradients_bytes",
            "optimizer_state_bytes",
            "feature_maps_bytes",
        ] {
            let shown = human(cell(&summary, last, column));
            assert!(screen.contains(&shown), "{column} {shown}:\n{screen}");
        }
        for e in &epochs[1..] {
            let shown = human(cell(&epochs, e, "peak_allocated_bytes"));
            assert!(screen.contains(&shown), "epoch peak {shown}:\n{screen}");
        }
        let peak = summary[1..]
            .iter()
            .map(|r| cell(&summary, r, "peak_allocated_bytes"))
            .max()
            .unwrap();
        assert!(
            screen.contains(&format!("run's peak {}", human(peak))),
            "{screen}"
        );
        if !narrow {
            // The largest variable of the CNN: fc1's 4096 x 256 f32 weight.
            assert!(screen.contains("fc1.weight"), "{screen}");
        } else {
            docs_block_is(&screen);
        }
    }
    // Bad input: a folder without a run, in one line, exit 2.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .args(["watch", &empty.path().to_string_lossy()])
        .output()
        .unwrap();
    let err = common::text(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("holds no run"), "{err}");
    // Not a terminal and no --snapshot: said, not drawn.
    let out = Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .args(["watch"])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(common::text(&out.stderr).contains("--snapshot"));
}

/// `line` with the first figure after `from` (`16.72 MiB`, `+12.26 MiB`, `768 B`) as
/// `<bytes>`, the columns kept.
fn mask_after(line: &str, from: usize) -> String {
    let units = [" B", " KiB", " MiB", " GiB"];
    let rest = &line[from..];
    let Some(start) = rest.find(|c: char| c.is_ascii_digit()) else {
        return line.to_string();
    };
    let start = if rest[..start].ends_with(['+', '-']) {
        start - 1
    } else {
        start
    };
    let tail = &rest[start..];
    let num = tail
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(tail.len());
    let Some(unit) = units.iter().find(|u| tail[num..].starts_with(**u)) else {
        return line.to_string();
    };
    let end = from + start + num + unit.len();
    let width = line[from + start..end].chars().count();
    format!(
        "{}{:<width$}{}",
        &line[..from + start],
        "<bytes>",
        &line[end..]
    )
}

/// A 60-column screen with what moves from machine to machine masked: the run's stem,
/// the chart (its lines and scale follow the resident memory), the resident memory and
/// the peaks allocated (which hold the CPU's convolution temporaries), the status line.
fn steady(screen: &str) -> Vec<String> {
    let lines: Vec<&str> = screen.lines().collect();
    let axis = lines
        .iter()
        .position(|l| l.starts_with("│      └"))
        .unwrap_or(1);
    let mut in_epochs = false;
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut l = l.to_string();
            if l.starts_with("┌ epochs") {
                in_epochs = true;
            }
            if i == 0 {
                return l
                    .split_once(" on ")
                    .map_or(l.clone(), |(_, rest)| format!("RUN on {rest}"));
            }
            if i + 1 == lines.len() {
                return "<status>".into();
            }
            if i > 1 && i < axis {
                return "<chart>".into();
            }
            for word in ["run's peak", "peak allocated", "resident"] {
                if let Some(at) = l.find(word) {
                    l = mask_after(&l, at + word.len());
                }
            }
            let digit_row = l
                .strip_prefix('│')
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
            if in_epochs && digit_row {
                // An epoch's row: its peak allocated.
                l = mask_after(&l, '│'.len_utf8() + 1);
            }
            l
        })
        .collect()
}

/// The screen docs/watch.md shows is this one, but for what moves with the machine.
fn docs_block_is(screen: &str) {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/watch.md"))
        .unwrap();
    let block = doc
        .split_once("<!-- screen watch")
        .and_then(|(_, rest)| rest.split_once("```text\n"))
        .and_then(|(_, rest)| rest.split_once("```\n<!-- end watch -->"))
        .map(|(block, _)| block)
        .expect("docs/watch.md: the screen between its markers");
    let (theirs, ours) = (steady(block), steady(screen));
    assert_eq!(theirs.len(), ours.len(), "{block}\n{screen}");
    for (a, b) in theirs.iter().zip(&ours) {
        assert_eq!(
            a, b,
            "docs/watch.md's screen differs:\n{block}\nthis run's:\n{screen}"
        );
    }
    // What stays held: the breakdown's other numbers and the epochs' changes.
    assert!(ours.iter().any(|l| l.contains("16.72 MiB")), "{ours:?}");
    assert!(ours.iter().any(|l| l.contains("+12.26 MiB")), "{ours:?}");
    assert!(ours.iter().any(|l| l.contains("8.17 MiB")), "{ours:?}");
}

/// A tmux server of this test's own, on a socket of its own.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("runs tmux");
        common::text(&out.stdout)
    }

    fn screen(&self, session: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", session])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

/// The step the screen's title shows (`· step 40` narrow, `(step 40)` wide).
fn step_shown(screen: &str) -> Option<u64> {
    let title = screen.lines().next()?;
    let at = title.rfind("step ")?;
    title[at + 5..]
        .trim_end_matches(')')
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn watch_follows_a_running_quickstart_in_tmux() {
    let Some(example) = quickstart() else { return };
    if Command::new("tmux").arg("-V").output().is_err() {
        common::cannot_run("watch in tmux: tmux is not installed (.ci/run installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux {
        socket: format!("tch-memprof-watch-{}", std::process::id()),
    };
    let exe = env!("CARGO_BIN_EXE_tch-memprof");
    // Started before the training: it waits for the run's first file.
    for (name, cols, rows) in [("narrow", "60", "24"), ("wide", "120", "30")] {
        // After watch: its exit status, and the terminal's modes (raw mode undone).
        let script = format!(
            "cd '{}' && '{exe}' watch; echo $? > {name}.exit; stty -a > {name}.stty; sleep 30",
            dir.path().display()
        );
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            cols,
            "-y",
            rows,
            "sh",
            "-c",
            &script,
        ]);
    }
    let start = Instant::now();
    loop {
        let screen = tmux.screen("narrow");
        if screen.contains("waiting for a run in memory_csv_data") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not waiting:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut run = start_quickstart(&example, dir.path(), "3", "60");
    // Rows appear while the run goes on.
    let mut seen: Vec<u64> = Vec::new();
    let mut last_screen = String::new();
    while run.try_wait().unwrap().is_none() {
        let screen = tmux.screen("narrow");
        if let Some(s) = step_shown(&screen) {
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        last_screen = screen;
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the quickstart did not end"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(run.wait().unwrap().success());
    assert!(
        seen.len() >= 2,
        "the screen showed steps {seen:?} while the run went on:\n{last_screen}"
    );
    // After it ends, both widths show its last row.
    let summary = rows(dir.path(), "_summary.csv");
    let final_step = cell(&summary, summary.last().unwrap(), "step");
    let waited = Instant::now();
    for session in ["narrow", "wide"] {
        let screen = loop {
            let s = tmux.screen(session);
            if step_shown(&s) == Some(final_step) || waited.elapsed() > Duration::from_secs(10) {
                break s;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(
            step_shown(&screen),
            Some(final_step),
            "{session}:\n{screen}"
        );
        let width = if session == "narrow" { 60 } else { 120 };
        assert!(
            screen.lines().all(|l| l.chars().count() <= width),
            "{screen}"
        );
        assert!(screen.contains("epochs"), "{screen}");
        let peak = human(cell(
            &summary,
            summary.last().unwrap(),
            "peak_allocated_bytes",
        ));
        assert!(screen.contains(&peak), "{session}: {peak}\n{screen}");
    }
    // A run started later in the folder is followed from then on.
    let first = tmux.screen("narrow");
    let first_run = first.split(" on ").next().unwrap().to_string();
    let out = start_quickstart(&example, dir.path(), "1", "10")
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let waited = Instant::now();
    loop {
        let screen = tmux.screen("narrow");
        let run = screen.split(" on ").next().unwrap();
        if run != first_run && step_shown(&screen) == Some(10) {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(15),
            "the second run is not shown:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // q quits one, Ctrl-C the other; each gives the terminal back.
    tmux.run(&["send-keys", "-t", "narrow", "q"]);
    tmux.run(&["send-keys", "-t", "wide", "C-c"]);
    for name in ["narrow", "wide"] {
        let exit = dir.path().join(format!("{name}.exit"));
        let waited = Instant::now();
        while !exit.exists() || std::fs::read_to_string(&exit).unwrap().is_empty() {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "{name}: watch did not quit"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            std::fs::read_to_string(&exit).unwrap().trim(),
            "0",
            "{name}"
        );
        let stty = std::fs::read_to_string(dir.path().join(format!("{name}.stty"))).unwrap();
        let modes: Vec<&str> = stty.split_whitespace().collect();
        for mode in ["icanon", "echo", "isig"] {
            assert!(modes.contains(&mode), "{name}: {mode} not restored: {stty}");
        }
    }
}
