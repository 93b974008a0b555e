//! The view against files written here in the profiler's row types; the keys; bad input.
//! (`tests/watch.rs` runs the command on a real run's files, and live in tmux.)

use std::path::Path;
use std::time::{Duration, SystemTime};

use ratatui::crossterm::event::KeyCode;

use super::follow::{find_run, Watched};
use super::view::{ChartKind, Ui, QUIET};
use super::{key, parse_size, render, screen, view};
use crate::format::bytes;
use crate::runs::{EpochRow, LeakRow, ParameterRow, SummaryRow};

/// A run of `epochs` x `iterations` on the CPU, its allocated growing by 1 MiB a step
/// (20 MiB and the step; weights 4, gradients 4, optimizer state 8, the rest other).
fn write_run(dir: &Path, name: &str, epochs: u64, iterations: u64) -> std::path::PathBuf {
    let stem = dir.join(name);
    let path = |s: &str| dir.join(format!("{name}{s}"));
    let mut summary = csv::Writer::from_path(path("_summary.csv")).unwrap();
    let mut params = csv::Writer::from_path(path("_parameters.csv")).unwrap();
    let mut epoch_rows = csv::Writer::from_path(path("_epochs.csv")).unwrap();
    let mut step = 0;
    for epoch in 1..=epochs {
        for iteration in 1..=iterations {
            step += 1;
            summary
                .serialize(SummaryRow {
                    epoch,
                    iteration,
                    step,
                    device: "cpu".into(),
                    allocated_bytes: (20 + step) << 20,
                    peak_allocated_bytes: (30 + step) << 20,
                    reserved_bytes: 300 << 20,
                    peak_reserved_bytes: 310 << 20,
                    weights_bytes: 4 << 20,
                    gradients_bytes: 4 << 20,
                    optimizer_state_bytes: 8 << 20,
                    feature_maps_bytes: 3 << 20,
                    other_bytes: (step + 4) << 20,
                    backward_passes: 1,
                    ..SummaryRow::default()
                })
                .unwrap();
            // The variables' rows as the profiler writes them: the whole set at an
            // epoch's first report (and when one changes, which none does here).
            let set: &[(&str, u64)] = if iteration == 1 {
                &[("fc1.weight", 3 << 20), ("fc2.weight", 1 << 20)]
            } else {
                &[]
            };
            for &(p, w) in set {
                for kind in ["weight", "gradient"] {
                    params
                        .serialize(ParameterRow {
                            epoch,
                            iteration,
                            parameter: p.into(),
                            kind: kind.into(),
                            dtype: "f32".into(),
                            shape: "[1]".into(),
                            bytes: w,
                            ..ParameterRow::default()
                        })
                        .unwrap();
                }
            }
        }
        epoch_rows
            .serialize(EpochRow {
                epoch,
                iterations,
                peak_allocated_bytes: (30 + step) << 20,
                peak_reserved_bytes: 310 << 20,
                allocated_bytes: (20 + step) << 20,
                allocated_change_bytes: (iterations as i64) << 20,
                ..EpochRow::default()
            })
            .unwrap();
    }
    let mut leaks = csv::Writer::from_path(path("_leaks.csv")).unwrap();
    leaks
        .serialize(LeakRow {
            epoch: epochs,
            op: "aten::cat".into(),
            phase: crate::phase::Phase::Forward,
            layer: "history".into(),
            first_iteration: 1,
            last_iteration: iterations,
            count: iterations,
            bytes: 5 << 20,
        })
        .unwrap();
    stem
}

