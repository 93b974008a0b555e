//! The CUDA caching allocator, explicitly: statistics, peak reset, emptying the cache.
//! The profiler itself never calls `reset_peak_stats` or `empty_cache` (it does not
//! change the run); these are for the user to call where they choose. They answer as
//! PyTorch's own calls do: before the first CUDA tensor, every statistic is zero and
//! resetting or emptying does nothing (`torch.cuda.memory_stats()` answers with zeros
//! there). Without CUDA (no driver, a CPU-only libtorch) every function returns an
//! error that says why, and a device index beyond the machine's devices is refused by
//! name, never a crash.

use crate::error::Result;
use crate::ffi;

pub use crate::ffi::cuda::{BlasWorkspace, BlasWorkspaceKind, CudaStats};

/// Whether CUDA is usable by the profiler, and if not, why (no driver, a CPU-only
/// libtorch, ...). Before the first CUDA tensor it is usable (the statistics are zero).
pub fn status() -> std::result::Result<(), String> {
    ffi::cuda_stats(0).map(|_| ()).map_err(|e| e.to_string())
}

/// The caching allocator's statistics of `cuda:index` (aggregate pool): allocated,
/// reserved, active and requested bytes, current and peak; allocation retries; OOMs;
/// free and total device memory.
/// Zero everywhere before the first CUDA tensor (free and total device memory too:
/// asking the driver would create a CUDA context).
pub fn stats(index: usize) -> Result<CudaStats> {
    check_index(index)?;
    ffi::cuda_stats(index)
}

/// An index beyond the machine's CUDA devices, refused in one line (libtorch would
/// throw with its C++ frames).
fn check_index(index: usize) -> Result<()> {
    let n = tch::Cuda::device_count().max(0) as usize;
    if tch::Cuda::is_available() && index >= n {
        return Err(crate::error::Error::InvalidInput {
            name: "CUDA device",
            value: format!("cuda:{index}"),
            reason: format!(
                "this machine has {n} CUDA device(s): cuda:0 to cuda:{}",
                n - 1
            ),
        });
    }
    Ok(())
}

/// Resets the peak counters of `cuda:index` (what `torch.cuda.reset_peak_memory_stats`
/// does): the next peaks start from the current values.
pub fn reset_peak_stats(index: usize) -> Result<()> {
    check_index(index)?;
    ffi::cuda_reset_peaks(index)
}

/// Returns the caching allocator's unused cached blocks to the driver (what
/// `torch.cuda.empty_cache` does). Reserved memory drops; allocated does not change.
pub fn empty_cache() -> Result<()> {
    ffi::cuda_empty_cache()
}

/// Releases the cuBLAS and cuBLASLt workspaces PyTorch keeps per thread and stream
/// (what `torch._C._cuda_clearCublasWorkspaces()` does; they are taken again at the next
/// matrix product). They go back to the caching allocator: allocated drops by their
/// size, and an [`empty_cache`] after returns them to the driver. For measuring one
/// model after another in one process from a clean allocator.
pub fn clear_cublas_workspaces() -> Result<()> {
    ffi::cuda_clear_workspaces()
}

/// The cuBLAS and cuBLASLt workspaces PyTorch holds now, on every device (none before
/// the first matrix product). Read from PyTorch's own table of them; an error without
/// CUDA, or where the libtorch is not one whose table this build knows (2.11 and 2.13).
pub fn blas_workspaces() -> Result<Vec<BlasWorkspace>> {
    ffi::cuda_workspaces()
}

/// Statistics of every CUDA device whose allocator holds memory, with its index.
pub fn devices_in_use() -> Vec<(usize, CudaStats)> {
    let n = tch::Cuda::device_count().max(0) as usize;
    (0..n)
        .filter_map(|i| stats(i).ok().map(|s| (i, s)))
        .filter(|(_, s)| s.reserved_current > 0)
        .collect()
}
