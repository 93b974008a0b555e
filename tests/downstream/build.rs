// The one line a user's binary needs to find libtorch without LD_LIBRARY_PATH: tch-memprof
// publishes the folder of the libtorch it was built against (its `links` key), and an rpath
// to it goes into this crate's binaries.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TCH_MEMPROF_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
