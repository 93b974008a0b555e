//! Compiles the native layer against the libtorch that torch-sys found, turns the
//! FFI contract's layout table (src/native/memprof.h) into compile-time checks of the
//! Rust mirrors in src/ffi/, and makes this package's binaries (tests, examples,
//! benches) find libtorch without LD_LIBRARY_PATH.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

const NATIVE: &str = "src/native";
const SOURCES: [&str; 18] = [
    "amp.cpp",
    "api.cpp",
    "attention.cpp",
    "counters.cpp",
    "cpu_allocator.cpp",
    "cuda.cpp",
    "flops.cpp",
    "logs.cpp",
    "meta.cpp",
    "meta_autocast.cpp",
    "meta_kernels.cpp",
    "names.cpp",
    "oom.cpp",
    "ops.cpp",
    "process.cpp",
    "registry.cpp",
    "session.cpp",
    "sites.cpp",
];

fn main() {
    println!("cargo:rerun-if-changed={NATIVE}");
    let header = Path::new(NATIVE).join("memprof.h");
    write_layout_checks(&header);

    let lib = match env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(lib) => PathBuf::from(lib),
        Err(_) => panic!(
            "tch-memprof: torch-sys did not publish libtorch's folder (DEP_TCH_LIBTORCH_LIB); \
             build through scripts/with-libtorch.sh or set LIBTORCH"
        ),
    };
    let root = lib
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| lib.clone());
    let version = libtorch_version(&root.join("include"));
    println!("cargo:rustc-env=TCH_MEMPROF_LIBTORCH_VERSION={version}");
    if (version.0, version.1) < TESTED.0 || (version.0, version.1) > TESTED.1 {
        println!(
            "cargo:warning=tch-memprof: libtorch {version} is outside the tested {}.{} to {}.{}",
            TESTED.0 .0, TESTED.0 .1, TESTED.1 .0, TESTED.1 .1
        );
    }
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        // The standard libtorch's headers are written for: C++20 from 2.13 on (2.13's
        // headers use default initialisers on bit-fields, a C++20 feature), C++17 before.
        .std(if (version.0, version.1) >= (2, 13) {
            "c++20"
        } else {
            "c++17"
        })
        // Release layout of RecordFunction (it has a debug-only field otherwise).
        .define("NDEBUG", None)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations");
    for s in SOURCES {
        build.file(Path::new(NATIVE).join(s));
    }
    build.compile("tch_memprof_native");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=dl");
    // Tests, examples and benches of this package run without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // For dependents: DEP_TCH_MEMPROF_LIBTORCH_LIB and DEP_TCH_MEMPROF_LIBTORCH_VERSION.
    println!("cargo:libtorch_lib={}", lib.display());
    println!("cargo:libtorch_version={version}");
}

/// The libtorch versions (major, minor) the whole test suite has run on.
const TESTED: ((u32, u32), (u32, u32)) = ((2, 11), (2, 13));

#[derive(Clone, Copy)]
struct Version(u32, u32, u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// libtorch's version from its own header: `torch/headeronly/version.h` (2.9 on), else
/// `torch/csrc/api/include/torch/version.h` (older releases).
fn libtorch_version(include: &Path) -> Version {
    let candidates = [
        include.join("torch/headeronly/version.h"),
        include.join("torch/csrc/api/include/torch/version.h"),
    ];
    for path in &candidates {
        let Ok(text) = fs::read_to_string(path) else {
            continue;
        };
        println!("cargo:rerun-if-changed={}", path.display());
        let field = |name: &str| {
            text.lines().find_map(|l| {
                let rest = l.trim().strip_prefix("#define ")?.strip_prefix(name)?;
                rest.trim().parse::<u32>().ok()
            })
        };
        if let (Some(major), Some(minor), Some(patch)) = (
            field("TORCH_VERSION_MAJOR"),
            field("TORCH_VERSION_MINOR"),
            field("TORCH_VERSION_PATCH"),
        ) {
            return Version(major, minor, patch);
        }
    }
    panic!(
        "tch-memprof: no libtorch version header under {} (looked for {})",
        include.display(),
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Reads the `MP_SIZE(S, n)`, `MP_FIELD(S, f, o)` and `MP_CONST(C, v)` lines of the
/// header and writes `$OUT_DIR/layout.rs`: the same numbers asserted on the Rust side
/// (`MpX` is mirrored as `X`, `MP_C` as `C`), included by src/ffi/mod.rs.
fn write_layout_checks(header: &Path) {
    let text = fs::read_to_string(header)
        .unwrap_or_else(|e| panic!("tch-memprof: cannot read {}: {e}", header.display()));
    let mut out = String::from("// Generated by build.rs from src/native/memprof.h.\n");
    let mut checks = 0;
    for line in text.lines() {
        let line = line.trim().trim_end_matches('\\').trim();
        let Some((name, rest)) = line.split_once('(') else {
            continue;
        };
        let Some(args) = rest.strip_suffix(')') else {
            continue;
        };
        let args: Vec<&str> = args.split(',').map(str::trim).collect();
        let mirror = |s: &str| s.strip_prefix("Mp").unwrap_or(s).to_string();
        match (name, args.as_slice()) {
            ("MP_SIZE", [s, n]) => writeln!(
                out,
                "const _: () = assert!(std::mem::size_of::<{}>() == {n}, \"size of {s}\");",
                mirror(s)
            ),
            ("MP_FIELD", [s, f, o]) => writeln!(
                out,
                "const _: () = assert!(std::mem::offset_of!({}, {f}) == {o}, \"offset of {s}.{f}\");",
                mirror(s)
            ),
            ("MP_CONST", [c, v]) => writeln!(
                out,
                "const _: () = assert!(native::{} as i64 == {v}, \"value of {c}\");",
                c.strip_prefix("MP_").unwrap_or(c)
            ),
            _ => continue,
        }
        .expect("writing to a String");
        checks += 1;
    }
    assert!(
        checks > 100,
        "tch-memprof: only {checks} layout lines found in {}",
        header.display()
    );
    let dest = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("layout.rs");
    fs::write(&dest, out).unwrap_or_else(|e| panic!("cannot write {}: {e}", dest.display()));
}
