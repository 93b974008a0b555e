//! The one seam to the native layer (`src/native/`): every `extern "C"` declaration
//! and every `unsafe` block of the crate lives here. The contract is
//! `src/native/memprof.h`; its structs are mirrored field for field by the `Mp*` structs
//! of the same names, and build.rs turns its layout table (`memprof_layout.h`) into
//! compile-time checks of their sizes, field offsets and the shared constants
//! (`layout.rs`, included below), so a drift on either side fails the build. A mirror
//! is never named outside `ffi`: each is decoded here into a typed value, which is what
//! the rest of the crate reads (autocast's saved state goes out sealed, to come back
//! unread).
//!
//! Every native function returns a status; a failure becomes [`Error::Native`] with
//! the native layer's message. Nothing here panics.
#![allow(unsafe_code)]

use std::ffi::c_char;

use crate::error::{Error, Result};

mod amp;
mod cpu_allocator;
pub(crate) mod cuda;
mod events;
mod logs;
mod meta;
mod names;
mod oom;
mod process;
mod program;
mod registry;
mod session;

pub(crate) use amp::*;
pub(crate) use cpu_allocator::*;
pub(crate) use cuda::*;
pub(crate) use events::*;
pub(crate) use logs::*;
pub(crate) use meta::*;
pub(crate) use names::*;
pub(crate) use oom::*;
pub(crate) use process::*;
pub(crate) use program::*;
pub(crate) use registry::*;
pub(crate) use session::*;

extern "C" {
    fn memprof_last_error(buf: *mut c_char, len: usize, needed: *mut usize) -> i32;
}

/// Constants of the contract (`MP_*` in memprof.h).
pub(crate) mod native {
    pub const MAX_DEVICES: usize = 17;
    pub const PHASE_FORWARD: u32 = 0;
    pub const PHASE_BACKWARD: u32 = 1;
    pub const PHASE_OPTIMIZER: u32 = 2;
    pub const PHASE_IDLE: u32 = 3;
    pub const EV_ALLOC: u8 = 1;
    pub const EV_FREE: u8 = 2;
    pub const EV_OP_BEGIN: u8 = 3;
    pub const EV_OP_END: u8 = 4;
    pub const EV_LINK: u8 = 5;
    pub const EV_FLOPS: u8 = 6;
    pub const EV_UNCOUNTED: u8 = 7;
    pub const EV_PHASE: u8 = 8;
    pub const EV_READ: u8 = 9;
    pub const EV_BASELINE: u8 = 10;
    pub const EV_WORKSPACE: u8 = 11;
    pub const EV_TRANSIENT: u8 = 12;
    pub const TRANSIENT_EXACT: i32 = 0;
    pub const TRANSIENT_BOUND: i32 = 1;
    pub const TRANSIENT_MEASURED: i32 = 2;
    pub const TRANSIENT_RULE: i32 = 3;
    pub const TRANSIENT_SPLIT: i32 = 4;
    pub const TARGET_STEP: i32 = 0;
    pub const TARGET_DRY_RUN: i32 = 1;
    pub const SITE_DEPTH: usize = 96;
    pub const BLOCKS_WATCH: i32 = 1;
    pub const BLOCKS_GRADS_ONLY: i32 = 2;
    pub const WATCH_VARIABLE: u32 = 1;
    pub const WATCH_GRAD: u32 = 2;
    pub const DEVICE_CPU: i32 = 0;
    pub const DEVICE_CUDA: i32 = 1;
    pub const CUDA_RESET_PEAKS: i32 = 0;
    pub const CUDA_EMPTY_CACHE: i32 = 1;
    pub const CUDA_CLEAR_WORKSPACES: i32 = 2;
    pub const WORKSPACE_CUBLAS: i32 = 0;
    pub const WORKSPACE_CUBLASLT: i32 = 1;
    pub const META_CAPACITY: u64 = 33_554_432;
    pub const AUTOCAST_LIST_CUDA: i32 = 0;
    pub const AUTOCAST_LIST_CPU: i32 = 1;
    pub const AUTOCAST_REGISTERED_CUDA: i32 = 2;
    pub const AUTOCAST_REGISTERED_CPU: i32 = 3;
    pub const INPUT_UNKNOWN: i32 = 0;
    pub const INPUT_TOKENS: i32 = 1;
    pub const INPUT_IMAGES: i32 = 2;
    pub const MARK_NONE: i32 = 0;
    pub const MARK_FORWARD: i32 = 1;
    pub const MARK_BACKWARD: i32 = 2;
    pub const MARK_OPTIMIZER: i32 = 3;
    pub const MARK_BASELINE: i32 = 4;
    pub const MARK_END: i32 = 5;
    pub const MARK_STEP: i32 = 6;
    pub const VALUE_NONE: i32 = 0;
    pub const VALUE_TENSOR: i32 = 1;
    pub const VALUE_INT: i32 = 2;
    pub const VALUE_FLOAT: i32 = 3;
    pub const VALUE_BOOL: i32 = 4;
    pub const VALUE_STRING: i32 = 5;
    pub const VALUE_DEVICE: i32 = 6;
    pub const VALUE_LIST: i32 = 7;
    pub const ATTN_AUTO: i32 = 0;
    pub const ATTN_FLASH: i32 = 1;
    pub const ATTN_EFFICIENT: i32 = 2;
    pub const ATTN_CUDNN: i32 = 3;
    pub const ATTN_MATH: i32 = 4;
}
pub(crate) use native::MAX_DEVICES;