#[test]
fn the_screen_shows_the_files_numbers_at_60_and_120_columns() {
    let dir = tempfile::tempdir().unwrap();
    let stem = write_run(dir.path(), "20261205-080000", 2, 5);
    let w = Watched::open(&stem).unwrap();
    assert_eq!(w.summary.len(), 10);
    let ui = Ui::new(Some(64 << 20));
    for (cols, rows) in [(60, 24), (120, 30)] {
        let text = screen(&w, &ui, cols, rows, SystemTime::now());
        println!("{text}");
        assert_eq!(text.lines().count(), rows as usize);
        for line in text.lines() {
            assert!(line.chars().count() <= cols as usize, "{line}");
        }
        // The last iteration's row, as its CSV has it.
        for expected in [
            "epoch 2 it".to_string(),
            bytes(30 << 20),  // allocated
            bytes(40 << 20),  // peak allocated
            bytes(300 << 20), // resident
            bytes(8 << 20),   // optimizer state
            "resident".into(),
            "aten::cat in history".into(),
            "run's peak 40.00 MiB at step 10".into(),
        ] {
            assert!(
                text.contains(&expected),
                "{cols}x{rows}: {expected:?} missing:\n{text}"
            );
        }
        if rows >= 30 {
            assert!(text.contains("fc1.weight"), "{text}");
        }
    }
}

/// An iteration's variables are those of the latest set of parameter rows at or before
/// it; before the first set, none.
#[test]
fn an_iterations_variables_are_the_latest_set_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let stem = write_run(dir.path(), "r", 2, 3);
    // A changed set at epoch 1 iteration 3 (fc2's gradient went).
    let mut params = csv::WriterBuilder::new().has_headers(false).from_writer(
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("r_parameters.csv"))
            .unwrap(),
    );
    for (p, kind, b) in [
        ("fc1.weight", "weight", 3u64 << 20),
        ("fc1.weight", "gradient", 3 << 20),
        ("fc2.weight", "weight", 1 << 20),
    ] {
        params
            .serialize(ParameterRow {
                epoch: 1,
                iteration: 3,
                parameter: p.into(),
                kind: kind.into(),
                bytes: b,
                ..ParameterRow::default()
            })
            .unwrap();
    }
    drop(params);
    let w = Watched::open(&stem).unwrap();
    let at = |e, i| -> Vec<(String, u64, u64)> {
        w.variables_at(e, i)
            .into_iter()
            .map(|v| (v.name, v.weight, v.gradient))
            .collect()
    };
    let first = vec![
        ("fc1.weight".to_string(), 3 << 20, 3 << 20),
        ("fc2.weight".to_string(), 1 << 20, 1 << 20),
    ];
    let changed = vec![
        ("fc1.weight".to_string(), 3 << 20, 3 << 20),
        ("fc2.weight".to_string(), 1 << 20, 0),
    ];
    assert_eq!(at(0, 9), vec![]);
    assert_eq!(at(1, 1), first);
    assert_eq!(at(1, 2), first);
    assert_eq!(at(1, 3), changed);
    // Epoch 2's first report wrote the set again (write_run's order puts it before the
    // appended rows in the file; the key, not the file's order, decides).
    assert_eq!(at(2, 3), first);
}

#[test]
fn keys_scroll_pause_switch_and_follow_again() {
    let dir = tempfile::tempdir().unwrap();
    let w = Watched::open(&write_run(dir.path(), "r", 1, 5)).unwrap();
    let mut ui = Ui::new(None);
    assert_eq!(ui.selected(&w).unwrap().0, 4);
    key(&mut ui, &w, KeyCode::Left);
    key(&mut ui, &w, KeyCode::Left);
    assert_eq!(ui.selected(&w).unwrap().1.step, 3);
    let text = screen(&w, &ui, 120, 30, SystemTime::now());
    assert!(
        text.contains("epoch 1 iteration 3 (step 3) · 2 newer"),
        "{text}"
    );
    assert!(text.contains(&bytes(23 << 20)), "{text}");
    key(&mut ui, &w, KeyCode::Right);
    key(&mut ui, &w, KeyCode::Right);
    assert_eq!(ui.cursor, None, "back at the newest, it follows again");
    key(&mut ui, &w, KeyCode::PageUp);
    assert_eq!(
        ui.selected(&w).unwrap().0,
        0,
        "ten back, at most to the first"
    );
    key(&mut ui, &w, KeyCode::PageDown);
    assert_eq!(ui.cursor, None, "ten on, past the newest: following");
    key(&mut ui, &w, KeyCode::Home);
    assert_eq!(ui.selected(&w).unwrap().0, 0);
    key(&mut ui, &w, KeyCode::End);
    assert_eq!(ui.cursor, None);
    key(&mut ui, &w, KeyCode::Char('p'));
    assert!(ui.paused);
    assert!(screen(&w, &ui, 120, 30, SystemTime::now()).contains("paused (p resumes)"));
    key(&mut ui, &w, KeyCode::Char('p'));
    assert!(!ui.paused);
    key(&mut ui, &w, KeyCode::Char('c'));
    assert_eq!(ui.chart, ChartKind::Categories);
    assert!(screen(&w, &ui, 120, 30, SystemTime::now()).contains(" by category (MiB) · c: totals "));
    key(&mut ui, &w, KeyCode::Char('c'));
    assert_eq!(ui.chart, ChartKind::Totals);
}

