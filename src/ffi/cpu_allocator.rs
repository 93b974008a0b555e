//! The tracking CPU allocator (`cpu_allocator.cpp`).

use super::check;
use crate::error::Result;

extern "C" {
    fn memprof_selftest_reenter() -> i32;
}

/// Re-enters the CPU allocation hook on purpose (the negative control of
/// `SessionState::hook_reentries`).
pub(crate) fn selftest_reenter() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_selftest_reenter() })
}
