//! `tch-memprof watch`: a live terminal view of a run's files as the profiler writes
//! them (`.csv(true)`), from another terminal; a finished run opens the same way.
//!
//! It reads only what the profiler already writes: `<run>_summary.csv` (a row per
//! reported iteration), `<run>_epochs.csv`, `<run>_leaks.csv`, `<run>_parameters.csv`
//! and `<run>_run.csv`, each from where the last read stopped, four times a second.

mod follow;
mod view;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::Args;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::Terminal;

use crate::cli::fail;
use crate::cli::model_args::gpu_and_memory;
use follow::{find_run, Watched};
use view::{ChartKind, Ui};

/// How often the files are read.
const POLL: Duration = Duration::from_millis(250);
/// How often the folder is looked at for a newer run.
const NEWER_RUN: Duration = Duration::from_secs(2);

#[derive(Args)]
pub struct WatchArgs {
    /// The folder the profiler writes its CSV files to (its csv_dir), or a run's stem or
    /// one of its files. The newest run there (the one whose summary was written last)
    /// unless --run names another.
    #[arg(default_value = "memory_csv_data")]
    dir: PathBuf,
    /// The run to watch in DIR, by its stem's name (20261205-081500).
    #[arg(long, value_name = "NAME")]
    run: Option<String>,
    /// A budget drawn on the chart, and the peak's share of it: bytes (80GiB) or a GPU
    /// (h100: its memory less 1 GiB for the CUDA context).
    #[arg(long)]
    memory: Option<String>,
    /// Print one screen of the view as text, COLSxROWS (120x30), and exit: for a log, a
    /// test or an issue, where no terminal is at hand.
    #[arg(long, value_name = "COLSxROWS")]
    snapshot: Option<String>,
}

pub fn run(a: &WatchArgs) -> ExitCode {
    match watch(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn watch(a: &WatchArgs) -> Result<(), String> {
    let budget = match &a.memory {
        Some(m) => gpu_and_memory(None, Some(m))?.1,
        None => None,
    };
    let terminal_out = std::io::IsTerminal::is_terminal(&std::io::stdout());
    // On a terminal, a folder without a run yet is waited on (watch started before the
    // training); elsewhere it is the error.
    // Why there is no run yet, shown while waiting.
    let mut why = None;
    let mut watched = match find_run(&a.dir, a.run.as_deref()) {
        Ok(stem) => Some(Watched::open(&stem)?),
        Err(e) if a.snapshot.is_some() || !terminal_out => return Err(e),
        Err(e) => {
            why = Some(e);
            None
        }
    };
    let mut ui = Ui::new(budget);
    if let (Some(size), Some(w)) = (&a.snapshot, &watched) {
        let (cols, rows) = parse_size(size)?;
        print!("{}", screen(w, &ui, cols, rows, SystemTime::now()));
        return Ok(());
    }
    if !terminal_out {
        return Err(
            "watch draws on a terminal and its output is not one: run it in a terminal, \
             or print one screen with --snapshot 120x30"
                .into(),
        );
    }
    let mut terminal =
        ratatui::try_init().map_err(|e| format!("cannot take over the terminal: {e}"))?;
    // The terminal is given back however the loop ends (ratatui's panic hook covers a
    // panic), before an error is printed.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            ratatui::restore();
        }
    }
    let _restore = Restore;
    let waiting = match &a.run {
        Some(name) => format!("waiting for the run {name} in {}", a.dir.display()),
        None => format!("waiting for a run in {}", a.dir.display()),
    };
    let mut polled = Instant::now();
    let mut looked = Instant::now();
    loop {
        if !ui.paused && polled.elapsed() >= POLL {
            polled = Instant::now();
            match &mut watched {
                Some(w) => ui.problem = w.poll().err(),
                None => match find_run(&a.dir, a.run.as_deref()) {
                    Ok(stem) => watched = Some(Watched::open(&stem)?),
                    Err(e) => why = Some(e),
                },
            }
            // A newer run in the folder (the training started again) is followed, unless
            // --run named one.
            if a.run.is_none() && a.dir.is_dir() && looked.elapsed() >= NEWER_RUN {
                looked = Instant::now();
                if let (Ok(stem), Some(w)) = (find_run(&a.dir, None), &watched) {
                    if stem != w.stem {
                        watched = Some(Watched::open(&stem)?);
                        ui.cursor = None;
                    }
                }
            }
        }
        terminal
            .draw(|f| match &watched {
                Some(w) => view::draw(f, w, &ui, SystemTime::now()),
                None => view::draw_waiting(f, &waiting, why.as_deref()),
            })
            .map_err(|e| format!("cannot draw on the terminal: {e}"))?;
        let ready = event::poll(POLL).map_err(|e| format!("cannot read the keyboard: {e}"))?;
        if !ready {
            continue;
        }
        match event::read().map_err(|e| format!("cannot read the keyboard: {e}"))? {
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                let ctrl_c = k.modifiers.contains(KeyModifiers::CONTROL)
                    && matches!(k.code, KeyCode::Char('c'));
                if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                    break;
                }
                if let Some(w) = &watched {
                    key(&mut ui, w, k.code);
                }
            }
            _ => {}
        }
    }
    drop(terminal);
    Ok(())
}

