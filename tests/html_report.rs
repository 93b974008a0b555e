//! The HTML report of a real run, checked in a real browser: a small CNN trained with the
//! step timeline and `.html(true)`, one of its parameters named like an attack. Headless
//! Chromium renders the page from `file://`; the test fails on any script error, checks
//! the rendered DOM for the run's own figures (its peak bytes, exact, as the profiler
//! measured them in-process) and that the name shows as text and runs nothing, and keeps
//! a screenshot (target/report-check/report.png).
//!
//! Chromium is found on PATH (`chromium`) or at $TCH_MEMPROF_CHROMIUM; without it the
//! browser part prints `NOT RUN: ...` (and fails when `CI` is set) (scripts/check-report.sh installs it and runs
//! this test; CI runs that script).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use tch::{nn, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::MemoryProfiler;

const EVIL: &str = "<img src=x onerror=alert(1)>";

fn chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TCH_MEMPROF_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    })
}

/// Runs headless Chromium on `page`; fails the test if it has not exited within a minute
/// (a page that opens a dialog, `alert` say, never finishes loading).
fn headless(chrome: &Path, profile: &Path, args: &[&str], page: &Path) -> std::process::Output {
    headless_url(chrome, profile, args, &format!("file://{}", page.display()))
}

/// [`headless`] on an address (a page with a `#fragment`).
fn headless_url(chrome: &Path, profile: &Path, args: &[&str], url: &str) -> std::process::Output {
    let mut child = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run chromium");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).ok();
        v
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("chromium did not finish rendering {url} within 60 s (a script dialog?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut out = child.wait_with_output().unwrap();
    out.stdout = reader.join().unwrap();
    out
}

#[test]
fn the_report_of_a_real_run_renders_its_figures_and_escapes_names() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let conv = |p: nn::Path, i, o| {
        nn::conv2d(
            p,
            i,
            o,
            3,
            nn::ConvConfig {
                padding: 1,
                ..Default::default()
            },
        )
    };
    let net = nn::seq_t()
        .add(conv(&p / "conv1", 3, 16))
        .add(nn::batch_norm2d(&p / "bn1", 16, Default::default()))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(conv(&p / "conv2", 16, 32))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(&p / "fc", 32 * 4 * 4, 10, Default::default()));
    // A name from someone else's model file.
    let evil = p.var(EVIL, &[3], nn::Init::Const(0.0));
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut profiler = MemoryProfiler::builder(&vs)
        .print(false)
        .csv_dir(dir.path())
        .html(true)
        .timeline(true)
        .timeline_step(8)
        .idle_at_peak(true)
        .build()
        .unwrap();
    let mut peak = 0;
    for _ in 0..2 {
        for _ in 0..6 {
            let x = Tensor::randn([8, 3, 16, 16], (Kind::Float, Device::Cpu));
            let y = Tensor::randint(10, [8], (Kind::Int64, Device::Cpu));
            let loss = net.forward_t(&x, true).cross_entropy_for_logits(&y) + evil.sum(Kind::Float);
            opt.zero_grad();
            loss.backward();
            opt.step();
            profiler.record_stats();
            peak = peak.max(profiler.last_stats().unwrap().peak_allocated_bytes);
        }
        profiler.epoch_end();
    }
    assert_eq!(profiler.failures(), 0);
    // The examined step's idle blocks: the loop holds its batch and loss to its end.
    let examined = profiler.step_profile().unwrap().clone();
    let idle = examined.idle.clone().unwrap();
    let first_idle = idle.blocks.first().expect("an idle block").clone();
    // The band of the examined step's chart: its largest idle bytes after an op.
    let most_idle = examined.rows.iter().map(|r| r.idle_bytes).max().unwrap();
    assert!(most_idle > 0 && most_idle <= idle.bytes);
    let page = profiler.html_path().unwrap().to_path_buf();
    drop(profiler);
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: no network, and the name never appears as markup in the file.
    // (The one address in it is SVG's namespace name, which nothing fetches.)
    let svg_ns = "http://www.w3.org/2000/svg";
    assert_eq!(
        html.matches("http").count(),
        html.matches(svg_ns).count(),
        "an address in the page"
    );
    for banned in ["<link", "<script src", "<img", "@import"] {
        assert!(!html.contains(banned), "the page contains {banned}");
    }
    assert!(html.len() < 2 << 20, "{} bytes", html.len());

    let Some(chrome) = chromium() else {
        cannot_run(
            "the browser check of the HTML report: chromium not found on PATH or at \
             $TCH_MEMPROF_CHROMIUM (scripts/check-report.sh installs it)",
        );
        return;
    };
    let dom = rendered(&chrome, &format!("file://{}", page.display()));
    // The run's own peak, exact, as the profiler measured it in-process.
    let exact = peak
        .to_string()
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(",");
    assert!(
        dom.contains(&format!("{exact} B")),
        "peak {exact} B not in the rendered page"
    );
    // The attack is text: escaped in the serialised DOM, and no image element exists.
    assert!(
        dom.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "the name is not shown as text"
    );
    assert!(!dom.contains("<img"), "an element was injected");
    // The profiled step and its layers are there.
    let band = format!(
        "idle at the peak, read by no op again (up to {})",
        page_bytes(most_idle)
    );
    for text in [
        "The profiled step: step 8, asked for with timeline_step",
        &band,
        "Layers of the run's peak step",
        "conv1",
        "backward",
        "Idle at the peak of the examined step",
        &first_idle.site,
        &first_idle.last_read_op,
    ] {
        assert!(dom.contains(text), "{text} not rendered");
    }

    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../report-check");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("report.png");
    let profile = tempfile::tempdir().unwrap();
    let out = headless(
        &chrome,
        profile.path(),
        &[
            "--window-size=1200,2200",
            &format!("--screenshot={}", shot.display()),
        ],
        &page,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "empty screenshot"
    );
    std::fs::copy(&page, shots.join("report.html")).unwrap();
}

