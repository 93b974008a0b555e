//! The HTML report of one or several runs (`tch-memprof report`, and the profiler's
//! `.html(true)`): one self-contained file that works offline from `file://`. Its data is
//! JSON inline in the page and its script and style are inline too: no CDN, no network.
//!
//! Names come from the model and may come from anyone (a TorchScript file, a VarStore
//! path): the data is embedded as JSON with `<`, `>` and `&` escaped, and the script
//! only ever puts it in the page as text (`textContent`, SVG text nodes), never as
//! markup, so a parameter named `<img src=x onerror=alert(1)>` shows as those characters.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::runs::{EpochRow, IdleRow, LayerRow, LeakRow, Run, SummaryRow, TimelineRow};

/// Points of the memory-over-steps curve kept per run: longer runs are cut into buckets
/// of steps and each bucket keeps its lowest and highest point, so no peak is lost.
pub const MAX_POINTS: usize = 4000;

#[derive(Serialize)]
struct Param {
    name: String,
    kind: String,
    dtype: String,
    shape: String,
    bytes: u64,
    grad_bytes: Option<u64>,
}

#[derive(Serialize)]
struct RunData<'a> {
    /// Told apart from the other runs' (see [`crate::runs::names`]).
    name: String,
    /// Where its files are (`a/memory_csv_data/20261123-073855`).
    stem: String,
    /// `<run>_run.csv`: versions, device, report period, label.
    meta: &'a BTreeMap<String, String>,
    /// The largest value of each summary column (see [`Run::peaks`]).
    peaks: BTreeMap<&'static str, u64>,
    devices: Vec<&'a str>,
    steps: usize,
    points: Vec<&'a SummaryRow>,
    peak_allocated: u64,
    peak_allocated_step: u64,
    peak_reserved: u64,
    peak_reserved_step: u64,
    epochs: &'a [EpochRow],
    params: Vec<Param>,
    layers: &'a [LayerRow],
    /// The peak step's ops (empty when they are the examined step's).
    timeline: Vec<&'a TimelineRow>,
    examined_step: Option<u64>,
    examined: Vec<&'a TimelineRow>,
    /// The examined step's largest idle bytes after an op (over all its rows, before they
    /// are thinned).
    examined_idle_max: u64,
    /// The run's peak step has the same ops and live bytes as the examined step (its
    /// chart is left out).
    examined_is_peak: bool,
    leaks: &'a [LeakRow],
    idle: &'a [IdleRow],
    ooms: &'a [(String, String)],
    warnings: &'a [String],
}

/// At most `max` rows of `rows`, in order: each of `max / 2` buckets keeps its rows
/// with the lowest and the highest `key`.
fn downsample<T>(rows: &[T], max: usize, key: impl Fn(&T) -> u64) -> Vec<&T> {
    if rows.len() <= max || max < 2 {
        return rows.iter().collect();
    }
    let buckets = max / 2;
    let mut out = Vec::with_capacity(max);
    for b in 0..buckets {
        let (lo, hi) = (b * rows.len() / buckets, (b + 1) * rows.len() / buckets);
        let bucket = &rows[lo..hi];
        if bucket.is_empty() {
            continue;
        }
        let min = (0..bucket.len())
            .min_by_key(|&i| key(&bucket[i]))
            .unwrap_or(0);
        let max = (0..bucket.len())
            .max_by_key(|&i| key(&bucket[i]))
            .unwrap_or(0);
        out.push(&bucket[min.min(max)]);
        if min != max {
            out.push(&bucket[min.max(max)]);
        }
    }
    out
}

/// Whether the peak step's timeline is the examined step's: the same ops with the same
/// live bytes after each (the step asked for was the run's peak step, or its twin).
fn same_step(peak: &[TimelineRow], examined: &[TimelineRow]) -> bool {
    peak.len() == examined.len()
        && peak
            .iter()
            .zip(examined)
            .all(|(a, b)| (a.op_index, &a.op, a.total_bytes) == (b.op_index, &b.op, b.total_bytes))
}