/// What a key does to the view (quitting aside).
fn key(ui: &mut Ui, w: &Watched, code: KeyCode) {
    let last = w.summary.len().saturating_sub(1);
    let at = ui.cursor.unwrap_or(last);
    let to = |i: usize| if i >= last { None } else { Some(i) };
    match code {
        KeyCode::Char('p') | KeyCode::Char(' ') => ui.paused = !ui.paused,
        KeyCode::Char('c') => {
            ui.chart = match ui.chart {
                ChartKind::Totals => ChartKind::Categories,
                ChartKind::Categories => ChartKind::Totals,
            }
        }
        KeyCode::Left | KeyCode::Char('h') => ui.cursor = Some(at.saturating_sub(1)),
        KeyCode::Right | KeyCode::Char('l') => ui.cursor = to(at + 1),
        KeyCode::PageUp => ui.cursor = Some(at.saturating_sub(10)),
        KeyCode::PageDown => ui.cursor = to(at + 10),
        KeyCode::Home => ui.cursor = Some(0),
        KeyCode::End | KeyCode::Char('f') => ui.cursor = None,
        _ => {}
    }
}

/// `120x30`, or why not.
fn parse_size(text: &str) -> Result<(u16, u16), String> {
    let parsed = text
        .split_once(['x', 'X'])
        .and_then(|(c, r)| Some((c.parse::<u16>().ok()?, r.parse::<u16>().ok()?)));
    match parsed {
        Some((c, r)) if c > 0 && r > 0 => Ok((c, r)),
        _ => Err(format!(
            "invalid --snapshot {text:?}: columns x rows, as 120x30"
        )),
    }
}

/// The view drawn at `cols` x `rows`, as text (one line a row, trailing spaces cut).
fn screen(w: &Watched, ui: &Ui, cols: u16, rows: u16, now: SystemTime) -> String {
    render(cols, rows, |f| view::draw(f, w, ui, now))
}

/// What `draw` puts on a screen of `cols` x `rows`, as text.
fn render(cols: u16, rows: u16, draw: impl FnOnce(&mut ratatui::Frame)) -> String {
    let mut t = Terminal::new(TestBackend::new(cols, rows)).expect("a test backend");
    t.draw(draw).expect("a test backend draws");
    let buffer = t.backend().buffer();
    let mut out = String::new();
    for y in 0..rows {
        let mut line = String::new();
        for x in 0..cols {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let _ = std::io::stdout().flush();
    out
}

#[cfg(test)]
mod tests;
