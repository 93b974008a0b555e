//! Measuring one iteration: the variables, classified by the blocks they point to,
//! against the allocator's counters.

use std::collections::HashSet;

use tch::Device;

use crate::accounting::{self, BlockInfo};
use crate::error::Result;
use crate::ffi::{self, Block};
use crate::names::layer_of;
use crate::stats::{IterationStats, VariableKind, VariableStats};
use crate::vars::{self, Var};

use super::MemoryProfiler;

fn info(b: &Block) -> BlockInfo {
    BlockInfo {
        base: b.base,
        bytes: b.size(),
        born_in_optimizer: b.born_in_optimizer(),
    }
}

impl MemoryProfiler {
    /// Allocated bytes on the profiled device now.
    pub(super) fn allocated_now(&self) -> Result<u64> {
        let ds = ffi::device_stats(self.slot)?;
        let cuda = match self.device {
            Device::Cuda(i) => ffi::cuda_stats(i).ok(),
            _ => None,
        };
        Ok(allocated_bytes(self.device, &ds, cuda.as_ref()))
    }

    /// The numbers of the iteration that ends now.
    pub(super) fn measure(&mut self) -> Result<IterationStats> {
        let ds = ffi::device_stats(self.slot)?;
        let state = ffi::state()?;
        let overflow = ffi::read_log(&mut self.log)?;

        let store = vars::lock(&self.variables);
        let walk = vars::walk(&store)?;
        if self.hunter.is_some() && self.recorder.is_none() {
            // Keeps the layers of leak origins right when variables change (the step
            // recorder does it at each iteration start).
            self.params.update(&walk)?;
        }
        let m = Measured::of(&walk);
        drop(walk);
        drop(store);

        let next_step = self.step + 1;
        self.with_shared(|sh| {
            let o = &mut sh.oom;
            o.step = next_step;
            o.weights = m.weights.iter().map(|b| b.base).collect();
            o.grads = m.grads.iter().map(|b| b.base).collect();
            o.weight_bytes = accounting::distinct_bytes(&m.weights);
            o.weights_by_layer.clear();
            for v in &m.variables {
                *o.weights_by_layer.entry(layer_of(&v.name)).or_default() += v.bytes;
            }
        });

        let weights = accounting::distinct_bytes(&m.weights);
        let buffers = accounting::distinct_bytes(&m.buffers);
        let gradients = accounting::distinct_bytes(&m.grads);
        let claimed: Vec<BlockInfo> = m.weights.iter().chain(&m.grads).copied().collect();
        let optimizer_state = accounting::optimizer_state(ds.optimizer_born_live, &claimed);
        let grad_bases: HashSet<u64> = m.grads.iter().map(|b| b.base).collect();
        let intermediate = accounting::intermediate_peak(&self.log, self.slot as u32, &grad_bases);

        let (allocated, peak_allocated, reserved, peak_reserved, cuda) = match self.device {
            Device::Cuda(i) => {
                let cuda = ffi::cuda_stats(i).ok();
                let allocated = allocated_bytes(self.device, &ds, cuda.as_ref());
                let reserved = cuda
                    .map(|c| c.reserved_current)
                    .unwrap_or(ds.reported_reserved)
                    .max(0) as u64;
                (
                    allocated,
                    allocated.max(ds.reported_peak_allocated_iter.max(0) as u64),
                    reserved,
                    reserved.max(ds.reported_peak_reserved_iter.max(0) as u64),
                    cuda,
                )
            }
            _ => {
                let (rss, hwm) = process_memory();
                (
                    allocated_bytes(self.device, &ds, None),
                    ds.peak_iter.max(ds.live).max(0) as u64,
                    rss,
                    hwm,
                    None,
                )
            }
        };
        let other = allocated
            .saturating_sub(weights)
            .saturating_sub(gradients)
            .saturating_sub(optimizer_state);

        Ok(IterationStats {
            epoch: self.epoch,
            iteration: self.iteration,
            step: self.step,
            device: device_name(self.device),
            allocated_bytes: allocated,
            peak_allocated_bytes: peak_allocated,
            reserved_bytes: reserved,
            peak_reserved_bytes: peak_reserved,
            weights_bytes: weights,
            buffers_bytes: buffers,
            gradients_bytes: gradients,
            feature_maps_bytes: ds.feature_maps.max(0) as u64,
            intermediate_gradients_bytes: intermediate,
            intermediate_gradients_exact: !overflow,
            optimizer_state_bytes: optimizer_state,
            other_bytes: other,
            backward_passes: state.backward_passes.max(0) as u64,
            variables: m.variables,
            cuda,
            cuda_devices: match self.device {
                Device::Cuda(_) => crate::cuda::devices_in_use(),
                _ => Vec::new(),
            },
        })
    }
}

/// The variables of one report and the blocks behind them.
struct Measured {
    variables: Vec<VariableStats>,
    weights: Vec<BlockInfo>,
    buffers: Vec<BlockInfo>,
    grads: Vec<BlockInfo>,
}

impl Measured {
    fn of(walk: &[Var<'_>]) -> Self {
        let mut m = Measured {
            variables: Vec::with_capacity(walk.len()),
            weights: Vec::with_capacity(walk.len()),
            buffers: Vec::new(),
            grads: Vec::with_capacity(walk.len()),
        };
        for v in walk {
            let kind = if v.trainable {
                VariableKind::Weight
            } else {
                VariableKind::Buffer
            };
            m.weights.push(info(&v.block));
            if kind == VariableKind::Buffer {
                m.buffers.push(info(&v.block));
            }
            if v.grad.is_defined() {
                m.grads.push(info(&v.grad));
            }
            m.variables.push(VariableStats {
                name: v.name.clone(),
                kind,
                dtype: v
                    .tensor
                    .f_kind()
                    .map(|k| format!("{k:?}"))
                    .unwrap_or_else(|_| crate::names::MISSING.into()),
                shape: v.tensor.size(),
                bytes: v.block.size(),
                grad_bytes: v.grad.is_defined().then(|| v.grad.size()),
            });
        }
        m
    }
}

/// Allocated bytes on `device`: on CUDA the caching allocator's own counter (or, if its
/// statistics cannot be read, the total it passed with its last report); on the CPU the
/// live bytes of the tracking allocator.
fn allocated_bytes(device: Device, ds: &ffi::DeviceStats, cuda: Option<&ffi::CudaStats>) -> u64 {
    let bytes = match device {
        Device::Cuda(_) => cuda.map_or(ds.reported_allocated, |c| c.allocated_current),
        _ => ds.live,
    };
    bytes.max(0) as u64
}

/// `cpu` or `cuda:N`.
pub(crate) fn device_name(d: Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// The process's resident memory and its peak (VmRSS, VmHWM), in bytes; zeros where
/// /proc is unavailable.
pub(crate) fn process_memory() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}