fn run_data(run: &Run, name: String) -> RunData<'_> {
    let (pa, pa_step) = run
        .summary
        .iter()
        .map(|r| (r.peak_allocated_bytes, r.step))
        .max_by_key(|(b, s)| (*b, std::cmp::Reverse(*s)))
        .unwrap_or((0, 0));
    let (pr, pr_step) = run
        .summary
        .iter()
        .map(|r| (r.peak_reserved_bytes, r.step))
        .max_by_key(|(b, s)| (*b, std::cmp::Reverse(*s)))
        .unwrap_or((0, 0));
    let mut params: Vec<Param> = Vec::new();
    if let Some(last) = run.parameters.last() {
        let (e, i) = (last.epoch, last.iteration);
        for p in run
            .parameters
            .iter()
            .filter(|p| p.epoch == e && p.iteration == i)
        {
            if p.kind == "gradient" {
                if let Some(q) = params.iter_mut().find(|q| q.name == p.parameter) {
                    q.grad_bytes = Some(p.bytes);
                }
            } else {
                params.push(Param {
                    name: p.parameter.clone(),
                    kind: p.kind.clone(),
                    dtype: p.dtype.clone(),
                    shape: p.shape.clone(),
                    bytes: p.bytes,
                    grad_bytes: None,
                });
            }
        }
    }
    RunData {
        name,
        stem: run.stem.display().to_string(),
        meta: &run.meta,
        peaks: run.peaks(),
        devices: run.devices(),
        steps: run.summary.len(),
        points: downsample(&run.summary, MAX_POINTS, |r| r.peak_allocated_bytes),
        peak_allocated: pa,
        peak_allocated_step: pa_step,
        peak_reserved: pr,
        peak_reserved_step: pr_step,
        epochs: &run.epochs,
        params,
        layers: &run.layers,
        timeline: if same_step(&run.timeline, &run.examined) {
            Vec::new()
        } else {
            downsample(&run.timeline, 2 * MAX_POINTS, |r| r.total_bytes)
        },
        examined_step: run.examined_step,
        examined_idle_max: run.examined.iter().map(|r| r.idle_bytes).max().unwrap_or(0),
        examined_is_peak: !run.examined.is_empty() && same_step(&run.timeline, &run.examined),
        examined: downsample(&run.examined, 2 * MAX_POINTS, |r| r.total_bytes),
        leaks: &run.leaks,
        idle: &run.idle,
        ooms: &run.ooms,
        warnings: &run.warnings,
    }
}

/// JSON safe inside a `<script>` element: no `<`, `>` or `&` (so no `</script>`), and
/// no line separators that older parsers take for line ends.
fn script_safe_json<T: Serialize>(value: &T) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "[]".into());
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Text safe as HTML element content.
fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page for `runs` (one run, or several: ranks, experiments or a sweep side by
/// side), each called by its name from [`crate::runs::names`].
pub fn render(runs: &[Run]) -> String {
    let names = crate::runs::names(runs);
    let title = match &names[..] {
        [one] => format!("tch-memprof: {one}"),
        _ => format!("tch-memprof: {} runs", runs.len()),
    };
    let data: Vec<RunData<'_>> = runs
        .iter()
        .zip(names)
        .map(|(r, n)| run_data(r, n))
        .collect();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{title}</title><style>{STYLE}</style></head>\n<body>\
         <h1>{title}</h1><div id=\"errors\"></div><main id=\"app\"></main>\
         <script type=\"application/json\" id=\"data\">{data}</script>\
         <script>{SCRIPT}</script></body></html>\n",
        title = escape_html(&title),
        data = script_safe_json(&data),
    )
}

/// The page's style (`src/runs/page/report.css`).
const STYLE: &str = include_str!("page/report.css");

/// The page's script (`src/runs/page/report.js`): it reads the JSON data element and
/// only ever sets names as text.
const SCRIPT: &str = include_str!("page/report.js");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downsampling_keeps_every_bucket_extreme() {
        let rows: Vec<u64> = (0..10_000u64).map(|i| (i * 7919) % 1000).collect();
        let kept = downsample(&rows, 100, |v| *v);
        assert!(kept.len() <= 100);
        assert!(
            kept.iter().any(|v| **v == 999),
            "the global maximum survives"
        );
        assert!(kept.iter().any(|v| **v == 0), "the global minimum survives");
        let short = downsample(&rows[..50], 100, |v| *v);
        assert_eq!(short.len(), 50);
    }

    #[test]
    fn a_run_of_100k_iterations_makes_a_page_of_a_few_mb_that_keeps_its_peak() {
        let dir = tempfile::tempdir().unwrap();
        let mut csv = String::from(
            "timestamp,epoch,iteration,device,allocated_bytes,peak_allocated_bytes,reserved_bytes,\
             peak_reserved_bytes,weights_bytes,buffers_bytes,gradients_bytes,feature_maps_bytes,\
             intermediate_gradients_bytes,optimizer_state_bytes,other_bytes,step,backward_passes\n",
        );
        let spike_step = 61_803u64;
        for step in 1..=100_000u64 {
            let peak = if step == spike_step {
                987_654_321
            } else {
                500_000 + step % 977
            };
            csv.push_str(&format!(
                "2026-11-22T00:00:00,1,{step},cuda:0,400000,{peak},600000,700000,100000,0,100000,\
                 50000,30000,200000,0,{step},1\n"
            ));
        }
        std::fs::write(dir.path().join("big_summary.csv"), csv).unwrap();
        let run = Run::open(dir.path()).unwrap();
        assert_eq!(run.summary.len(), 100_000);
        let page = render(&[run]);
        assert!(page.len() < 3 << 20, "{} bytes", page.len());
        assert!(page.contains("987654321"), "the spike was lost");
        assert!(page.contains(&format!("\"peak_allocated_step\":{spike_step}")));
    }

    #[test]
    fn embedded_data_cannot_close_the_script_element() {
        let json = script_safe_json(&vec!["</script><img src=x onerror=alert(1)>&"]);
        assert!(
            !json.contains('<') && !json.contains('>') && !json.contains('&'),
            "{json}"
        );
        let back: Vec<String> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ["</script><img src=x onerror=alert(1)>&"]);
        assert_eq!(escape_html("<b>&\""), "&lt;b&gt;&amp;&quot;");
    }
}
