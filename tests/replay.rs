//! `tch-memprof replay` and `estimate::recorded`: a recorded CUDA run replayed through
//! the model of the caching allocator, by the replay every estimate goes through.
//!
//! The truth is what an NVIDIA H200 recorded (`tests/data/gpu-truth/h200-2026-11-26/`,
//! its README says how): the allocator's own event histories of 42 real-world runs, and
//! a memory snapshot as PyTorch users have them. What-ifs are held to the allocator's
//! rules computed by hand.

mod common;

use std::io::Read;
use std::path::Path;

use common::{cli, text};
use tch_memprof::estimate::recorded::Recording;
use tch_memprof::estimate::AllocatorConfig;

const DATA: &str = "tests/data/gpu-truth/h200-2026-11-26";
const MIB: u64 = 1 << 20;
/// The replayed peak allocated against the allocator's own (`measured_allocated`): within
/// 0.2% in every case (the measurement: -0.05% to +0.15%).
const WORST_ALLOCATED: f64 = 0.002;

/// `measured_allocated` of a case (`tv_vgg16.infer`): the caching allocator's own peak.
fn measured_allocated(case: &str) -> u64 {
    let (model, mode) = case.split_once('.').unwrap();
    let mut reader = csv::Reader::from_path(Path::new(DATA).join("measured.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
    let (m, md, a) = (col("model"), col("mode"), col("measured_allocated"));
    reader
        .records()
        .map(|r| r.unwrap())
        .find(|r| &r[m] == model && &r[md] == mode)
        .map(|r| r[a].parse().unwrap())
        .unwrap_or_else(|| panic!("{case}: not measured"))
}

/// Every history replays under the default settings (which the runs used): the recorded
/// peak reserved to the byte in 40 of the 42, within 0.70% in the other two (ConvNeXt-T
/// training -0.45%, ResNet-50 bf16 training +0.70%); the peak allocated within 0.2% of
/// the allocator's own peak (`measured.csv`; the history holds the sizes asked for, the
/// allocator counts whole blocks).
#[test]
fn an_h200s_histories_replay_to_the_recorded_reserved_peak() {
    let dir = Path::new(DATA).join("traces");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 42);
    let mut exact = 0;
    let mut worst_allocated: f64 = 0.0;
    for f in &files {
        let mut csv = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(f).unwrap())
            .read_to_string(&mut csv)
            .unwrap();
        let run = Recording::from_csv(&csv)
            .unwrap()
            .replay(&AllocatorConfig::default());
        let name = f.file_name().unwrap().to_string_lossy();
        assert!(run.complete, "{name}: {} unknown frees", run.unknown_frees);
        let (rec, rep) = (run.recorded, run.replayed);
        let off = rep.reserved as f64 / rec.reserved as f64 - 1.0;
        println!(
            "{name:<44} reserved {:>12} {:>12} {:+.3}%",
            rec.reserved,
            rep.reserved,
            100.0 * off
        );
        exact += (rec.reserved == rep.reserved) as usize;
        // To the byte, or within the 0.70% the docs claim (ResNet-50 bf16's +0.695%).
        assert!(off.abs() <= 0.0070, "{name}: reserved {off:+.4}");
        let case = name.trim_end_matches(".csv.gz");
        let measured = measured_allocated(case);
        let over = rep.allocated as f64 / measured as f64 - 1.0;
        println!("{name:<44} allocated {over:+.5}");
        worst_allocated = worst_allocated.max(over.abs());
    }
    assert_eq!(exact, 40, "histories replayed to the byte");
    assert!(worst_allocated < WORST_ALLOCATED, "{worst_allocated}");
}

