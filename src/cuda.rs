//! The CUDA caching allocator, explicitly: statistics, peak reset, emptying the cache.
//! The profiler itself never calls `reset_peak_stats` or `empty_cache` (it does not
//! change the run); these are for the user to call where they choose. They answer as
//! PyTorch's own calls do: before the first CUDA tensor, every statistic is zero and
//! resetting or emptying does nothing (`torch.cuda.memory_stats()` answers with zeros
//! there). Without CUDA (no driver, a CPU-only libtorch) every function returns an
//! error that says why, and a device index beyond the machine's devices is refused by
//! name, never a crash.

use std::time::{Duration, Instant};

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
/// free and total device memory, asked of the driver now.
/// Zero everywhere before the first CUDA tensor. Free and total device memory are zero
/// too where the device's allocator holds no memory and has held none since its peaks
/// were last reset: asking the driver would create a CUDA context on that device
/// (hundreds of MiB of it), which a process training on another GPU must not do.
pub fn stats(index: usize) -> Result<CudaStats> {
    check_index(index)?;
    let mut s = ffi::cuda_stats(index)?;
    if has_context(&s) {
        (s.free_bytes, s.total_bytes) = ffi::cuda_memory_info(index)?;
    }
    Ok(s)
}

/// Whether the device's allocator holds memory or has held some (its reserved peak):
/// it took that memory from the driver, so the device has a CUDA context, and asking
/// the driver about it creates none.
fn has_context(s: &CudaStats) -> bool {
    s.reserved_current > 0 || s.reserved_peak > 0
}

