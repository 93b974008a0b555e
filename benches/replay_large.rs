//! `replay` of a large history: its time and the resident memory it takes, against the
//! file's size. The history is made here from a real one, the H200's snapshot of
//! BERT-base's training step (`tests/data/gpu-truth/h200-2026-11-27/snapshots/traced/`,
//! 8,007 events, read by the wheel's Python), its events repeated with each copy's
//! addresses moved past the last's until the file reaches the size asked for, written as
//! Python's pickler writes a snapshot (every dict memoized, its keys and repeated strings
//! written once and referred back to), without stacks.
//!
//!     scripts/with-libtorch.sh cargo bench --bench replay_large
//!
//! Options (after `--`): `--bytes N` (default 1 GB: 1000000000). Prints the file's size,
//! the time to read it and to replay it under each allocator setting `replay` tries, and
//! the process's peak resident memory (VmHWM) over the file's size.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use tch_memprof::estimate::recorded::Recording;
use tch_memprof::estimate::AllocatorConfig;

const SNAPSHOT: &str =
    "tests/data/gpu-truth/h200-2026-11-27/snapshots/traced/hf_bert_base.train.cuda.pickle.gz";

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// A pickle written as Python's pickler writes one (protocol 2 opcodes): strings once,
/// then referred back to; every dict memoized.
struct Writer<W: Write> {
    out: W,
    memo: std::collections::HashMap<String, u32>,
    next: u32,
}

impl<W: Write> Writer<W> {
    fn op(&mut self, b: &[u8]) {
        self.out.write_all(b).unwrap();
    }
    fn put(&mut self) -> u32 {
        let id = self.next;
        self.next += 1;
        self.op(b"r");
        self.op(&id.to_le_bytes());
        id
    }
    fn str(&mut self, s: &str) {
        if let Some(&id) = self.memo.get(s) {
            self.op(b"j");
            self.op(&id.to_le_bytes());
            return;
        }
        self.op(b"X");
        self.op(&(s.len() as u32).to_le_bytes());
        self.op(s.as_bytes());
        let id = self.put();
        self.memo.insert(s.to_string(), id);
    }
    fn int(&mut self, v: i64) {
        if (0..256).contains(&v) {
            self.op(&[b'K', v as u8]);
        } else if i32::try_from(v).is_ok() {
            self.op(b"J");
            self.op(&(v as i32).to_le_bytes());
        } else {
            self.op(&[0x8a, 8]);
            self.op(&v.to_le_bytes());
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let target: u64 = args
        .iter()
        .position(|a| a == "--bytes")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000_000);
    let Some(python) = common::torch_python() else {
        eprintln!("NOT RUN: replay_large: no Python beside LIBTORCH (run through scripts/with-libtorch.sh)");
        std::process::exit(2);
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    // The real history's events, a line each.
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import gzip, pickle, sys\n\
             s = pickle.load(gzip.open(sys.argv[1]))\n\
             for e in s['device_traces'][0]:\n\
             \x20   print(e['action'], e['addr'], e['size'], e['stream'], e['time_us'])",
            root.join(SNAPSHOT).to_str().unwrap(),
        ])
        .output()
        .expect("runs the wheel's Python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<(String, i64, i64, i64, i64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let n = |i: usize| f[i].parse::<i64>().unwrap();
            (f[0].to_string(), n(1), n(2), n(3), n(4))
        })
        .collect();
    let span =
        events.iter().map(|e| e.1).max().unwrap() - events.iter().map(|e| e.1).min().unwrap();
    let shift = (span + (1 << 30)) & !((1 << 30) - 1);

    let path = dir.path().join("large.pickle");
    let started = Instant::now();
    let file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).unwrap());
    let mut w = Writer {
        out: file,
        memo: Default::default(),
        next: 0,
    };
    w.op(&[0x80, 2]);
    w.op(b"}");
    w.put();
    w.str("device_traces");
    w.op(b"]");
    w.put();
    w.op(b"]");
    w.put();
    let (mut written, mut copies, mut count) = (0u64, 0i64, 0u64);
    while written < target {
        for chunk in events.chunks(1000) {
            w.op(b"(");
            for (action, addr, size, stream, time) in chunk {
                w.op(b"}");
                w.put();
                w.op(b"(");
                w.str("action");
                w.str(action);
                w.str("addr");
                w.int(addr + copies * shift);
                w.str("size");
                w.int(*size);
                w.str("stream");
                w.int(*stream);
                w.str("time_us");
                w.int(*time);
                w.str("compile_context");
                w.str("N/A");
                w.str("user_metadata");
                w.str("");
                w.op(b"u");
                count += 1;
            }
            w.op(b"e");
        }
        copies += 1;
        w.out.flush().unwrap();
        written = std::fs::metadata(&path).unwrap().len();
    }
    w.op(b"a");
    w.op(b"s");
    w.str("segments");
    w.op(b"]");
    w.op(b"s");
    w.op(b".");
    w.out.flush().unwrap();
    drop(w);
    let size = std::fs::metadata(&path).unwrap().len();
    println!(
        "history: {count} events ({copies} copies of the real one), {size} B ({:.2} GB), written in {:.1} s",
        size as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );

    let before = status_kib("VmRSS:") * 1024;
    let t = Instant::now();
    let recording = Recording::read(&path, 0).unwrap();
    let read = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for conf in ["", "expandable_segments:True", "max_split_size_mb:128"] {
        let run = recording.replay(&AllocatorConfig::parse(conf).unwrap());
        std::hint::black_box(run.replayed);
    }
    let replayed = t.elapsed().as_secs_f64();
    let peak = status_kib("VmHWM:") * 1024;
    println!(
        "read {read:.1} s, replayed under 3 settings {replayed:.1} s, {:.1} s in all",
        read + replayed
    );
    println!(
        "peak resident {peak} B: {:.2} times the file ({:.2} times beyond the {before} B resident before reading)",
        peak as f64 / size as f64,
        (peak - before) as f64 / size as f64
    );
}