#[test]
fn a_quiet_run_a_small_terminal_and_bad_input_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let w = Watched::open(&write_run(dir.path(), "r", 1, 2)).unwrap();
    let ui = Ui::new(None);
    let later = SystemTime::now() + QUIET + Duration::from_secs(5);
    assert!(screen(&w, &ui, 120, 30, later).contains("the run stopped writing"));
    assert!(screen(&w, &ui, 40, 10, SystemTime::now()).contains("terminal too small (40x10)"));
    // No run; another name; a CSV of another tool.
    let empty = tempfile::tempdir().unwrap();
    let err = find_run(empty.path(), None).unwrap_err();
    assert!(err.contains("holds no run"), "{err}");
    let err = find_run(dir.path(), Some("nope")).unwrap_err();
    assert!(
        err.contains("--run nope") && err.contains("the newest: r"),
        "{err}"
    );
    let err = find_run(&dir.path().join("missing"), None).unwrap_err();
    assert!(err.starts_with("no run at "), "{err}");
    // Waited on, a mistyped folder says so on the screen, at 60 columns too.
    let shown = render(60, 16, |f| {
        view::draw_waiting(f, "waiting for a run in missing", Some(&err))
    });
    let words = shown
        .split(|c: char| c.is_whitespace() || c == '│')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(words.contains("not yet: no run at "), "{shown}");
    assert!(words.contains("(memory_csv_data by default)"), "{shown}");
    std::fs::write(empty.path().join("x_summary.csv"), "when,value\n1,2\n").unwrap();
    let stem = find_run(empty.path(), None).unwrap();
    let err = Watched::open(&stem).err().unwrap();
    assert!(
        err.contains("is not a file of a tch-memprof run: it has no column"),
        "{err}"
    );
    assert!(parse_size("120x30").is_ok());
    assert!(parse_size("120").unwrap_err().contains("--snapshot"));
}

#[test]
fn rows_appear_as_they_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let stem = write_run(dir.path(), "r", 1, 2);
    let mut w = Watched::open(&stem).unwrap();
    assert_eq!(w.summary.len(), 2);
    assert!(!w.poll().unwrap(), "nothing new");
    // Half a row, then the rest.
    let path = dir.path().join("r_summary.csv");
    let full = std::fs::read_to_string(&path).unwrap();
    let last = full
        .lines()
        .last()
        .unwrap()
        .replace(",1,2,cpu,", ",1,3,cpu,");
    let (head, tail) = last.split_at(last.len() / 2);
    std::fs::write(&path, format!("{full}{head}")).unwrap();
    w.poll().unwrap();
    assert_eq!(w.summary.len(), 2);
    std::fs::write(&path, format!("{full}{head}{tail}\n")).unwrap();
    assert!(w.poll().unwrap());
    assert_eq!(w.summary.len(), 3);
    assert_eq!(w.summary[2].iteration, 3);
}
