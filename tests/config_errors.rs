//! Bad configuration fails at build() naming the value and why; one profiler at a time;
//! the VarStore stays usable; a vanished CSV folder is logged and counted, not fatal.

mod common;

use tch::{nn, Device, Kind, Tensor};
use tch_memprof::{Error, MemoryProfiler};

#[test]
fn bad_configuration_and_runtime_failures() {
    let mut vs = nn::VarStore::new(Device::Cpu);
    let _w = vs.root().var("w", &[8, 8], nn::Init::Const(1.0));

    // print_period 0.
    let e = MemoryProfiler::builder(&vs)
        .print_period(0)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidConfig {
                name: "print_period",
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("print_period = 0") && msg.contains("at least 1"),
        "{msg}"
    );

    // A label of two lines, or with a terminal escape: refused, saying why.
    for (label, why) in [
        ("batch 16\nbatch 48", "one line"),
        ("a\u{1b}[31m", "control"),
    ] {
        let e = MemoryProfiler::builder(&vs)
            .label(label)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidConfig { name: "label", .. }),
            "{e}"
        );
        assert!(e.to_string().contains(why), "{e}");
    }

    // A csv_dir that cannot be created: a path under a regular file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("sub");
    let e = MemoryProfiler::builder(&vs)
        .csv(true)
        .csv_dir(&bad)
        .build()
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::InvalidConfig {
                name: "csv_dir",
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains(&bad.display().to_string()) && msg.contains("cannot be created"),
        "{msg}"
    );

    // A csv_dir that exists but cannot be written: a read-only folder, or, where the
    // tests run as root (which ignores modes), a folder no one may create files in
    // (/sys and /proc refuse new files to root too).
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("read-only");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let refuses = |d: &std::path::Path| std::fs::write(d.join(".tch-memprof-probe"), b"x").is_err();
    let unwritable = [ro.clone(), "/sys".into(), "/proc".into()]
        .into_iter()
        .find(|d| d.is_dir() && refuses(d));
    match unwritable {
        Some(d) => {
            let result = MemoryProfiler::builder(&vs).csv(true).csv_dir(&d).build();
            let msg = result.unwrap_err().to_string();
            assert!(
                msg.contains("csv_dir") && msg.contains("not writable"),
                "{}: {msg}",
                d.display()
            );
        }
        None => common::cannot_run(
            "config_errors: the unwritable csv_dir case (no folder here refuses new files)",
        ),
    }
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();

    // Without csv, csv_dir is not touched.
    let untouched = dir.path().join("never-created");
    let p = MemoryProfiler::builder(&vs)
        .csv_dir(&untouched)
        .print(false)
        .build()
        .unwrap();
    assert!(!untouched.exists());

    // A second live profiler is refused, and allowed again once the first is dropped.
    let e = MemoryProfiler::new(&vs).unwrap_err();
    assert!(matches!(e, Error::AlreadyActive), "{e}");
    assert!(e.to_string().contains("already active"));
    drop(p);

    // The VarStore stays usable while a profiler is alive.
    let csv_dir = dir.path().join("csv");
    let mut p = MemoryProfiler::builder(&vs)
        .print(false)
        .csv(true)
        .csv_dir(&csv_dir)
        .build()
        .unwrap();
    vs.freeze();
    let saved = dir.path().join("vs.safetensors");
    vs.save(&saved).unwrap();
    vs.load(&saved).unwrap();
    vs.unfreeze();
    p.record_stats();
    assert_eq!(p.failures(), 0);
    assert_eq!(p.last_stats().unwrap().weights_bytes, 8 * 8 * 4);

    // The CSV folder vanishes mid-run: logged and counted, training goes on, and the
    // files come back for the next rows. The files' links are read once a second (not
    // at every row): the first row of a later second finds them gone.
    std::fs::remove_dir_all(&csv_dir).unwrap();
    let x = Tensor::ones([4], (Kind::Float, Device::Cpu));
    std::thread::sleep(std::time::Duration::from_millis(1_001));
    p.record_stats();
    assert!(p.failures() >= 1, "the lost rows are reported as a failure");
    let after = p.failures();
    p.record_stats();
    assert_eq!(p.failures(), after, "the recreated files take the next row");
    let summary = p.csv_paths()[0].clone();
    let rows = csv::Reader::from_path(&summary).unwrap().records().count();
    assert_eq!(rows, 2, "rows written since the folder was recreated");
    drop(x);
}