/// [`stats`] without the driver's free and total memory (left 0): the allocator's own
/// counters only, no driver call.
pub(crate) fn allocator_stats(index: usize) -> Result<CudaStats> {
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

/// Statistics of every CUDA device whose allocator holds memory, with its index (the
/// driver asked for the free and total memory of those only: see [`stats`]).
pub fn devices_in_use() -> Vec<(usize, CudaStats)> {
    DeviceMemory::default().devices_in_use()
}

/// How long the driver's free and total memory of a device are taken as read (unless
/// the device's reserved bytes changed since): what [`DeviceMemory`] gives each
/// `record_stats`.
pub(crate) const MEMORY_INFO_MAX_AGE: Duration = Duration::from_secs(1);

/// The profiler's reads of the CUDA devices' statistics at each `record_stats`. The
/// allocator's counters are read every time (a copy under the allocator's lock); the
/// driver's free and total memory (`cudaMemGetInfo` behind a switch to the device: a
/// driver call, which every step need not make) only when the device's
/// reserved bytes changed since the last read or [`MEMORY_INFO_MAX_AGE`] passed, and
/// never for a device whose allocator holds nothing and held nothing (the call would
/// create a CUDA context there).
#[derive(Debug, Default)]
pub(crate) struct DeviceMemory {
    /// By device index: the last read of the driver's memory, with the reserved bytes
    /// and the time it was read at.
    reads: Vec<Option<MemoryRead>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct MemoryRead {
    reserved: i64,
    at: Instant,
    free: i64,
    total: i64,
}

impl DeviceMemory {
    /// `cuda:index`'s statistics, its free and total memory as of the last read that
    /// still holds.
    pub(crate) fn stats(&mut self, index: usize) -> Result<CudaStats> {
        let mut s = ffi::cuda_stats(index)?;
        self.fill(index, &mut s, Instant::now(), ffi::cuda_memory_info);
        Ok(s)
    }

    /// [`devices_in_use`], through the reads this keeps.
    pub(crate) fn devices_in_use(&mut self) -> Vec<(usize, CudaStats)> {
        let n = tch::Cuda::device_count().max(0) as usize;
        (0..n)
            .filter_map(|i| self.stats(i).ok().map(|s| (i, s)))
            .filter(|(_, s)| s.reserved_current > 0)
            .collect()
    }

    /// Puts `index`'s free and total memory into `s`: the last read where it holds (the
    /// same reserved bytes, younger than [`MEMORY_INFO_MAX_AGE`] at `now`), else what
    /// `ask` reads now; zeros where the allocator holds and held nothing, or where `ask`
    /// fails (asked again next time).
    fn fill(
        &mut self,
        index: usize,
        s: &mut CudaStats,
        now: Instant,
        ask: impl FnOnce(usize) -> Result<(i64, i64)>,
    ) {
        (s.free_bytes, s.total_bytes) = (0, 0);
        if self.reads.len() <= index {
            self.reads.resize(index + 1, None);
        }
        if !has_context(s) {
            self.reads[index] = None;
            return;
        }
        let holds = |r: &MemoryRead| {
            r.reserved == s.reserved_current
                && now.saturating_duration_since(r.at) < MEMORY_INFO_MAX_AGE
        };
        if !self.reads[index].as_ref().is_some_and(holds) {
            self.reads[index] = ask(index).ok().map(|(free, total)| MemoryRead {
                reserved: s.reserved_current,
                at: now,
                free,
                total,
            });
        }
        if let Some(r) = self.reads[index] {
            (s.free_bytes, s.total_bytes) = (r.free, r.total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statistics of `bytes` reserved, the peak `bytes` too but for a device emptied
    /// (`bytes` 0 after a peak of 1 MiB: `EMPTIED`).
    fn reserved(bytes: i64) -> CudaStats {
        CudaStats {
            reserved_current: bytes.max(0),
            reserved_peak: if bytes == EMPTIED { 1 << 20 } else { bytes },
            ..CudaStats::default()
        }
    }
    const EMPTIED: i64 = -1;

    /// The driver is asked at the first read, again when the reserved bytes change or
    /// the read is a second old, and never for a device whose allocator holds and held
    /// nothing; a device emptied to 0 reserved is still asked; a failed read gives zeros
    /// and is asked again.
    #[test]
    fn the_driver_is_asked_when_reserved_changes_or_a_second_passed() {
        let mut m = DeviceMemory::default();
        let t0 = Instant::now();
        let mut asked = Vec::new();
        let mut read = |m: &mut DeviceMemory, index: usize, r: i64, at: Duration, free: i64| {
            let mut s = reserved(r);
            m.fill(index, &mut s, t0 + at, |i| {
                asked.push((i, at));
                if free < 0 {
                    Err(crate::error::Error::Run("no driver".into()))
                } else {
                    Ok((free, 80 << 30))
                }
            });
            (s.free_bytes, s.total_bytes)
        };
        let ms = Duration::from_millis;
        // A device whose allocator holds nothing: not asked, zeros.
        assert_eq!(read(&mut m, 1, 0, ms(0), 5), (0, 0));
        // cuda:0 read once, then taken as read while its reserved stays and under 1 s.
        assert_eq!(
            read(&mut m, 0, 2 << 20, ms(0), 70 << 30),
            (70 << 30, 80 << 30)
        );
        assert_eq!(read(&mut m, 0, 2 << 20, ms(999), 1), (70 << 30, 80 << 30));
        // Reserved changed: asked now.
        assert_eq!(
            read(&mut m, 0, 4 << 20, ms(1000), 69 << 30),
            (69 << 30, 80 << 30)
        );
        assert_eq!(read(&mut m, 0, 4 << 20, ms(1500), 1), (69 << 30, 80 << 30));
        // A second after the last read: asked again, though reserved stayed.
        assert_eq!(
            read(&mut m, 0, 4 << 20, ms(2000), 68 << 30),
            (68 << 30, 80 << 30)
        );
        // A read that fails: zeros, and the next one asks again.
        assert_eq!(read(&mut m, 2, 1 << 20, ms(2000), -1), (0, 0));
        assert_eq!(read(&mut m, 2, 1 << 20, ms(2001), 7), (7, 80 << 30));
        // Its allocator emptied (its context stays): asked, reserved having changed;
        // then holding memory again, asked again.
        assert_eq!(read(&mut m, 2, EMPTIED, ms(2002), 9), (9, 80 << 30));
        assert_eq!(read(&mut m, 2, 1 << 20, ms(2003), 8), (8, 80 << 30));
        // Statistics of nothing held ever (peaks reset too): zeros, not asked, and the
        // last read forgotten.
        assert_eq!(read(&mut m, 2, 0, ms(2004), 6), (0, 0));
        assert_eq!(read(&mut m, 2, 1 << 20, ms(2005), 5), (5, 80 << 30));
        assert_eq!(
            asked,
            [
                (0, ms(0)),
                (0, ms(1000)),
                (0, ms(2000)),
                (2, ms(2000)),
                (2, ms(2001)),
                (2, ms(2002)),
                (2, ms(2003)),
                (2, ms(2005)),
            ]
        );
    }
}
