//! A progress line on standard error for a command that runs long: shown once it has run
//! two seconds, only when standard error is a terminal (redirected, it stays clean), and
//! erased before the answer.

use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    /// The line's first words (`tch-memprof plan`, `replay`).
    command: &'static str,
    start: Instant,
    shown: bool,
    terminal: bool,
}

impl Progress {
    pub fn new(command: &'static str) -> Self {
        Progress {
            command,
            start: Instant::now(),
            shown: false,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Shows `what` (with the seconds so far) in place of the last line.
    pub fn say(&mut self, what: &str) {
        let secs = self.start.elapsed().as_secs_f64();
        if self.terminal && secs > 2.0 {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r{}: {what}, {secs:.0} s\x1b[K", self.command);
            let _ = e.flush();
            self.shown = true;
        }
    }

    /// Erases the line before anything else is printed.
    pub fn clear(&mut self) {
        if self.shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
            self.shown = false;
        }
    }
}
