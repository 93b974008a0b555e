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
        .arg(format!("file://{}", page.display()))
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
            panic!(
                "chromium did not finish rendering {} within 60 s (a script dialog?)",
                page.display()
            );
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
    let profile = tempfile::tempdir().unwrap();
    let out = headless(
        &chrome,
        profile.path(),
        &["--dump-dom", "--virtual-time-budget=5000"],
        &page,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the script did not finish: {}",
        &dom[..dom.len().min(2000)]
    );
    assert!(
        dom.contains("<div id=\"errors\"></div>"),
        "script errors shown in the page"
    );
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
    for text in [
        "The profiled step",
        "Layers of the profiled step",
        "conv1",
        "backward",
    ] {
        assert!(dom.contains(text), "{text} not rendered");
    }

    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../report-check");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("report.png");
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
