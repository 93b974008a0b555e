//! The CSV rows' timestamps.

/// The rows' timestamps ([`TIMESTAMP_FORMAT`], local time): the date and time to the
/// second formatted by chrono once a second, the milliseconds appended at each row.
/// chrono's local time at every row cost a time-zone conversion and a format, 3 us of a
/// `record_stats` that writes CSV (a launch-bound step's whole budget is a few).
#[derive(Debug, Default)]
pub(super) struct Clock {
    /// The second the prefix is of (seconds since the Unix epoch), and the prefix.
    second: Option<u64>,
    prefix: String,
}

impl Clock {
    pub(super) fn now(&mut self) -> String {
        self.at(Self::since_epoch())
    }

    /// The wall clock now, after the Unix epoch (zero before it).
    pub(super) fn since_epoch() -> std::time::Duration {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
    }

    /// The timestamp of the instant `since_epoch` after the Unix epoch.
    pub(super) fn at(&mut self, since_epoch: std::time::Duration) -> String {
        let mut out = String::new();
        self.write(since_epoch, &mut out);
        out
    }

    /// [`Clock::at`] in `out` (replacing what it held): no allocation once `out` has
    /// room, no formatting machinery within a second (the digits of the milliseconds
    /// written one by one), for the rows written at every step.
    pub(super) fn write(&mut self, since_epoch: std::time::Duration, out: &mut String) {
        use chrono::TimeZone;
        let secs = since_epoch.as_secs();
        if self.second != Some(secs) {
            self.prefix = i64::try_from(secs)
                .ok()
                .and_then(|s| chrono::Local.timestamp_opt(s, 0).single())
                .map(|t| t.format(SECOND_FORMAT).to_string())
                .unwrap_or_default();
            self.second = Some(secs);
        }
        let ms = since_epoch.subsec_millis();
        out.clear();
        out.push_str(&self.prefix);
        out.push('.');
        for d in [ms / 100, ms / 10 % 10, ms % 10] {
            out.push(char::from(b'0' + d as u8));
        }
    }
}

/// The `timestamp` column's format (chrono's strftime): [`SECOND_FORMAT`] and the
/// milliseconds.
#[cfg(test)]
const TIMESTAMP_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.3f";
/// The `timestamp` column to the second.
const SECOND_FORMAT: &str = "%Y-%m-%d %H:%M:%S";

#[cfg(test)]
mod tests {
    use super::*;

    /// The cached clock writes what chrono writes for the same instant, within a
    /// second, across seconds, and back in time (the wall clock can be set back).
    #[test]
    fn the_rows_clock_is_chronos_local_time() {
        use chrono::TimeZone;
        use std::time::Duration;
        let mut clock = Clock::default();
        let base = 1_780_000_000u64; // 2026-05-28, UTC
        for (secs, nanos) in [
            (base, 0),
            (base, 999_999_999),
            (base, 5_000_000),
            (base + 1, 1_000_000),
            (base + 3_600 * 24 * 180, 123_456_789),
            (base - 1, 999_000_000),
            (0, 1),
        ] {
            let chrono = chrono::Local
                .timestamp_opt(secs as i64, nanos)
                .single()
                .unwrap()
                .format(TIMESTAMP_FORMAT)
                .to_string();
            assert_eq!(
                clock.at(Duration::new(secs, nanos)),
                chrono,
                "{secs} s {nanos} ns"
            );
        }
        // Now, between two of chrono's own reads (the format sorts as time does).
        let chrono_now = || chrono::Local::now().format(TIMESTAMP_FORMAT).to_string();
        let before = chrono_now();
        let ours = Clock::default().now();
        let after = chrono_now();
        assert!(
            before <= ours && ours <= after,
            "{before} <= {ours} <= {after}"
        );
    }
}
