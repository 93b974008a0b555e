//! The numbers of a report, as plain values users can inspect in their own code.

use std::sync::Arc;

use crate::cuda::CudaStats;

/// Whether a VarStore variable is a trainable parameter or a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VariableKind {
    /// A trainable parameter (it gets a gradient).
    Weight,
    /// A non-trainable variable, such as batch-norm running statistics.
    Buffer,
}

impl VariableKind {
    /// `"weight"` or `"buffer"`, as in the CSV files.
    pub fn as_str(self) -> &'static str {
        match self {
            VariableKind::Weight => "weight",
            VariableKind::Buffer => "buffer",
        }
    }
}

/// One VarStore variable at a report.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct VariableStats {
    /// Its VarStore path, such as `layer1.0.conv1.weight`.
    pub name: String,
    /// Parameter or buffer.
    pub kind: VariableKind,
    /// Element type, such as `Float`.
    pub dtype: String,
    /// Shape, such as `[64, 3, 7, 7]`.
    pub shape: Vec<i64>,
    /// Bytes of the allocation behind it (on CUDA, the allocator's rounded block).
    pub bytes: u64,
    /// Bytes of the allocation behind its `.grad`, if it has one.
    pub grad_bytes: Option<u64>,
}

/// The variables of a report, by name: a slice (`len`, `iter`, indexing, `for v in
/// &stats.variables`) shared between the reports it stays the same for, so keeping or
/// cloning [`IterationStats`] copies no variable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VariableList(Arc<[VariableStats]>);

impl std::ops::Deref for VariableList {
    type Target = [VariableStats];
    fn deref(&self) -> &[VariableStats] {
        &self.0
    }
}

impl VariableList {
    /// The same shared list (kept by the profiler while no variable changed): equal
    /// without comparing a variable.
    pub(crate) fn same_list(&self, other: &VariableList) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<'a> IntoIterator for &'a VariableList {
    type Item = &'a VariableStats;
    type IntoIter = std::slice::Iter<'a, VariableStats>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<VariableStats> for VariableList {
    fn from_iter<I: IntoIterator<Item = VariableStats>>(iter: I) -> Self {
        VariableList(iter.into_iter().collect())
    }
}

impl From<Vec<VariableStats>> for VariableList {
    fn from(v: Vec<VariableStats>) -> Self {
        VariableList(v.into())
    }
}

/// Memory of one iteration: the span between two `record_stats` calls.
///
/// Current figures (allocated, weights, gradients, optimizer state, other) are taken
/// when `record_stats` runs, after the optimizer step; `allocated = weights +
/// gradients + optimizer state + other`. Feature maps and intermediate gradients are
/// measured at their own moment inside the iteration (see each field).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct IterationStats {
    /// Epoch, from 1 (incremented by `epoch_end`).
    pub epoch: u64,
    /// Iteration within the epoch, from 1.
    pub iteration: u64,
    /// Iteration since the profiler was built, from 1.
    pub step: u64,
    /// The VarStore's device: `cpu` or `cuda:N`.
    pub device: String,
    /// Bytes allocated to tensors now. CPU: every live block of libtorch's CPU
    /// allocator in the process; CUDA: the caching allocator's allocated bytes.
    pub allocated_bytes: u64,
    /// Peak of allocated bytes during the iteration.
    pub peak_allocated_bytes: u64,
    /// CUDA: bytes reserved (cached) by the caching allocator. CPU: the process's
    /// resident memory (RSS), as reserved has no meaning there.
    pub reserved_bytes: u64,
    /// CUDA: peak reserved during the iteration. CPU: the process's peak resident
    /// memory since it started (VmHWM).
    pub peak_reserved_bytes: u64,
    /// Bytes of every VarStore variable: trainable parameters and buffers.
    pub weights_bytes: u64,
    /// The buffers among `weights_bytes`.
    pub buffers_bytes: u64,
    /// Every variable's defined `.grad`.
    pub gradients_bytes: u64,
    /// Bytes allocated in this iteration before its backward pass that were still live
    /// when backward started: the input batch and what the forward pass keeps for
    /// backward. The largest over backward passes; 0 if backward did not run.
    pub feature_maps_bytes: u64,
    /// Peak during backward of live bytes allocated by backward that are not weight
    /// gradients (activation gradients, fresh gradients waiting to be accumulated).
    pub intermediate_gradients_bytes: u64,
    /// False when the backward event log overflowed (more than a million allocations in
    /// one backward pass): `intermediate_gradients_bytes` is then a lower bound.
    pub intermediate_gradients_exact: bool,
    /// Bytes allocated during optimizer steps that are still live (Adam: two tensors
    /// per parameter).
    pub optimizer_state_bytes: u64,
    /// CUDA: the cuBLAS and cuBLASLt workspaces PyTorch keeps on the profiled device
    /// ([`crate::cuda::blas_workspaces`]: 32 MiB each on Hopper, one for the training
    /// thread and one for the autograd engine's), live until
    /// [`crate::cuda::clear_cublas_workspaces`]. 0 on the CPU, and where the libtorch's
    /// table of them cannot be read (they are in `other_bytes` then).
    pub blas_workspaces_bytes: u64,
    /// Everything else live now: user tensors, data kept across iterations; on CUDA,
    /// also the blocks libraries take that no tensor owns and that are not named
    /// above (cuDNN's workspaces while a convolution runs, NCCL's buffers).
    pub other_bytes: u64,
    /// Backward passes seen in this iteration.
    pub backward_passes: u64,
    /// Every variable, in VarStore order of names. Shared between the iterations it
    /// stays the same for (built again only when a variable or a gradient block
    /// changed), so keeping or cloning stats costs no copy.
    pub variables: VariableList,
    /// CUDA caching-allocator statistics of the profiled device, on CUDA runs.
    pub cuda: Option<CudaStats>,
    /// CUDA runs: the statistics of every CUDA device whose allocator holds memory
    /// (index, statistics), the profiled one included.
    pub cuda_devices: Vec<(usize, CudaStats)>,
}

