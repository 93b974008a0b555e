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
    pub(super) ptr: u64,
    pub(super) bytes: i64,
    pub(super) device: i32,
    /// `native::WORKSPACE_CUBLAS` or `native::WORKSPACE_CUBLASLT`.
    pub(super) kind: i32,
    /// 1 where the session saw the block born (its bytes are in the session's counters).
    pub(super) tracked: i32,
    pub(super) pad: i32,
}

impl Workspace {
    /// The workspace's block.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
    pub(crate) fn bytes(&self) -> i64 {
        self.bytes
    }
    /// A cuBLASLt workspace (else cuBLAS).
    pub(crate) fn is_cublaslt(&self) -> bool {
        self.kind == native::WORKSPACE_CUBLASLT
    }
    /// Its CUDA device index.
    pub(crate) fn device(&self) -> usize {
        self.device.max(0) as usize
    }
    /// Whether the session saw its block born (its bytes are in the session's counters).
    pub(crate) fn is_tracked(&self) -> bool {
        self.tracked != 0
    }
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

/// CUDA caching-allocator statistics of one device (aggregate pool). Laid out as the
/// native layer writes them (`repr(C)`, `MpCudaStats`: the layout checks hold it to the
/// header), so they are read as they are, without a copy of each field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaStats {
    /// Bytes in blocks handed to tensors now.
    pub allocated_current: i64,
    /// Peak of `allocated_current` since the allocator's last peak reset.
    pub allocated_peak: i64,
    /// Bytes the allocator holds from the driver (allocated plus cached).
    pub reserved_current: i64,
    /// Peak of `reserved_current`.
    pub reserved_peak: i64,
    /// Bytes in active blocks (allocated, or freed but still used by a stream).
    pub active_current: i64,
    /// Peak of `active_current`.
    pub active_peak: i64,
    /// Bytes tensors asked for (before rounding to blocks).
    pub requested_current: i64,
    /// Peak of `requested_current`.
    pub requested_peak: i64,
    /// Allocations that failed once and succeeded after freeing cached blocks.
    pub alloc_retries: i64,
    /// Out-of-memory errors raised by the allocator.
    pub ooms: i64,
    /// Free device memory as the driver reports it.
    pub free_bytes: i64,
    /// Total device memory.
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
