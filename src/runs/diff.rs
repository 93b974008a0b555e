//! Comparing two runs: the peak of each category, each layer of the profiled step and
//! each parameter, with a threshold a CI job can gate on (`tch-memprof diff`).

use crate::format;
use crate::runs::Run;

/// One compared figure.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Change {
    /// `category`, `layer` or `parameter`.
    pub scope: &'static str,
    /// The summary column, layer or parameter name.
    pub name: String,
    /// Bytes in the base run (`None`: absent there).
    pub base: Option<u64>,
    /// Bytes in the new run (`None`: absent there).
    pub new: Option<u64>,
}

impl Change {
    /// New minus base, bytes (a figure missing on one side counts as 0 there).
    pub fn delta(&self) -> i64 {
        self.new.unwrap_or(0) as i64 - self.base.unwrap_or(0) as i64
    }

    /// The change relative to the base, in percent; `None` when the base is 0 or absent.
    pub fn percent(&self) -> Option<f64> {
        match self.base {
            Some(b) if b > 0 => Some(self.delta() as f64 * 100.0 / b as f64),
            _ => None,
        }
    }

    /// Whether it grew by more than `max_increase_percent` (a figure that appears from
    /// nothing grows without bound).
    pub fn grew_beyond(&self, max_increase_percent: f64) -> bool {
        self.delta() > 0 && self.percent().map_or(true, |p| p > max_increase_percent)
    }

    /// How a table row names it: the category in words (`feature maps`), `layer NAME`, or the
    /// parameter's name (`NAME grad` for its gradient).
    pub fn label(&self) -> String {
        match self.scope {
            "category" => self.name.trim_end_matches("_bytes").replace('_', " "),
            "layer" => format!("layer {}", self.name),
            _ => self.name.clone(),
        }
    }

    /// `feature_maps_bytes grew by 8864512 B (8.45 MiB, +100.0%)`.
    pub fn describe(&self) -> String {
        let pct = self
            .percent()
            .map_or_else(|| "new".to_string(), |p| format!("{p:+.1}%"));
        let what = match self.scope {
            "category" => self.name.clone(),
            scope => format!("{scope} {}", self.name),
        };
        format!(
            "{what} grew by {} B ({}, {pct})",
            self.delta(),
            format::bytes(self.delta().unsigned_abs())
        )
    }
}

/// The comparison of two runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Diff {
    /// The base run's name (see [`names`](crate::runs::names): its label, folder, rank
    /// or stem, different from the new run's).
    pub base: String,
    /// The new run's name.
    pub new: String,
    /// Every compared figure: categories first, then layers, then parameters.
    pub changes: Vec<Change>,
    /// What makes the two runs hard to compare (another device, say).
    pub notes: Vec<String>,
    /// Shown but never a regression: on the CPU, `peak_resident_bytes` (the reserved
    /// column of a CUDA run) is the process's peak resident memory, which moves with thread pools and the system allocator
    /// from one run to the next whatever the model does.
    pub not_gated: Vec<String>,
}

/// Compares the peaks of `base` and `new`.
pub fn compare(base: &Run, new: &Run) -> Diff {
    let mut changes = Vec::new();
    let (bp, np) = (base.peaks(), new.peaks());
    for (name, b) in &bp {
        changes.push(Change {
            scope: "category",
            name: (*name).to_string(),
            base: Some(*b),
            new: np.get(name).copied(),
        });
    }
    let layers = |r: &Run| -> std::collections::BTreeMap<String, u64> {
        r.layers
            .iter()
            .map(|l| (l.layer.clone(), l.parameters_bytes + l.activation_bytes))
            .collect()
    };
    push_keyed(&mut changes, "layer", layers(base), layers(new));
    push_keyed(
        &mut changes,
        "parameter",
        base.last_parameters(),
        new.last_parameters(),
    );
    let mut notes = Vec::new();
    let (bd, nd) = (base.devices(), new.devices());
    if bd != nd {
        notes.push(format!(
            "the runs are on different devices ({} vs {}): their bytes differ by allocator, not only by model",
            bd.join(", "),
            nd.join(", ")
        ));
    }
    for (key, what) in [("libtorch", "libtorch"), ("tch_memprof", "tch-memprof")] {
        if let (Some(b), Some(n)) = (base.meta.get(key), new.meta.get(key)) {
            if b != n {
                notes.push(format!(
                    "the runs were made with different {what} versions ({b} vs {n}): kernels and their temporaries may differ"
                ));
            }
        }
    }
    let mut not_gated = Vec::new();
    if bd.contains(&"cpu") || nd.contains(&"cpu") {
        // Two CPU runs name the column for what it holds, as their files do.
        let cpu_only = bd.iter().chain(&nd).all(|d| *d == "cpu");
        let name = if cpu_only {
            "peak_resident_bytes"
        } else {
            "peak_reserved_bytes"
        };
        for c in changes
            .iter_mut()
            .filter(|c| c.scope == "category" && c.name == "peak_reserved_bytes")
        {
            c.name = name.to_string();
        }
        not_gated.push(name.to_string());
        notes.push(
            "on the CPU, the peak resident memory (reserved on CUDA) moves with thread pools and the system allocator: shown, not gated"
                .into(),
        );
    }
    if base.layers.is_empty() != new.layers.is_empty() {
        notes.push(
            "only one of the runs has a layers file (timeline on): layers are compared one-sided"
                .into(),
        );
    }
    let [base_name, new_name]: [String; 2] = crate::runs::names([base, new])
        .try_into()
        .expect("two names for two runs");
    Diff {
        base: base_name,
        new: new_name,
        changes,
        notes,
        not_gated,
    }
}

