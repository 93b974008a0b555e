//! The replay of a meta trace through the caching-allocator model, with the cuBLAS and
//! cuBLASLt workspaces.

use std::time::Duration;

use super::allocator::CachingAllocator;
use super::{gpu, Estimate, Mode, Options, NOT_MODELLED};
use crate::error::Result;
use crate::ffi::{self, native, MetaEvent};
use crate::phase::Phase;

/// Ids of the cuBLAS workspaces in the replay (meta block ids start at 1 and stay far
/// below).
const WORKSPACE_ID: u64 = u64::MAX - 16;

/// Replays the weights' and the run's meta traces through the caching allocator model.
pub(super) fn replay(
    weights: &[MetaEvent],
    run: &[MetaEvent],
    options: &Options,
) -> Result<Estimate> {
    Ok(replay_at(weights, run, options)?.0)
}

/// [`replay`], with the index in `run` of the event that reached the peak allocated
/// (`run.len()` when the weights alone reach it).
pub(super) fn replay_at(
    weights: &[MetaEvent],
    run: &[MetaEvent],
    options: &Options,
) -> Result<(Estimate, usize)> {
    let mut alloc = CachingAllocator::new(options.allocator.clone());
    for e in weights {
        match e.kind {
            native::META_ALLOC => {
                alloc.malloc(e.id, e.bytes as u64);
            }
            native::META_FREE => alloc.free(e.id),
            _ => {}
        }
    }
    let mut baseline = alloc.stats().allocated;
    let mut phase = Phase::Forward;
    let mut step = 0u32;
    let mut op: i32 = -1;
    let mut layer: i32 = -1;
    let mut workspaces = [false; 4]; // cuBLAS: user, autograd thread; cuBLASLt: same
    let mut peak = alloc.stats().allocated;
    let mut peak_op = -1;
    let mut peak_layer = -1;
    let mut peak_phase = Phase::Forward;
    let mut peak_step = 1;
    let mut peak_at = run.len();
    let mut allocations = 0u64;
    let mut flops = 0u64;
    for (i, e) in run.iter().enumerate() {
        match e.kind {
            native::META_ALLOC => {
                allocations += 1;
                alloc.malloc(e.id, e.bytes as u64);
            }
            native::META_BLAS | native::META_BLASLT => {
                // The autograd engine's CUDA thread runs backward with a handle (and
                // workspaces) of its own. A cuBLASLt call gets its handle through the
                // cuBLAS one, so it takes the cuBLAS workspace first, then its own.
                let thread = usize::from(phase == Phase::Backward);
                let mut wants = vec![(thread, options.gpu.cublas_workspace)];
                if e.kind == native::META_BLASLT {
                    wants.push((2 + thread, gpu::CUBLASLT_WORKSPACE));
                }
                for (slot, size) in wants {
                    if !workspaces[slot] && size > 0 {
                        workspaces[slot] = true;
                        alloc.malloc(WORKSPACE_ID + slot as u64, size);
                    }
                }
            }
            native::META_FREE => alloc.free(e.id),
            native::META_FLOPS => flops += e.bytes.max(0) as u64,
            native::META_OP => {
                op = e.name;
                layer = e.layer;
            }
            native::META_MARK => match e.mark {
                native::MARK_BASELINE => baseline = alloc.stats().allocated,
                native::MARK_FORWARD => {
                    // A step's micro-batches (gradient accumulation) are one step.
                    if step == 0 || phase == Phase::Optimizer {
                        step += 1;
                    }
                    phase = Phase::Forward;
                }
                native::MARK_BACKWARD => phase = Phase::Backward,
                native::MARK_OPTIMIZER => phase = Phase::Optimizer,
                _ => {}
            },
            _ => {}
        }
        if matches!(
            e.kind,
            native::META_ALLOC | native::META_BLAS | native::META_BLASLT
        ) {
            let now = alloc.stats().allocated;
            if now > peak {
                peak = now;
                peak_op = op;
                peak_layer = layer;
                peak_phase = phase;
                peak_step = step.max(1);
                peak_at = i;
            }
        }
    }
    let stats = alloc.stats();
    let peak_op = if peak_op < 0 {
        crate::names::MISSING.to_string()
    } else {
        ffi::name(peak_op)?.unwrap_or_else(|| crate::names::MISSING.to_string())
    };
    let peak_layer = if peak_layer < 0 {
        None
    } else {
        ffi::name(peak_layer)?
    };
    let estimate = Estimate {
        mode: Mode::Inference,
        batch: 1,
        weights_bytes: 0,
        baseline_allocated: baseline,
        peak_allocated: stats.peak_allocated,
        peak_reserved: stats.peak_reserved,
        peak_requested: stats.peak_requested,
        peak_op,
        peak_layer,
        peak_phase,
        peak_step,
        cublas_workspaces: workspaces[..2].iter().filter(|w| **w).count() as u32,
        cublaslt_workspaces: workspaces[2..].iter().filter(|w| **w).count() as u32,
        cublas_workspace_bytes: options.gpu.cublas_workspace,
        allocations,
        elapsed: Duration::ZERO,
        unknown_frees: alloc.unknown_frees(),
        refused_requests: alloc.refused_requests(),
        host_peak_rss: None,
        not_modelled: &NOT_MODELLED,
        attention: Default::default(),
        step_flops: flops / u64::from(step.max(1)),
        idle: None,
    };
    Ok((estimate, peak_at))
}