/// Snapshots of 89 runs the replay was not built on, recorded on an NVIDIA H200 with
/// `torch.cuda.memory._record_memory_history` (`tests/data/gpu-truth/h200-2026-11-27/`,
/// its README says how): eleven held-out models eagerly, the same from their traced
/// files, and the 42 GPU truth cases from their traced files (45 runs: 21 traced on the
/// CPU, 24 on the GPU). Each replayed under the default settings the runs used, beside
/// the peaks the allocator itself reported in the same run (`max_memory_reserved`,
/// `max_memory_allocated`: not from the snapshot). Measured: the held-out models' peak
/// reserved to the byte in 22 of 22 eager runs and 20 of 22 traced ones, the traced
/// truth cases' in 32 of 45; every one within 1.1%, and allocated within 0.6%.
#[test]
fn snapshots_of_runs_the_replay_was_not_built_on_replay_to_the_allocators_peaks() {
    const NEW: &str = "tests/data/gpu-truth/h200-2026-11-27";
    // (snapshot folder, the CSV of the same runs, runs replayed to the byte: the docs'
    // counts, held exactly)
    let sets = [
        ("held-out", "held-out.csv", 22),
        ("held-out-traced", "held-out-traced.csv", 20),
        ("traced", "traced.csv", 32),
    ];
    let mut worst: (f64, f64) = (0.0, 0.0);
    for (folder, measured, at_least) in sets {
        let mut reader = csv::Reader::from_path(Path::new(NEW).join(measured)).unwrap();
        let headers = reader.headers().unwrap().clone();
        let col = |n: &str| headers.iter().position(|h| h == n);
        let (m, md, a, r) = (
            col("model").unwrap(),
            col("mode").unwrap(),
            col("measured_allocated").unwrap(),
            col("measured_reserved").unwrap(),
        );
        let on = col("traced_on");
        let (mut runs, mut exact) = (0, 0);
        for row in reader.records().map(|r| r.unwrap()) {
            let name = match on {
                Some(i) => format!("{}.{}.{}.pickle.gz", &row[m], &row[md], &row[i]),
                None => format!("{}.{}.pickle.gz", &row[m], &row[md]),
            };
            let mut bytes = Vec::new();
            let path = Path::new(NEW).join("snapshots").join(folder).join(&name);
            flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
                .read_to_end(&mut bytes)
                .unwrap();
            let run = Recording::from_snapshot(&bytes, 0)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .replay(&AllocatorConfig::default());
            let allocated: u64 = row[a].parse().unwrap();
            let reserved: u64 = row[r].parse().unwrap();
            let off_r = run.replayed.reserved as f64 / reserved as f64 - 1.0;
            let off_a = run.replayed.allocated as f64 / allocated as f64 - 1.0;
            println!(
                "{folder:<16} {name:<48} reserved {:+.3}% allocated {:+.3}%",
                100.0 * off_r,
                100.0 * off_a
            );
            runs += 1;
            exact += (run.replayed.reserved == reserved) as usize;
            worst = (worst.0.max(off_r.abs()), worst.1.max(off_a.abs()));
        }
        println!("{folder}: {exact} of {runs} to the byte");
        assert_eq!(exact, at_least, "{folder}: runs of {runs} to the byte");
    }
    assert!(worst.0 < 0.011, "reserved off by {:.4}", worst.0);
    assert!(worst.1 < 0.006, "allocated off by {:.4}", worst.1);
}

