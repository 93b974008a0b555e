//! Compiles the native shim against the libtorch that torch-sys found, and makes this
//! package's binaries (tests, examples, benches) find libtorch without LD_LIBRARY_PATH.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/native/memprof.cpp");
    println!("cargo:rerun-if-changed=src/native/flops.h");
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
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std("c++17")
        // Release layout of RecordFunction (it has a debug-only field otherwise).
        .define("NDEBUG", None)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .file("src/native/memprof.cpp")
        .compile("tch_memprof_native");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=dl");
    // Tests, examples and benches of this package run without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // For dependents: DEP_TCH_MEMPROF_LIBTORCH_LIB.
    println!("cargo:libtorch_lib={}", lib.display());
}
