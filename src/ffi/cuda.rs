//! The CUDA caching allocator: statistics, history, snapshots, control (`cuda.cpp`).

use std::ffi::c_char;

use super::{check, native};
use crate::error::{Error, Result};

extern "C" {
    fn memprof_cuda_stats(index: i32, out: *mut CudaStats) -> i32;
    fn memprof_cuda_history(on: i32, max_entries: i64) -> i32;
    fn memprof_cuda_snapshot(path: *const c_char) -> i32;
    fn memprof_cuda_control(index: i32, what: i32) -> i32;
    fn memprof_cuda_workspaces(out: *mut Workspace, cap: i32) -> i32;
}

/// `MpWorkspace`: a cuBLAS or cuBLASLt workspace PyTorch holds.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Workspace {
    pub ptr: u64,
    pub bytes: i64,
    pub device: i32,
    /// `native::WORKSPACE_CUBLAS` or `native::WORKSPACE_CUBLASLT`.
    pub kind: i32,
    /// 1 where the session saw the block born (its bytes are in the session's counters).
    pub tracked: i32,
    pub pad: i32,
}

/// CUDA: the cuBLAS and cuBLASLt workspaces PyTorch holds now (none before the first
/// matrix product); an error without CUDA or for a libtorch whose table is not known.
pub(crate) fn cuda_workspaces() -> Result<Vec<Workspace>> {
    let mut out = vec![Workspace::default(); 8];
    loop {
        let cap = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: `out` has room for `cap` Workspace values with the C layout.
        let n = unsafe { memprof_cuda_workspaces(out.as_mut_ptr(), cap) };
        // A count, or -1 with the error set.
        check(n.min(0))?;
        let n = n as usize;
        if n <= out.len() {
            out.truncate(n);
            return Ok(out);
        }
        out.resize(n, Workspace::default());
    }
}

/// `MpCudaStats`: the C mirror of the public `CudaStats` (field for field), private
/// so that a change of the ABI is not a change of the public API.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CudaStats {
    pub allocated_current: i64,
    pub allocated_peak: i64,
    pub reserved_current: i64,
    pub reserved_peak: i64,
    pub active_current: i64,
    pub active_peak: i64,
    pub requested_current: i64,
    pub requested_peak: i64,
    pub alloc_retries: i64,
    pub ooms: i64,
    pub free_bytes: i64,
    pub total_bytes: i64,
}

/// CUDA allocator statistics of `cuda:index`; an error (never a crash) without CUDA.
pub(crate) fn cuda_stats(index: usize) -> Result<CudaStats> {
    let mut s = CudaStats::default();
    // SAFETY: `s` is a valid, writable CudaStats with the C layout.
    check(unsafe { memprof_cuda_stats(index as i32, &mut s) })?;
    Ok(s)
}

/// CUDA: starts or stops the caching allocator's own history.
pub(crate) fn cuda_history(on: bool, max_entries: u64) -> Result<()> {
    let n = i64::try_from(max_entries).unwrap_or(i64::MAX);
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_history(on as i32, n) })
}

/// CUDA: writes the caching allocator's snapshot to `path`.
pub(crate) fn cuda_snapshot(path: &std::path::Path) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().to_string_lossy().as_bytes())
        .map_err(|e| Error::Native(e.to_string()))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    check(unsafe { memprof_cuda_snapshot(c.as_ptr()) })
}

/// CUDA: resets the peak statistics of `cuda:index`.
pub(crate) fn cuda_reset_peaks(index: usize) -> Result<()> {
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_control(index as i32, native::CUDA_RESET_PEAKS) })
}

/// CUDA: releases the caching allocator's unused cached blocks.
pub(crate) fn cuda_empty_cache() -> Result<()> {
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_control(0, native::CUDA_EMPTY_CACHE) })
}

/// CUDA: releases the cuBLAS and cuBLASLt workspaces into the caching allocator.
pub(crate) fn cuda_clear_workspaces() -> Result<()> {
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_control(0, native::CUDA_CLEAR_WORKSPACES) })
}