/// The H200's snapshot, whose history began after two of its nine segments were made:
/// seeded from the snapshot's end state, it replays to the recorded peak reserved (the
/// nine segments, 96 MiB), and the command says what it seeded.
#[test]
fn a_real_snapshot_replays_with_the_segments_made_before_its_history() {
    let file = Path::new(DATA).join("leak-graph.allocator-snapshot.pickle");
    let out = cli(&["replay", file.to_str().unwrap(), "--csv"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let csv = text(&out.stdout);
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(
        rows[0],
        ["alloc_conf", "peak_allocated_bytes", "peak_reserved_bytes"]
    );
    assert_eq!((rows[1][0], rows[1][2]), ("recorded", "100663296"));
    // The run had no PYTORCH_CUDA_ALLOC_CONF: its own settings are PyTorch's defaults.
    assert_eq!((rows[2][0], rows[2][2]), ("default", "100663296"), "{csv}");
    // With --memory, no setting that fits is exit status 1 (as plan's), the reason one
    // line on standard error beside the CSV; one that fits is 0. The smallest peak
    // reserved of a setting is expandable segments' 92 MiB (96468992 B, the golden
    // test's replay of this file).
    for (memory, code) in [("90MiB", 1), ("100MiB", 0)] {
        for csv in [true, false] {
            let mut args = vec!["replay", file.to_str().unwrap(), "--memory", memory];
            if csv {
                args.push("--csv");
            }
            let out = cli(&args);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{memory}: {stderr}");
            if csv && code == 1 {
                assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
                assert!(
                    stderr.contains("no allocator setting tried makes it fit"),
                    "{stderr}"
                );
            }
        }
    }
    let out = cli(&["replay", file.to_str().unwrap()]);
    let says = text(&out.stdout);
    assert!(
        says.contains("began after 2 segment(s) were made"),
        "{says}"
    );
    assert!(says.contains("to the byte"), "{says}");
}

/// A history by hand: a 40 MiB block freed, then a 12 MiB one. By default the 12 MiB
/// block is split from the free 40 MiB segment (the rest, 28 MiB, is more than 1 MiB):
/// reserved 40 MiB. With `max_split_size_mb:20` a block of 20 MiB or more serves no
/// smaller request: a new 12 MiB segment, reserved 52 MiB, 40 MiB of it free. `--memory
/// 48MiB` then fits the first and not the second.
#[test]
fn what_ifs_move_reserved_as_the_allocator_rules_say() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.csv");
    let (a, b): (u64, u64) = (1 << 30, 3 << 30);
    std::fs::write(
        &history,
        format!(
            "seq,action,addr,size\n0,segment_alloc,{a},{}\n1,alloc,{a},{}\n\
             2,free_requested,{a},{}\n3,free_completed,{a},{}\n4,alloc,{b},{}\n",
            40 * MIB,
            40 * MIB,
            40 * MIB,
            40 * MIB,
            12 * MIB
        ),
    )
    .unwrap();
    let out = cli(&[
        "replay",
        history.to_str().unwrap(),
        "--alloc-conf",
        "max_split_size_mb:20",
        "--memory",
        "48MiB",
        "--csv",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let csv = text(&out.stdout);
    // The pools at the reserved peak, by hand: with max_split_size_mb:20 the 12 MiB
    // block's new segment makes it, the freed 40 MiB segment beside it.
    let recording = Recording::from_csv(&std::fs::read_to_string(&history).unwrap()).unwrap();
    let split = recording.replay(&AllocatorConfig::parse("max_split_size_mb:20").unwrap());
    let (pools, request) = split.at_reserved_peak.unwrap();
    assert_eq!(
        (
            pools.reserved,
            pools.allocated,
            pools.free_small,
            pools.free_large,
            pools.largest_free
        ),
        (52 * MIB, 12 * MIB, 0, 40 * MIB, 40 * MIB)
    );
    assert_eq!(request, 12 * MIB);
    let plain = recording.replay(&AllocatorConfig::default());
    let (pools, request) = plain.at_reserved_peak.unwrap();
    assert_eq!(
        (pools.reserved, pools.allocated, request),
        (40 * MIB, 40 * MIB, 40 * MIB)
    );
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows,
        [
            "alloc_conf,peak_allocated_bytes,peak_reserved_bytes,fits",
            &format!("recorded,{},{},true", 40 * MIB, 40 * MIB),
            &format!("default,{},{},true", 40 * MIB, 40 * MIB),
            &format!("max_split_size_mb:20,{},{},false", 40 * MIB, 52 * MIB),
        ]
    );
}

/// Bad input is one line and exit status 2: a file that is not a snapshot, a pickle
/// without a history, a truncated one, a missing file, a file of several GB (refused before it is read),
/// an unknown allocator setting; and a pickle that would call a function is refused
/// without calling it.
#[test]
fn bad_input_is_one_line_and_no_pickle_runs_code() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let evil = dir.path().join("evil.pickle");
    // Protocol 0: os.system("touch MARKER") when unpickled by Python.
    std::fs::write(
        &evil,
        format!("cos\nsystem\n(S'touch {}'\ntR.", marker.display()),
    )
    .unwrap();
    let text_file = dir.path().join("notes.pickle");
    std::fs::write(&text_file, "hello").unwrap();
    let no_history = dir.path().join("empty.pickle");
    // Protocol 2: an empty dict.
    std::fs::write(&no_history, b"\x80\x02}q\x00.").unwrap();
    let missing = dir.path().join("missing.pickle");
    // The real snapshot cut in half.
    let truncated = dir.path().join("truncated.pickle");
    let whole =
        std::fs::read(Path::new(DATA).join("leak-graph.allocator-snapshot.pickle")).unwrap();
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    // The snapshot gzipped, as this repository keeps its own, then cut.
    let gz = dir.path().join("whole.pickle.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &whole).unwrap();
    let zipped = enc.finish().unwrap();
    std::fs::write(&gz, &zipped).unwrap();
    let cut_gz = dir.path().join("cut.pickle.gz");
    std::fs::write(&cut_gz, &zipped[..zipped.len() / 2]).unwrap();
    // A file of several GB (sparse: nothing written), refused before it is read.
    let huge = dir.path().join("huge.pickle");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(5 << 30)
        .unwrap();
    let good = Path::new(DATA).join("leak-graph.allocator-snapshot.pickle");
    for (args, says) in [
        (
            vec!["replay", evil.to_str().unwrap()],
            "not a pickle PyTorch wrote",
        ),
        (
            vec!["replay", text_file.to_str().unwrap()],
            "not a pickle PyTorch wrote",
        ),
        (
            vec!["replay", no_history.to_str().unwrap()],
            "no `device_traces`",
        ),
        (
            vec!["replay", missing.to_str().unwrap()],
            "missing.pickle: no such file",
        ),
        (
            vec!["replay", truncated.to_str().unwrap()],
            "not a pickle PyTorch wrote: the file ends inside an opcode",
        ),
        (
            vec!["replay", cut_gz.to_str().unwrap()],
            "gzipped, but not read whole",
        ),
        (
            vec!["replay", huge.to_str().unwrap()],
            "5.00 GiB is more than the 2.00 GiB this reader takes",
        ),
        (
            vec![
                "replay",
                good.to_str().unwrap(),
                "--alloc-conf",
                "nonsense:1",
            ],
            "unrecognized key",
        ),
        (
            vec!["replay", good.to_str().unwrap(), "--device", "3"],
            "no history for device 3",
        ),
    ] {
        let out = cli(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(!marker.exists(), "the pickle ran code");
    // Gzipped, the snapshot replays as it does plain.
    let plain = cli(&["replay", good.to_str().unwrap()]);
    let zipped = cli(&["replay", gz.to_str().unwrap()]);
    assert!(zipped.status.success(), "{}", text(&zipped.stderr));
    assert_eq!(
        text(&plain.stdout).replace(good.to_str().unwrap(), "FILE"),
        text(&zipped.stdout).replace(gz.to_str().unwrap(), "FILE")
    );
}

/// A snapshot as PyTorch writes it with Python frames
/// (`_record_memory_history(stacks="python")`), made here: a 20 MiB segment holding a
/// 4 MiB block asked for at `train.py:12` (under `torch/nn/modules/linear.py`, PyTorch's
/// own frame, which is skipped) and a 16 MiB one at `train.py:13`; the 16 MiB block is
/// freed, then 24 MiB are asked for at `train.py:14`. By the allocator's rules: the 4 MiB
/// request splits the segment (16 MiB left, more than 1 MiB), the 16 MiB one takes the
/// rest, and after its free no free block holds 24 MiB: a new 24 MiB segment, reserved
/// 44 MiB, the first segment's 16 MiB free, split by the 4 MiB block of `train.py:12`.
#[test]
fn the_reserved_peak_is_explained_by_segment_and_the_frames_that_split_them() {
    let (a, b) = (1u64 << 32, 2u64 << 32);
    let torch = frame(
        "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
        125,
        "forward",
    );
    let trace = vec![
        event("segment_alloc", a, 20 * MIB, vec![]),
        event(
            "alloc",
            a,
            4 * MIB,
            vec![torch.clone(), frame("train.py", 12, "step")],
        ),
        event(
            "alloc",
            a + 4 * MIB,
            16 * MIB,
            vec![frame("train.py", 13, "step")],
        ),
        event("free_requested", a + 4 * MIB, 16 * MIB, vec![]),
        event("free_completed", a + 4 * MIB, 16 * MIB, vec![]),
        event("segment_alloc", b, 24 * MIB, vec![]),
        event("alloc", b, 24 * MIB, vec![frame("train.py", 14, "step")]),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.pickle");
    write_snapshot(&file, trace, None);
    let recording = Recording::read(&file, 0).unwrap();
    let view = recording
        .at_reserved_peak(&AllocatorConfig::default())
        .unwrap();
    assert_eq!(view.pools.reserved, 44 * MIB);
    assert_eq!(view.event, 6, "the last alloc makes the peak");
    let cut: Vec<(u64, u64, u64, u64)> = view
        .segments
        .iter()
        .map(|s| (s.size, s.allocated, s.free, s.largest_free))
        .collect();
    assert_eq!(
        cut,
        [
            (20 * MIB, 4 * MIB, 16 * MIB, 16 * MIB),
            (24 * MIB, 24 * MIB, 0, 0)
        ]
    );
    let out = cli(&["replay", file.to_str().unwrap()]);
    let printed = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        printed.contains(
            "a request over 16.00 MiB (the largest free block) needed a new segment then"
        ),
        "{printed}"
    );
    assert!(
        printed.contains(
            "a 20.00 MiB segment: 16.00 MiB free (the largest block 16.00 MiB), split by \
             4.00 MiB in 1 block(s) from step (train.py:12)"
        ),
        "{printed}"
    );
    // The run as a step's files: an op per allocation, named and laid out by its site;
    // live bytes after each: 4 MiB, 20 MiB, then 4 + 24 MiB (the 16 MiB block freed).
    let out_dir = dir.path().join("out");
    let out = cli(&[
        "replay",
        file.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let timeline = std::fs::read_to_string(out_dir.join("timeline.csv")).unwrap();
    println!("{timeline}");
    let rows: Vec<Vec<&str>> = timeline
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let header: Vec<&str> = timeline.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let seen: Vec<(&str, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r[col("op")],
                r[col("layer")],
                r[col("total_bytes")].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("step (train.py:12)", "step (train.py:12)", 4 * MIB),
            ("step (train.py:13)", "step (train.py:13)", 20 * MIB),
            ("step (train.py:14)", "step (train.py:14)", 28 * MIB),
        ]
    );
    for f in ["step.png", "step.svg", "layers.csv", "summary.txt"] {
        assert!(out_dir.join(f).exists(), "{f}");
    }
}

use serde_pickle::{HashableValue as K, Value as V};

/// A frame of a snapshot's stack.
fn frame(file: &str, line: i64, name: &str) -> V {
    V::Dict(
        [
            (K::String("filename".into()), V::String(file.into())),
            (K::String("line".into()), V::I64(line)),
            (K::String("name".into()), V::String(name.into())),
        ]
        .into(),
    )
}

/// An event of a snapshot's history.
fn event(action: &str, addr: u64, size: u64, frames: Vec<V>) -> V {
    V::Dict(
        [
            (K::String("action".into()), V::String(action.into())),
            (K::String("addr".into()), V::I64(addr as i64)),
            (K::String("size".into()), V::I64(size as i64)),
            (K::String("stream".into()), V::I64(0)),
            (K::String("frames".into()), V::List(frames)),
        ]
        .into(),
    )
}

/// A snapshot pickle as PyTorch writes it: device 0's history `trace`, no segments left
/// at its end, and the run's `PYTORCH_CUDA_ALLOC_CONF` when given.
fn write_snapshot(path: &Path, trace: Vec<V>, alloc_conf: Option<&str>) {
    let mut top = vec![
        (K::String("segments".into()), V::List(vec![])),
        (
            K::String("device_traces".into()),
            V::List(vec![V::List(trace)]),
        ),
    ];
    if let Some(conf) = alloc_conf {
        top.push((
            K::String("allocator_settings".into()),
            V::Dict(
                [(
                    K::String("PYTORCH_CUDA_ALLOC_CONF".into()),
                    V::String(conf.into()),
                )]
                .into(),
            ),
        ));
    }
    let bytes = serde_pickle::value_to_vec(
        &V::Dict(top.into_iter().collect()),
        serde_pickle::SerOptions::new(),
    )
    .unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// `plan` of a recorded run: its lever is the allocator's settings. The run asked for
/// 40 MiB, freed it, then asked for 12 MiB, under `max_split_size_mb:20`: no block of
/// 20 MiB or more serves a smaller request, so the 12 MiB take a new segment, reserved
/// 52 MiB (as `what_ifs_move_reserved_as_the_allocator_rules_say` computes). With
/// `expandable_segments:True`, the first request maps 2 pages of 20 MiB, and the 12 MiB
/// fit in the freed mapped block: 40 MiB. Within 48 MiB, the run as it ran does not fit
/// and the first setting tried, expandable segments, does (exit 0); within 32 MiB none
/// does (exit 1).
#[test]
fn plan_of_a_recorded_run_picks_the_first_allocator_setting_that_fits() {
    let (a, b) = (1u64 << 32, 2u64 << 32);
    let trace = vec![
        event("segment_alloc", a, 40 * MIB, vec![]),
        event("alloc", a, 40 * MIB, vec![]),
        event("free_requested", a, 40 * MIB, vec![]),
        event("free_completed", a, 40 * MIB, vec![]),
        event("segment_alloc", b, 12 * MIB, vec![]),
        event("alloc", b, 12 * MIB, vec![]),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.pickle");
    write_snapshot(&file, trace, Some("max_split_size_mb:20"));
    let out = cli(&["plan", file.to_str().unwrap(), "--memory", "48MiB", "--csv"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let csv = text(&out.stdout);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows[0],
        "alloc_conf,peak_allocated_bytes,peak_reserved_bytes,fits"
    );
    assert_eq!(
        rows[1],
        format!("max_split_size_mb:20,{},{},false", 40 * MIB, 52 * MIB)
    );
    assert_eq!(
        rows[2],
        format!("expandable_segments:True,{},{},true", 40 * MIB, 40 * MIB)
    );
    let out = cli(&["plan", file.to_str().unwrap(), "--memory", "48MiB"]);
    assert!(
        text(&out.stdout).contains(
            "it fits 48.00 MiB with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: peak \
             reserved 40.00 MiB (as it ran: 52.00 MiB), 8.00 MiB to spare"
        ),
        "{}",
        text(&out.stdout)
    );
    // A setting PyTorch takes that the model does not is said so, not shown as if it
    // did nothing.
    let out = cli(&[
        "replay",
        file.to_str().unwrap(),
        "--alloc-conf",
        "garbage_collection_threshold:0.8",
    ]);
    assert!(
        text(&out.stdout)
            .contains("not modelled, replayed as if absent: garbage_collection_threshold"),
        "{}",
        text(&out.stdout)
    );
    let out = cli(&["plan", file.to_str().unwrap(), "--memory", "32MiB"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("no allocator setting tried makes it fit 32.00 MiB"),
        "{}",
        text(&out.stdout)
    );
}

/// A snapshot recorded with stacks, as PyTorch pickles it: Python's pickler writes an
/// object referred to twice once and refers back to it, and PyTorch's snapshot shares
/// each allocation's frames list between the history entry and the block (each frame's
/// strings shared too). Made here by Python's own pickler from a real H200 snapshot
/// (frames added to every allocation, each list the same object in its entry and its
/// block): it replays to the same peaks as the file without them, and the allocations
/// get their sites (the first frame outside PyTorch).
#[test]
fn a_snapshot_with_stacks_shared_as_pytorch_pickles_them_replays() {
    let Some(python) = common::torch_python() else {
        common::cannot_run(
            "the snapshot with shared stacks: no Python beside LIBTORCH (run through \
             scripts/with-libtorch.sh)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let original = Path::new("tests/data/gpu-truth/h200-2026-11-27/snapshots/held-out-traced")
        .join("tv_mobilenet_v2.train.pickle.gz");
    let plain = dir.path().join("plain.pickle");
    let shared = dir.path().join("shared.pickle");
    let copied = dir.path().join("copied.pickle");
    let script = r#"
import gzip, pickle, sys
d = pickle.loads(gzip.open(sys.argv[1]).read())
open(sys.argv[2], "wb").write(pickle.dumps(d))
blocks = {b["address"]: b for s in d["segments"] for b in s["blocks"]}
model = "/home/user/train.py"
for i, e in enumerate(d["device_traces"][0]):
    if e["action"] != "alloc":
        continue
    frames = [
        {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1750, "name": "_call_impl"},
        {"filename": model, "line": 40 + i % 7, "name": "forward"},
        {"filename": model, "line": 90, "name": "main"},
    ]
    e["frames"] = frames
    if e["addr"] in blocks:
        blocks[e["addr"]]["frames"] = frames
open(sys.argv[3], "wb").write(pickle.dumps(d))
# The same data with nothing shared: every block's frames a copy.
for b in blocks.values():
    b["frames"] = [dict(f) for f in b["frames"]]
open(sys.argv[4], "wb").write(pickle.dumps(d))
"#;
    let out = std::process::Command::new(&python)
        .args(["-c", script])
        .args([&original, &plain, &shared, &copied])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The file does share: the blocks' frames are references back, not copies.
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(
        size(&shared) + 10_000 < size(&copied),
        "shared {} bytes, copied {}",
        size(&shared),
        size(&copied)
    );
    let a = Recording::read(&plain, 0).unwrap();
    let b = Recording::read(&shared, 0).unwrap();
    let c = Recording::read(&copied, 0).unwrap();
    assert_eq!(b.events, c.events);
    assert_eq!(b.sites, c.sites);
    let config = AllocatorConfig::default();
    let (ra, rb) = (a.replay(&config), b.replay(&config));
    assert_eq!(ra.recorded, rb.recorded);
    assert_eq!(ra.replayed, rb.replayed);
    assert_eq!(a.events.len(), b.events.len());
    let sited = b
        .events
        .iter()
        .filter(|e| e.action == tch_memprof::estimate::recorded::Action::Alloc)
        .filter(|e| {
            b.sites
                .get(e.site as usize)
                .is_some_and(|s| s.starts_with("forward (/home/user/train.py:4"))
        })
        .count();
    let allocs = b
        .events
        .iter()
        .filter(|e| e.action == tch_memprof::estimate::recorded::Action::Alloc)
        .count();
    assert!(
        sited > allocs / 2,
        "{sited} of {allocs} allocations sited at train.py's forward"
    );
}

/// `event` on `stream`.
fn event_on(action: &str, addr: u64, size: u64, stream: i64) -> V {
    let V::Dict(mut d) = event(action, addr, size, vec![]) else {
        unreachable!()
    };
    d.insert(K::String("stream".into()), V::I64(stream));
    V::Dict(d)
}

#[test]
fn a_history_on_two_streams_is_replayed_with_each_streams_free_blocks() {
    // Stream 1 frees its 20 MiB block; stream 2 asks for 20 MiB. PyTorch keeps the
    // freed block for stream 1, so the run made a second segment (recorded: 40 MiB
    // reserved); one pool for both would reuse the first (20 MiB).
    let (a, b) = (0x7f00_0000_0000u64, 0x7f10_0000_0000u64);
    let trace = vec![
        event_on("segment_alloc", a, 20 * MIB, 1),
        event_on("alloc", a, 20 * MIB, 1),
        event_on("free_requested", a, 20 * MIB, 1),
        event_on("free_completed", a, 20 * MIB, 1),
        event_on("segment_alloc", b, 20 * MIB, 2),
        event_on("alloc", b, 20 * MIB, 2),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two_streams.pickle");
    write_snapshot(&file, trace, None);
    let recording = Recording::read(&file, 0).unwrap();
    assert_eq!(recording.streams(), 2);
    let run = recording.replay(&AllocatorConfig::default());
    assert_eq!(run.recorded.reserved, 40 * MIB);
    assert_eq!(
        run.replayed.reserved,
        40 * MIB,
        "stream 2 cannot take stream 1's block"
    );
    assert_eq!(run.streams, 2);
    let out = cli(&["replay", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert!(
        printed.contains("(2 allocations, on 2 CUDA streams)"),
        "{printed}"
    );
    assert!(!printed.contains("warning"), "{printed}");
    // At the peak, each stream's segment: stream 1's 20 MiB all free (no request on
    // stream 2 could take it), stream 2's held.
    assert!(
        printed.contains("by the stream each segment was made for"),
        "{printed}"
    );
    let row = |id: &str| {
        printed
            .lines()
            .find(|l| l.contains(&format!(" {id} ")))
            .map(|l| l.split('┆').map(str::trim).collect::<Vec<_>>().join("|"))
            .unwrap_or_default()
    };
    assert_eq!(row("0x1"), "│ 0x1|1|20.00 MiB|0 B|20.00 MiB │", "{printed}");
    assert_eq!(row("0x2"), "│ 0x2|1|20.00 MiB|20.00 MiB|0 B │", "{printed}");
    let out = cli(&["replay", file.to_str().unwrap(), "--csv"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The recorded row, then the run's own settings replayed: both 40 MiB reserved.
    let csv = text(&out.stdout);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows[1],
        format!("recorded,{},{}", 20 * MIB, 40 * MIB),
        "{csv}"
    );
    assert_eq!(
        rows[2],
        format!("default,{},{}", 20 * MIB, 40 * MIB),
        "{csv}"
    );
    let out = cli(&["plan", file.to_str().unwrap(), "--memory", "1GiB"]);
    let printed = text(&out.stdout);
    assert!(
        printed.contains("a recorded run, on 2 CUDA streams"),
        "{printed}"
    );
    // A history that releases its cache (empty_cache(): its segments freed) releases
    // the replay's: the block freed on stream 1 is gone, and a request on stream 1
    // after it needs a new segment, which the replay counts from zero.
    let c = 0x7f20_0000_0000u64;
    let released = dir.path().join("released.pickle");
    write_snapshot(
        &released,
        vec![
            event_on("segment_alloc", a, 20 * MIB, 1),
            event_on("alloc", a, 20 * MIB, 1),
            event_on("free_requested", a, 20 * MIB, 1),
            event_on("free_completed", a, 20 * MIB, 1),
            event_on("segment_free", a, 20 * MIB, 1),
            event_on("segment_alloc", c, 30 * MIB, 1),
            event_on("alloc", c, 30 * MIB, 1),
        ],
        None,
    );
    let run = Recording::read(&released, 0)
        .unwrap()
        .replay(&AllocatorConfig::default());
    assert_eq!(run.recorded.reserved, 30 * MIB);
    assert_eq!(
        run.replayed.reserved,
        30 * MIB,
        "the 20 MiB segment was released"
    );
    // One stream: no streams said.
    let one = dir.path().join("one_stream.pickle");
    write_snapshot(
        &one,
        vec![
            event_on("segment_alloc", a, 20 * MIB, 1),
            event_on("alloc", a, 20 * MIB, 1),
        ],
        None,
    );
    let out = cli(&["replay", one.to_str().unwrap()]);
    assert!(
        !text(&out.stdout).contains("CUDA streams"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn several_ranks_side_by_side_with_the_peak_rank_and_its_excess() {
    // Four ranks whose one block (and segment) is 20, 60, 40 and 40 MiB: the peak rank
    // is rank1, 20 MiB (50%) over the median rank (the lower middle: 40 MiB).
    let dir = tempfile::tempdir().unwrap();
    let a = 0x7f00_0000_0000u64;
    for (rank, mib) in [(0, 20), (1, 60), (2, 40), (3, 40)] {
        let trace = vec![
            event_on("segment_alloc", a, mib * MIB, 0),
            event_on("alloc", a, mib * MIB, 0),
        ];
        write_snapshot(&dir.path().join(format!("rank{rank}.pickle")), trace, None);
    }
    let folder = dir.path().to_str().unwrap();
    let out = cli(&["replay", folder, "--memory", "50MiB"]);
    let printed = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "no setting fits every rank: {printed}"
    );
    assert!(printed.contains("4 ranks"), "{printed}");
    assert!(
        printed.contains(
            "the peak rank: rank1, peak reserved 60.00 MiB: 20.00 MiB (50.0%) above the \
             median rank's (rank2, 40.00 MiB)"
        ),
        "{printed}"
    );
    // What rank1 holds at its peak that rank2 does not: its one 60 MiB block (these
    // histories keep no frames, so blocks go by size).
    assert!(
        printed.contains(
            "what it holds at its peak beyond the median rank's at its own: +60.00 MiB in \
             blocks of 60.00 MiB"
        ),
        "{printed}"
    );
    assert!(printed.contains("✗ 10.00 MiB over"), "{printed}");
    assert!(
        printed.contains("every rank: no allocator setting"),
        "{printed}"
    );
    let out = cli(&["replay", folder, "--memory", "64MiB"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("every rank: it fits 64.00 MiB as it ran"));
    // CSV: a row per rank and setting, the recorded one first.
    let r0 = dir.path().join("rank0.pickle");
    let r1 = dir.path().join("rank1.pickle");
    let out = cli(&[
        "replay",
        r0.to_str().unwrap(),
        r1.to_str().unwrap(),
        "--csv",
    ]);
    let csv = text(&out.stdout);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "rank,alloc_conf,peak_allocated_bytes,peak_reserved_bytes"
    );
    assert_eq!(lines[1], format!("rank0,recorded,{0},{0}", 20 * MIB));
    assert_eq!(lines[5], format!("rank1,recorded,{0},{0}", 60 * MIB));
    assert_eq!(lines.len(), 9, "{csv}");
    // --output-dir: each rank's step files in a folder of its name.
    let out_dir = dir.path().join("out");
    let out = cli(&[
        "replay",
        r0.to_str().unwrap(),
        r1.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out_dir.join("rank1").join("timeline.csv").is_file());
    // Bad input in one file: one line naming it, exit 2.
    let bad = dir.path().join("bad.pickle");
    std::fs::write(&bad, b"not a pickle").unwrap();
    let out = cli(&["replay", r0.to_str().unwrap(), bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(bad.to_str().unwrap()), "{err}");
}