/// Summary of one epoch, as printed by `epoch_end`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EpochStats {
    /// Epoch, from 1.
    pub epoch: u64,
    /// Iterations recorded in the epoch.
    pub iterations: u64,
    /// Peak allocated bytes over the epoch.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes over the epoch (CPU: peak resident memory of the process).
    pub peak_reserved_bytes: u64,
    /// Largest feature maps of an iteration in the epoch.
    pub peak_feature_maps_bytes: u64,
    /// Largest intermediate gradients of an iteration in the epoch.
    pub peak_intermediate_gradients_bytes: u64,
    /// Allocated bytes when the epoch ended.
    pub allocated_bytes: u64,
    /// Change of allocated bytes since the previous epoch's end (since the profiler was
    /// built, for the first epoch).
    pub allocated_change_bytes: i64,
}

/// The run's numbers so far, from [`MemoryProfiler::stats`](crate::MemoryProfiler::stats).
///
/// New fields may be added in minor versions; the meaning of existing ones does not
/// change.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RunStats {
    /// The numbers of the last `record_stats` call, reported or not.
    pub last: Option<IterationStats>,
    /// `record_stats` calls so far.
    pub steps: u64,
    /// `epoch_end` calls so far.
    pub epochs_ended: u64,
    /// Highest peak allocated bytes of any iteration.
    pub peak_allocated_bytes: u64,
    /// Highest peak reserved bytes of any iteration (CPU: the process's peak resident
    /// memory).
    pub peak_reserved_bytes: u64,
    /// Largest feature maps of any iteration.
    pub peak_feature_maps_bytes: u64,
    /// Largest intermediate gradients of any iteration.
    pub peak_intermediate_gradients_bytes: u64,
    /// What the leak hunt found at the last `epoch_end`, if anything.
    pub leaks: Option<crate::leaks::LeakReport>,
    /// Bytes the profiler itself holds: its buffers, and the native registry, logs and
    /// leak hunting's learned op layers as far as they were used. Bounded: it depends
    /// on the most blocks live at once and the most events and ops in one iteration,
    /// not on the number of iterations. (The
    /// epoch summaries of `epochs()`, one small record per `epoch_end`, come on top.)
    pub profiler_memory_bytes: u64,
}
