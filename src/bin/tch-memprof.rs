//! The `tch-memprof` command. Its code is the library's crate-private `cli` module
//! (`src/cli/`): the command's words are not library API.

fn main() -> std::process::ExitCode {
    tch_memprof::__cli_main()
}
