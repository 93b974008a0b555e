//! Compiles the native layer against the libtorch that torch-sys found (only the files
//! an edit touched, from the compiler's own dependency lists), turns the
//! FFI contract's layout table (src/native/memprof_layout.h) into compile-time checks of the
//! Rust mirrors in src/ffi/, and makes this package's binaries (tests, examples,
//! benches) find libtorch without LD_LIBRARY_PATH.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

const NATIVE: &str = "src/native";

fn main() {
    println!("cargo:rerun-if-changed={NATIVE}");
    let header = Path::new(NATIVE).join("memprof_layout.h");
    write_layout_checks(&header);

    // The API docs without libtorch (`--features doc-only`, as docs.rs builds them):
    // torch-sys finds no libtorch then, and nothing is compiled or linked.
    if env::var_os("CARGO_FEATURE_DOC_ONLY").is_some() {
        println!("cargo:rustc-env=TCH_MEMPROF_LIBTORCH_VERSION=none (doc-only build)");
        return;
    }

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
        .flag_if_supported("-Wno-deprecated-declarations")
        // Every thread-local another source reads (internal.h, counters.h) is constant-
        // initialised (static_asserts beside their definitions), so a read in another
        // source need not call the variable's initialiser through the PLT first: without
        // this, each read on the allocation path began with a check of that initialiser's
        // address in the GOT (a cache line of its own) and a branch.
        .flag_if_supported("-fno-extern-tls-init");
    // Line tables only where the profile has debug info (Cargo says only true or false):
    // each source includes libtorch's headers, whose full debug information made an
    // object ~8x larger and its compile ~2.5x slower, for nothing a backtrace uses. The
    // last -g1 is the one GCC keeps: cc follows its -g1 with -gdwarf-4, which GCC takes
    // as full debug information again.
    if env::var("DEBUG").is_ok_and(|d| d != "false" && d != "0") {
        build.debug_str("line-tables-only").flag("-g1");
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let objects = compile_changed(&build, &native_sources(Path::new(NATIVE)), &out_dir);
    build.objects(&objects);
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
/// (`MpX` is mirrored by the Rust `MpX`, `MP_C` as `native::C`), included by src/ffi/mod.rs.
fn write_layout_checks(header: &Path) {
    let text = fs::read_to_string(header)
        .unwrap_or_else(|e| panic!("tch-memprof: cannot read {}: {e}", header.display()));
    let mut out = String::from("// Generated by build.rs from src/native/memprof_layout.h.\n");
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
        match (name, args.as_slice()) {
            ("MP_SIZE", [s, n]) => writeln!(
                out,
                "const _: () = assert!(std::mem::size_of::<{s}>() == {n}, \"size of {s}\");"
            ),
            ("MP_FIELD", [s, f, o]) => writeln!(
                out,
                "const _: () = assert!(std::mem::offset_of!({s}, {f}) == {o}, \"offset of {s}.{f}\");"
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

/// Every C++ file under `dir`, in a stable order.
fn native_sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "cpp") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Compiles each of `sources` into an object under `out_dir/native`, unless its object
/// is newer than the source and than every header the compiler read for it (its `-MMD`
/// list) and the compiler's command is the last build's: an edit to one file recompiles
/// that file and the files that include what changed, not the whole layer against
/// libtorch's headers. `NUM_JOBS` compilers at once, a new one as soon as one ends.
/// With GCC, libtorch's headers are parsed once, into a precompiled header
/// ([`PRECOMPILED`]) every source is compiled with. With both, the library's build took
/// 109 s against 168 s before, on a 2-core AMD EPYC (`cargo clean --release -p
/// tch-memprof`, then `time scripts/with-libtorch.sh cargo build --release --lib`).
/// Returns every object.
fn compile_changed(build: &cc::Build, sources: &[PathBuf], out_dir: &Path) -> Vec<PathBuf> {
    let dir = out_dir.join("native");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let tool = build.get_compiler();
    let command = format!("{:?} {:?}", tool.path(), tool.args());
    let stamp = dir.join("command");
    let mut same_command = fs::read_to_string(&stamp).is_ok_and(|c| c == command);
    let jobs: usize = env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(1)
        .max(1);
    // GCC finds `H.gch` beside `H` when `-include H` names it, and uses it when it was
    // made by the same compiler with the same options (else it reads `H` itself).
    let precompiled = tool.is_like_gnu().then(|| {
        let header = dir.join("precompiled.h");
        let gch = dir.join("precompiled.h.gch");
        let dep = dir.join("precompiled.h.d");
        let text = PRECOMPILED
            .iter()
            .map(|h| format!("#include <{h}>\n"))
            .collect::<String>();
        if fs::read_to_string(&header).ok().as_deref() != Some(text.as_str()) {
            fs::write(&header, text)
                .unwrap_or_else(|e| panic!("writing {}: {e}", header.display()));
        }
        if !same_command || stale(&gch, &dep) {
            let mut cmd = tool.to_command();
            cmd.arg("-MMD").arg("-MF").arg(&dep);
            cmd.args(["-x", "c++-header"])
                .arg(&header)
                .arg("-o")
                .arg(gch.with_extension("gch.partial"));
            run_to(cmd, &header, &gch, "gch.partial");
            // Every source is compiled with it: all of them again.
            same_command = false;
        }
        header
    });
    let mut objects = Vec::new();
    let mut todo = Vec::new();
    for src in sources {
        // The source's own path below the native folder: no two objects collide.
        let rel = src.strip_prefix(NATIVE).unwrap_or(src);
        let obj = dir.join(rel).with_extension("o");
        let dep = dir.join(rel).with_extension("d");
        if let Some(parent) = obj.parent() {
            fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("creating {}: {e}", parent.display()));
        }
        if !same_command || stale(&obj, &dep) {
            todo.push((src.clone(), obj.clone(), dep));
        }
        objects.push(obj);
    }
    let mut todo = todo.into_iter();
    let mut running: Vec<(PathBuf, PathBuf, std::process::Child)> = Vec::new();
    loop {
        while running.len() < jobs {
            let Some((src, obj, dep)) = todo.next() else {
                break;
            };
            // Written under a temporary name and renamed once whole: a compile that is
            // killed leaves no object that looks built.
            let _ = fs::remove_file(&obj);
            let mut cmd = tool.to_command();
            if let Some(header) = &precompiled {
                cmd.arg("-include").arg(header);
            }
            cmd.arg("-MMD").arg("-MF").arg(&dep);
            cmd.arg("-c")
                .arg(&src)
                .arg("-o")
                .arg(obj.with_extension("o.partial"));
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("running the C++ compiler for {}: {e}", src.display()));
            running.push((src, obj, child));
        }
        if running.is_empty() {
            break;
        }
        // The first compiler to end frees its slot.
        let done = loop {
            let ended = running
                .iter_mut()
                .position(|(_, _, child)| child.try_wait().map_or(true, |status| status.is_some()));
            match ended {
                Some(i) => break running.swap_remove(i),
                None => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        };
        let (src, obj, mut child) = done;
        finish(child.wait(), &src, &obj, "o.partial");
    }
    fs::write(&stamp, command).unwrap_or_else(|e| panic!("writing {}: {e}", stamp.display()));
    objects
}

/// libtorch's headers most native sources include, precompiled once with GCC. A source
/// still includes what it uses: other compilers build without this, and
/// `scripts/native-syntax-check.sh` compiles each source on its own.
const PRECOMPILED: &[&str] = &[
    "ATen/ATen.h",
    "ATen/record_function.h",
    "ATen/core/dispatch/Dispatcher.h",
    "torch/library.h",
    "c10/core/CPUAllocator.h",
    "algorithm",
    "array",
    "atomic",
    "mutex",
    "optional",
    "string",
    "vector",
];

/// Runs the compiler `cmd` for `src` to completion, then renames its output (`out` with
/// the extension `partial`) to `out`; panics naming `src` if it failed.
fn run_to(mut cmd: std::process::Command, src: &Path, out: &Path, partial: &str) {
    match cmd.status() {
        Ok(status) => finish(Ok(status), src, out, partial),
        Err(e) => panic!("running the C++ compiler for {}: {e}", src.display()),
    }
}

/// A compiler's end: its output renamed into place, or a panic naming `src`.
fn finish(
    status: std::io::Result<std::process::ExitStatus>,
    src: &Path,
    out: &Path,
    partial: &str,
) {
    if !status.is_ok_and(|s| s.success()) {
        panic!(
            "tch-memprof: compiling {} failed (see above)",
            src.display()
        );
    }
    fs::rename(out.with_extension(partial), out)
        .unwrap_or_else(|e| panic!("renaming {}: {e}", out.display()));
}

/// Whether `obj` must be compiled again: missing, or older than a file its dependency
/// list `dep` names (the source and the headers it read), or the list is missing.
fn stale(obj: &Path, dep: &Path) -> bool {
    let (Ok(built), Ok(deps)) = (
        fs::metadata(obj).and_then(|m| m.modified()),
        fs::read_to_string(dep),
    ) else {
        return true;
    };
    // `obj: src header header \` lines: every path after the colon.
    let Some((_, paths)) = deps.split_once(": ") else {
        return true;
    };
    paths.split_whitespace().filter(|p| *p != "\\").any(|p| {
        fs::metadata(p)
            .and_then(|m| m.modified())
            // Not older than the object: changed while, or after, it was built.
            .map_or(true, |t| t >= built)
    })
}