/// The DOM of `url` once its script ran; fails on a script error or a script that did not
/// finish.
fn rendered(chrome: &Path, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = headless_url(
        chrome,
        profile.path(),
        &["--dump-dom", "--virtual-time-budget=5000"],
        url,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the script did not finish on {url}: {}",
        &dom[..dom.len().min(3000)]
    );
    assert!(
        dom.contains("<div id=\"errors\"></div>"),
        "script errors shown on {url}: {}",
        dom.split("<div id=\"errors\">")
            .nth(1)
            .unwrap_or("")
            .chars()
            .take(500)
            .collect::<String>()
    );
    // The break opportunities report.js puts after "::" and "/" in text cells are not
    // text: the page read as a person reads it.
    dom.replace("<wbr>", "")
}

/// A screenshot of `page` in target/report-check/`name`, its path printed.
fn screenshot(chrome: &Path, page: &Path, name: &str, height: u32) -> PathBuf {
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../report-check");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join(name);
    let profile = tempfile::tempdir().unwrap();
    let out = headless(
        chrome,
        profile.path(),
        &[
            &format!("--window-size=1200,{height}"),
            &format!("--screenshot={}", shot.display()),
        ],
        page,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "empty screenshot"
    );
    std::fs::copy(page, shot.with_extension("html")).unwrap();
    let shot = shot.canonicalize().unwrap();
    eprintln!("screenshot: {}", shot.display());
    shot
}

/// `tch-memprof ARGS` in `dir`.
fn cli(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tch-memprof"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// Bytes as the page writes them (`1.23 MiB`).
fn page_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (n as f64, 0);
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", units[i])
    }
}

/// The quickstart's situation: a small CNN trained 2 epochs x 5 iterations at `batch`,
/// reported every 10th iteration (so once, at step 10), CSV into `root/memory_csv_data`.
/// Returns the run's stem and its peak allocated at step 10, as measured in-process.
fn few_reports_run(root: &Path, batch: i64, label: Option<&str>) -> (PathBuf, u64) {
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let net = nn::seq_t()
        .add(nn::conv2d(&p / "conv1", 3, 8, 3, Default::default()))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(&p / "fc", 8 * 7 * 7, 10, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let mut builder = MemoryProfiler::builder(&vs)
        .print(false)
        .print_period(10)
        .csv_dir(root.join("memory_csv_data"))
        .csv(true);
    if let Some(l) = label {
        builder = builder.label(l);
    }
    let mut profiler = builder.build().unwrap();
    let mut at_10 = 0;
    for _ in 0..2 {
        for _ in 0..5 {
            let x = Tensor::randn([batch, 3, 16, 16], (Kind::Float, Device::Cpu));
            let y = Tensor::randint(10, [batch], (Kind::Int64, Device::Cpu));
            let loss = net.forward_t(&x, true).cross_entropy_for_logits(&y);
            opt.zero_grad();
            loss.backward();
            opt.step();
            profiler.record_stats();
            at_10 = profiler.last_stats().unwrap().peak_allocated_bytes;
        }
        profiler.epoch_end();
    }
    assert_eq!(profiler.failures(), 0);
    let summary = profiler.csv_paths()[0].to_string_lossy().into_owned();
    drop(profiler);
    (
        PathBuf::from(summary.strip_suffix("_summary.csv").unwrap()),
        at_10,
    )
}

/// Renames a run's files to `stem` (two runs started in the same second).
fn rename_stem(old: &Path, stem: &str) {
    let dir = old.parent().unwrap();
    let prefix = format!("{}_", old.file_name().unwrap().to_string_lossy());
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(&prefix) {
            std::fs::rename(dir.join(&name), dir.join(format!("{stem}_{rest}"))).unwrap();
        }
    }
}

