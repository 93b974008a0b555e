//! The process: resident memory and unlocked writes to standard output (`process.cpp`).

use std::ffi::c_char;

use super::check;
use crate::error::Result;

extern "C" {
    fn memprof_write_stdout(buf: *const c_char, len: usize) -> i32;
    pub(super) fn memprof_process_memory(resident: *mut i64, peak_resident: *mut i64) -> i32;
}

/// Writes to standard output with one `write(2)` loop: no lock (a thread holding
/// Rust's stdout lock cannot stall it), no allocation. For the out-of-memory path.
pub(crate) fn write_stdout_unlocked(text: &str) -> Result<()> {
    // SAFETY: the pointer and length describe `text`'s bytes for the call's duration.
    check(unsafe { memprof_write_stdout(text.as_ptr().cast(), text.len()) })
}

/// The process's resident memory and its peak since start, in bytes (zeros where the
/// system does not tell).
pub(crate) fn process_memory() -> Result<(u64, u64)> {
    let (mut rss, mut peak) = (0i64, 0i64);
    // SAFETY: both pointers are valid, writable i64s for the call's duration.
    check(unsafe { memprof_process_memory(&mut rss, &mut peak) })?;
    Ok((rss.max(0) as u64, peak.max(0) as u64))
}