// The compile-time layout checks generated from memprof_layout.h.
include!(concat!(env!("OUT_DIR"), "/layout.rs"));

fn last_error() -> Error {
    let mut buf = vec![0u8; 1024];
    let mut needed = 0usize;
    // SAFETY: the buffer is valid for its length; the callee writes at most len-1 bytes
    // plus a NUL, and `needed` is a valid out-pointer.
    unsafe { memprof_last_error(buf.as_mut_ptr().cast(), buf.len(), &mut needed) };
    if needed >= buf.len() && buf.try_reserve_exact(needed + 1 - buf.len()).is_ok() {
        // A long message (a TorchScript traceback): read it whole.
        buf.resize(needed + 1, 0);
        // SAFETY: as above, with the larger buffer.
        unsafe { memprof_last_error(buf.as_mut_ptr().cast(), buf.len(), &mut needed) };
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Error::Native(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn check(status: i32) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// A vector of `n` default values, or an error if the memory cannot be had (the OOM
/// path calls the readers below when the process may be out of memory).
fn buffer<T: Default + Clone>(into: &mut Vec<T>, n: usize) -> Result<()> {
    into.clear();
    into.try_reserve_exact(n)
        .map_err(|e| Error::Native(format!("cannot allocate a buffer of {n} events: {e}")))?;
    into.resize(n, T::default());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// `VmRSS:` or `VmHWM:` of /proc/self/status, in bytes.
    fn status_field(key: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb * 1024
    }

    #[test]
    fn process_memory_agrees_with_proc_status_and_sees_touched_pages() {
        let (rss0, _) = process_memory().unwrap();
        let status_rss = status_field("VmRSS:");
        // Read a moment apart; the test harness's other threads may move a few pages.
        assert!(
            rss0.abs_diff(status_rss) < 4 << 20,
            "statm {rss0} vs VmRSS {status_rss}"
        );
        // 64 MiB written page by page become resident.
        let touched = std::hint::black_box(vec![1u8; 64 << 20]);
        // The harness's other tests run beside this one and may raise the peak between
        // two reads: the peak read lies between the status file's before and after.
        let hwm_before = status_field("VmHWM:");
        let (rss1, peak1) = process_memory().unwrap();
        let hwm_after = status_field("VmHWM:");
        assert!(rss1 >= rss0 + (60 << 20), "{rss0} -> {rss1} after 64 MiB");
        assert!(
            peak1 + (4 << 20) >= hwm_before && peak1 <= hwm_after + (4 << 20),
            "ru_maxrss {peak1} vs VmHWM {hwm_before} then {hwm_after}"
        );
        drop(touched);
        // SAFETY: both pointers null: the callee checks and writes nothing.
        assert_eq!(
            unsafe { process::memprof_process_memory(std::ptr::null_mut(), std::ptr::null_mut()) },
            -1
        );
    }

    #[test]
    fn a_null_out_pointer_is_an_error_with_a_message() {
        // SAFETY: the callee checks the pointer and writes nothing.
        let status = unsafe { session::memprof_state(std::ptr::null_mut()) };
        assert_eq!(status, -1);
        let msg = last_error().to_string();
        assert!(msg.contains("memprof_state: null pointer"), "{msg}");
    }

    #[test]
    fn unknown_name_ids_are_none() {
        assert_eq!(name(-5).unwrap(), None);
        let id = intern("tch-memprof-test-name").unwrap();
        assert_eq!(name(id).unwrap().as_deref(), Some("tch-memprof-test-name"));
        assert_eq!(intern("tch-memprof-test-name").unwrap(), id);
    }

    #[test]
    fn offsets_are_checked_at_compile_time() {
        // The generated checks cover every field; one spot check that they are real.
        assert_eq!(offset_of!(MpTlEvent, value), 24);
    }
}
