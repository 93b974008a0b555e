//! What a history captured without a GPU (`scripts/eager_capture.py`) adds to the replay:
//! the GPU its cuBLAS workspaces and kernels' buffers are sized for, each reduction's
//! buffers from the dry run's rule, and the replay's events a captured event becomes.

use super::{Action, Recording};
use crate::events::{Event, EventKind, TransientSize};
use crate::phase::Phase;

impl Recording {
    /// Whether the history was captured without a GPU (it has [`Action::Workspace`] or
    /// [`Action::Reduce`] events): its own peaks have no segment and no kernel's own
    /// block; the replay's do.
    pub fn captured(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e.action, Action::Workspace { .. } | Action::Reduce { .. }))
    }

    /// The GPU whose cuBLAS workspaces and reduction buffers the replay gives a captured
    /// history's [`Action::Workspace`] and [`Action::Reduce`] events: [`Recording::gpu`],
    /// or where it is not named the larger plausible sizes (Hopper's workspace; the most
    /// multiprocessors of a GPU [`Gpu::named`](crate::estimate::Gpu::named) knows, which
    /// split a reduction into the most parts).
    pub fn workspace_gpu(&self) -> crate::estimate::Gpu {
        self.gpu.clone().unwrap_or_else(|| {
            let mut gpu = crate::estimate::Gpu::generic();
            gpu.name = "a GPU not named (the larger workspaces)".to_string();
            gpu.cublas_workspace = gpu
                .cublas_workspace
                .max(crate::estimate::gpu::CUBLAS_WORKSPACE_SM90);
            gpu.multiprocessors = gpu
                .multiprocessors
                .max(crate::estimate::gpu::most_multiprocessors());
            gpu.threads_per_multiprocessor = gpu.threads_per_multiprocessor.max(2048);
            gpu
        })
    }

    /// Each reduction's buffers on the replay's GPU ([`Recording::workspace_gpu`]), in the
    /// order taken; none where the native rule cannot size it (checked as the file was
    /// read).
    pub(super) fn reduction_buffers(&self) -> Vec<Vec<u64>> {
        let gpu = self.workspace_gpu();
        self.reductions
            .iter()
            .map(|r| {
                crate::ffi::reduction_buffers(
                    r,
                    gpu.multiprocessors,
                    gpu.threads_per_multiprocessor,
                )
                .unwrap_or_default()
            })
            .collect()
    }
}

/// What one event of a history becomes in the replay: at most one event, or a
/// reduction's buffers (each taken and freed at once, at the history's index `usize`).
pub(super) enum Expanded {
    One(Option<(usize, Event)>),
    Many(usize, std::vec::IntoIter<u64>, u64),
}

impl Iterator for Expanded {
    type Item = (usize, Event);

    fn next(&mut self) -> Option<(usize, Event)> {
        match self {
            Expanded::One(event) => event.take(),
            Expanded::Many(i, sizes, ptr) => sizes.next().map(|bytes| {
                let e = Event {
                    kind: EventKind::Transient {
                        size: TransientSize::Exact,
                    },
                    phase: Phase::Forward,
                    device: 0,
                    generation: 1,
                    op: -1,
                    aux: 0,
                    ptr: *ptr,
                    value: bytes.min(i64::MAX as u64) as i64,
                };
                (*i, e)
            }),
        }
    }
}
