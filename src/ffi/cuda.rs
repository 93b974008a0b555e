//! The CUDA caching allocator: statistics, history, snapshots, control (`cuda.cpp`).

use std::ffi::c_char;

use super::{check, native};
use crate::error::{Error, Result};

extern "C" {
    fn memprof_cuda_stats(index: i32, out: *mut MpCudaStats) -> i32;
    fn memprof_cuda_memory_info(index: i32, free_bytes: *mut i64, total_bytes: *mut i64) -> i32;
    fn memprof_cuda_history(on: i32, max_entries: i64) -> i32;
    fn memprof_cuda_snapshot(path: *const c_char) -> i32;
    fn memprof_cuda_control(index: i32, what: i32) -> i32;
    fn memprof_cuda_workspaces(out: *mut MpWorkspace, cap: i32) -> i32;
}

/// `MpWorkspace`: the native layout of a [`BlasWorkspace`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MpWorkspace {
    pub(super) ptr: u64,
    pub(super) bytes: i64,
    pub(super) device: i32,
    /// `native::WORKSPACE_CUBLAS` or `native::WORKSPACE_CUBLASLT`.
    pub(super) kind: i32,
    /// 1 where the session saw the block born (its bytes are in the session's counters).
    pub(super) tracked: i32,
    pub(super) pad: i32,
}

/// Which library a [`BlasWorkspace`] is kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlasWorkspaceKind {
    /// cuBLAS (`CUBLAS_WORKSPACE_CONFIG`; 32 MiB on Hopper by PyTorch's default).
    Cublas,
    /// cuBLASLt (`CUBLASLT_WORKSPACE_SIZE`, in KiB).
    Cublaslt,
}

/// A workspace PyTorch keeps for cuBLAS or cuBLASLt: one per library handle and stream
/// (so one for the training thread and one for the autograd engine's thread of each
/// device), taken at the first matrix product there and held until
/// [`clear_cublas_workspaces`](crate::cuda::clear_cublas_workspaces). A block of the
/// caching allocator that no tensor owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlasWorkspace {
    /// The block's address.
    pub address: u64,
    /// The block's bytes as the allocator counts them (the workspace size rounded up to
    /// its 512-byte blocks).
    pub bytes: u64,
    /// CUDA device index.
    pub device: usize,
    /// cuBLAS or cuBLASLt.
    pub kind: BlasWorkspaceKind,
    /// Whether a running profiler saw its block born (its bytes are then in the
    /// profiler's counters).
    pub seen_born: bool,
}

impl From<&MpWorkspace> for BlasWorkspace {
    fn from(w: &MpWorkspace) -> Self {
        BlasWorkspace {
            address: w.ptr,
            bytes: w.bytes.max(0) as u64,
            device: w.device.max(0) as usize,
            kind: if w.kind == native::WORKSPACE_CUBLASLT {
                BlasWorkspaceKind::Cublaslt
            } else {
                BlasWorkspaceKind::Cublas
            },
            seen_born: w.tracked != 0,
        }
    }
}

/// CUDA: the cuBLAS and cuBLASLt workspaces PyTorch holds now (none before the first
/// matrix product); an error without CUDA or for a libtorch whose table is not known.
pub(crate) fn cuda_workspaces() -> Result<Vec<BlasWorkspace>> {
    let mut out = vec![MpWorkspace::default(); 8];
    loop {
        let cap = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: `out` has room for `cap` MpWorkspace values with the C layout.
        let n = unsafe { memprof_cuda_workspaces(out.as_mut_ptr(), cap) };
        // A count, or -1 with the error set.
        check(n.min(0))?;
        let n = n as usize;
        if n <= out.len() {
            out.truncate(n);
            return Ok(out.iter().map(BlasWorkspace::from).collect());
        }
        out.resize(n, MpWorkspace::default());
    }
}

/// `MpCudaStats`: the native layout of [`CudaStats`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MpCudaStats {
    pub(super) allocated_current: i64,
    pub(super) allocated_peak: i64,
    pub(super) reserved_current: i64,
    pub(super) reserved_peak: i64,
    pub(super) active_current: i64,
    pub(super) active_peak: i64,
    pub(super) requested_current: i64,
    pub(super) requested_peak: i64,
    pub(super) alloc_retries: i64,
    pub(super) ooms: i64,
    pub(super) free_bytes: i64,
    pub(super) total_bytes: i64,
}

/// CUDA caching-allocator statistics of one device (aggregate pool).
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
    /// Free device memory as the driver reports it: asked now by [`crate::cuda::stats`];
    /// in the profiler's reports, read when the reserved bytes changed or at most a
    /// second before. 0 where the device's allocator holds and held no memory (asking
    /// would create a CUDA context there).
    pub free_bytes: i64,
    /// Total device memory (0 where `free_bytes` is).
    pub total_bytes: i64,
}

impl From<&MpCudaStats> for CudaStats {
    fn from(s: &MpCudaStats) -> Self {
        CudaStats {
            allocated_current: s.allocated_current,
            allocated_peak: s.allocated_peak,
            reserved_current: s.reserved_current,
            reserved_peak: s.reserved_peak,
            active_current: s.active_current,
            active_peak: s.active_peak,
            requested_current: s.requested_current,
            requested_peak: s.requested_peak,
            alloc_retries: s.alloc_retries,
            ooms: s.ooms,
            free_bytes: s.free_bytes,
            total_bytes: s.total_bytes,
        }
    }
}

/// CUDA allocator statistics of `cuda:index`, free and total memory left 0 (the
/// driver's: [`cuda_memory_info`]); an error (never a crash) without CUDA.
pub(crate) fn cuda_stats(index: usize) -> Result<CudaStats> {
    let mut s = MpCudaStats::default();
    // SAFETY: `s` is a valid, writable MpCudaStats with the C layout.
    check(unsafe { memprof_cuda_stats(index as i32, &mut s) })?;
    Ok(CudaStats::from(&s))
}

/// The driver's free and total memory of `cuda:index` (0 and 0 before the first CUDA
/// tensor). A driver call; on a device without a CUDA context it creates one.
pub(crate) fn cuda_memory_info(index: usize) -> Result<(i64, i64)> {
    let (mut free, mut total) = (0i64, 0i64);
    // SAFETY: both pointers are valid, writable i64s.
    check(unsafe { memprof_cuda_memory_info(index as i32, &mut free, &mut total) })?;
    Ok((free, total))
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