/// The first cell of each row of the table `id`, in the order shown.
fn first_cells(dom: &str, id: &str) -> Vec<String> {
    let start = dom
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id}"));
    let table = &dom[start..start + dom[start..].find("</table>").unwrap()];
    table
        .split("<tr>")
        .skip(2) // before the table, the header
        .map(|row| {
            let cell = row.split_once('>').unwrap().1; // <td class="l">
            cell[..cell.find("</td>").unwrap()].to_string()
        })
        .collect()
}

#[test]
fn two_runs_of_one_second_are_told_apart_and_a_single_report_shows_its_values() {
    let _guard = serial();
    let root = tempfile::tempdir().unwrap();
    let (a, peak_a) = few_reports_run(&root.path().join("a"), 16, None);
    let (b, peak_b) = few_reports_run(&root.path().join("b"), 48, Some("batch 48"));
    const STEM: &str = "20261123-073855";
    rename_stem(&a, STEM);
    rename_stem(&b, STEM);
    for dir in ["a", "b"] {
        let summary = root
            .path()
            .join(dir)
            .join(format!("memory_csv_data/{STEM}_summary.csv"));
        let rows = std::fs::read_to_string(&summary).unwrap().lines().count() - 1;
        assert_eq!(rows, 1, "10 iterations reported every 10th: one row");
    }
    let run_b = tch_memprof::runs::Run::open(root.path().join("b/memory_csv_data")).unwrap();
    assert_eq!(
        run_b.label.as_deref(),
        Some("batch 48"),
        "from <run>_run.csv"
    );

    // diff's header: the folder of the one, the label of the other.
    let out = cli(
        root.path(),
        &["diff", "a/memory_csv_data", "b/memory_csv_data"],
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("tch-memprof diff: a -> batch 48\n"),
        "{said}"
    );

    let out = cli(
        root.path(),
        &[
            "report",
            "a/memory_csv_data",
            "b/memory_csv_data",
            "-o",
            "two.html",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        root.path(),
        &[
            "report",
            "a/memory_csv_data",
            "b/memory_csv_data",
            "--label",
            "batch 16",
            "--label",
            "batch 48 <b>",
            "-o",
            "labelled.html",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        root.path(),
        &["report", "a/memory_csv_data", "-o", "one.html"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A path that is not a file (standard output) gets the page as it is, whole, and
    // the page written to a file leaves nothing beside it.
    let out = cli(
        root.path(),
        &["report", "a/memory_csv_data", "-o", "/dev/stdout"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page_there = std::fs::read(root.path().join("one.html")).unwrap();
    assert!(
        out.stdout.starts_with(&page_there),
        "standard output is not the page one.html holds"
    );
    let tmp: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "left beside the pages: {tmp:?}");
    // One label for two runs: refused, saying why.
    let out = cli(
        root.path(),
        &[
            "report",
            "a/memory_csv_data",
            "b/memory_csv_data",
            "--label",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 label(s) for 2 run(s)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let Some(chrome) = chromium() else {
        cannot_run("the browser check of reports of several runs: chromium not found");
        return;
    };
    let page = |name: &str| root.path().join(name);
    let dom = rendered(&chrome, &format!("file://{}", page("two.html").display()));
    assert_eq!(first_cells(&dom, "runs"), ["a", "batch 48"]);
    for text in ["Run a<", "Run batch 48<"] {
        assert!(dom.contains(text), "{text} not rendered");
    }
    assert!(!dom.contains(&format!("Run {STEM}")), "named by the stem");
    // Each run's single reported iteration: a bar with its values written out.
    for peak in [peak_a, peak_b] {
        let text = format!("peak allocated {}", page_bytes(peak));
        assert!(dom.contains(&text), "{text} not rendered");
    }
    assert!(dom.contains("class=\"bars\""), "no bars");
    let dom = rendered(
        &chrome,
        &format!("file://{}", page("labelled.html").display()),
    );
    assert_eq!(
        first_cells(&dom, "runs"),
        ["batch 16", "batch 48 &lt;b&gt;"]
    );
    let shot_two = screenshot(&chrome, &page("labelled.html"), "two-runs.png", 2400);

    let dom = rendered(&chrome, &format!("file://{}", page("one.html").display()));
    assert!(
        dom.contains("<title>tch-memprof: a</title>"),
        "the run is a"
    );
    let text = format!("peak allocated {}", page_bytes(peak_a));
    assert!(dom.contains(&text), "{text} not rendered");
    assert!(
        dom.contains(">step 10<"),
        "the reported step is not labelled"
    );
    // More epochs (2) than reported iterations (1): the epochs are drawn, with values.
    for text in [">epoch 1<", ">epoch 2<", "allocated at end"] {
        assert!(dom.contains(text), "{text} not rendered");
    }
    let shot_one = screenshot(&chrome, &page("one.html"), "single-iteration.png", 1400);
    assert!(shot_two.exists() && shot_one.exists());
}

const SUMMARY_HEADER: &str = "timestamp,epoch,iteration,device,allocated_bytes,peak_allocated_bytes,\
    reserved_bytes,peak_reserved_bytes,weights_bytes,buffers_bytes,gradients_bytes,feature_maps_bytes,\
    intermediate_gradients_bytes,optimizer_state_bytes,other_bytes,step,backward_passes\n";

#[test]
fn fifty_runs_render_in_time_sortable_by_their_peaks() {
    let root = tempfile::tempdir().unwrap();
    const N: u64 = 50;
    const STEPS: u64 = 30;
    // Run i: batch 8(i+1); its peaks rank it (7i mod 50): not in the order given.
    let rank = |i: u64| (7 * i) % N;
    let mut args: Vec<String> = vec!["report".into()];
    for i in 0..N {
        let dir = root
            .path()
            .join(format!("sweep/bs{}/memory_csv_data", 8 * (i + 1)));
        std::fs::create_dir_all(&dir).unwrap();
        let mut csv = SUMMARY_HEADER.to_string();
        for step in 1..=STEPS {
            let peak = (rank(i) + 1) * 1_000_000 - (STEPS - step) * 1000;
            csv.push_str(&format!(
                "t,1,{step},cpu,{a},{peak},{r},{r},1000,0,1000,{f},{g},2000,{o},{step},1\n",
                a = peak / 2,
                r = 50_000_000 + i,
                f = peak / 4,
                g = peak / 8,
                o = peak / 2 - 4000,
            ));
        }
        std::fs::write(dir.join("20261123-073855_summary.csv"), csv).unwrap();
        let libtorch = if i < 25 { "2.11.0" } else { "2.10.0" };
        std::fs::write(
            dir.join("20261123-073855_run.csv"),
            format!(
                "key,value\ntch_memprof,0.1.0\nlibtorch,{libtorch}\ndevice,cpu\nlabel,batch {}\n",
                8 * (i + 1)
            ),
        )
        .unwrap();
        args.push(format!("sweep/bs{}/memory_csv_data", 8 * (i + 1)));
    }
    args.extend(["-o".into(), "sweep.html".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = cli(root.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = root.path().join("sweep.html");

    let Some(chrome) = chromium() else {
        cannot_run("the browser check of a sweep's report: chromium not found");
        return;
    };
    let started = std::time::Instant::now();
    let dom = rendered(
        &chrome,
        &format!("file://{}#sort=peak_allocated", page.display()),
    );
    let took = started.elapsed();
    assert!(took.as_secs() < 30, "50 runs took {took:?} to render");
    // Sorted by peak allocated, largest first: the ranks given above.
    let mut expected: Vec<u64> = (0..N).collect();
    expected.sort_by_key(|&i| std::cmp::Reverse(rank(i)));
    let expected: Vec<String> = expected
        .iter()
        .map(|i| format!("batch {}", 8 * (i + 1)))
        .collect();
    assert_eq!(first_cells(&dom, "runs"), expected);
    // The setting that differs is a column; the ones all share are said once.
    assert!(
        dom.contains("data-col=\"libtorch\""),
        "libtorch is not a column"
    );
    assert!(
        !dom.contains("data-col=\"tch_memprof\""),
        "a shared setting as a column"
    );
    assert!(
        dom.contains("Every run: tch-memprof 0.1.0, device cpu."),
        "shared settings not said"
    );
    assert!(dom.contains("Curves shown: the 6 largest peaks; choose among all 50 runs"));
    assert_eq!(dom.matches("<details class=\"run\">").count(), 50);
    let shot = screenshot(&chrome, &page, "fifty-runs.png", 3000);
    assert!(shot.exists());
}