fn push_keyed(
    out: &mut Vec<Change>,
    scope: &'static str,
    base: std::collections::BTreeMap<String, u64>,
    new: std::collections::BTreeMap<String, u64>,
) {
    let mut names: Vec<&String> = base.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        out.push(Change {
            scope,
            name: name.clone(),
            base: base.get(name).copied(),
            new: new.get(name).copied(),
        });
    }
}

impl Diff {
    /// The figures that grew beyond the threshold, largest growth first.
    pub fn regressions(&self, max_increase_percent: f64) -> Vec<&Change> {
        let mut out: Vec<&Change> = self
            .changes
            .iter()
            .filter(|c| c.grew_beyond(max_increase_percent))
            .filter(|c| !(c.scope == "category" && self.not_gated.contains(&c.name)))
            .collect();
        out.sort_by_key(|c| std::cmp::Reverse(c.delta()));
        out
    }

    /// A table of the figures that changed (every category, and the `top` layers and
    /// parameters that changed most), for a terminal.
    pub fn table(&self, top: usize) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
        t.set_header(vec!["peak", "base", "new", "change"]);
        t.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
        let show = |c: &Change| -> Vec<String> {
            let pct = c
                .percent()
                .map(|p| format!(" ({p:+.1}%)"))
                .unwrap_or_default();
            vec![
                c.label(),
                c.base.map_or("-".into(), format::bytes),
                c.new.map_or("-".into(), format::bytes),
                if c.delta() == 0 {
                    "same".into()
                } else {
                    format!("{}{pct}", signed(c.delta()))
                },
            ]
        };
        for c in self.changes.iter().filter(|c| c.scope == "category") {
            t.add_row(show(c));
        }
        for scope in ["layer", "parameter"] {
            let mut changed: Vec<&Change> = self
                .changes
                .iter()
                .filter(|c| c.scope == scope && c.delta() != 0)
                .collect();
            changed.sort_by_key(|c| std::cmp::Reverse(c.delta().unsigned_abs()));
            let n = changed.len();
            for c in changed.iter().take(top) {
                t.add_row(show(c));
            }
            if n > top {
                t.add_row(vec![
                    format!("… {} more {scope}s changed", n - top),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
        t.to_string()
    }
}

/// `+1.50 MiB` / `-512 B`.
fn signed(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", format::bytes(delta.unsigned_abs()))
}

/// Parses a threshold: `5%`, `5` (percent) or `0.5%`.
pub(crate) fn parse_percent(text: &str) -> std::result::Result<f64, String> {
    let t = text.trim();
    let number = t.strip_suffix('%').unwrap_or(t).trim();
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "'{text}' is not a percentage (e.g. 5% or 0.5%): a non-negative number, optionally followed by %"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(base: Option<u64>, new: Option<u64>) -> Change {
        Change {
            scope: "category",
            name: "x".into(),
            base,
            new,
        }
    }

    #[test]
    fn growth_is_judged_against_the_threshold() {
        assert!(
            !change(Some(1000), Some(1050)).grew_beyond(5.0),
            "exactly 5%"
        );
        assert!(change(Some(1000), Some(1051)).grew_beyond(5.0));
        assert!(!change(Some(1000), Some(900)).grew_beyond(0.0), "shrank");
        assert!(change(None, Some(1)).grew_beyond(1000.0), "appeared");
        assert!(change(Some(0), Some(1)).grew_beyond(1000.0), "from zero");
        assert!(!change(Some(10), None).grew_beyond(0.0), "went away");
        assert_eq!(change(Some(1000), Some(1100)).percent(), Some(10.0));
    }

    #[test]
    fn thresholds_parse_with_or_without_a_percent_sign() {
        assert_eq!(parse_percent("5%"), Ok(5.0));
        assert_eq!(parse_percent(" 0.5 % "), Ok(0.5));
        assert_eq!(parse_percent("12"), Ok(12.0));
        for bad in ["-1%", "five", "", "nan", "inf%"] {
            let e = parse_percent(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
    }
}
