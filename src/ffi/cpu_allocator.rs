//! The tracking CPU allocator (`cpu_allocator.cpp`).

#[allow(unused_imports)]
use std::ffi::{c_char, c_void};

#[allow(unused_imports)]
use tch::Tensor;

#[allow(unused_imports)]
use super::{buffer, check, native};
#[allow(unused_imports)]
use crate::error::{Error, Result};

extern "C" {
    fn memprof_selftest_reenter() -> i32;
}

/// Re-enters the CPU allocation hook on purpose (the negative control of
/// `State::hook_reentries`).
pub(crate) fn selftest_reenter() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_selftest_reenter() })
}
