//! Measuring one iteration: the variables, classified by the blocks they point to,
//! against the allocator's counters.

use tch::Device;

use super::accounting::{self, BlockInfo};
use crate::error::Result;
use crate::ffi::{self, TensorBlock};
use crate::stats::{IterationStats, VariableKind, VariableList, VariableStats};
use crate::vars::{self, VarTable};

use super::MemoryProfiler;

fn info(b: &TensorBlock) -> BlockInfo {
    BlockInfo {
        base: b.base,
        bytes: b.bytes,
        born_in_optimizer: b.born_in_optimizer(),
    }
}

impl MemoryProfiler {
    /// Allocated bytes on the profiled device now.
    pub(super) fn allocated_now(&self) -> Result<u64> {
        let ds = ffi::device_stats(self.slot)?;
        let cuda = match self.device {
            Device::Cuda(i) => crate::cuda::allocator_stats(i).ok(),
            _ => None,
        };
        Ok(allocated_bytes(self.device, &ds, cuda.as_ref()))
    }

    /// The numbers of the iteration that ends now. Costs what changed: the variables'
    /// facts and the sums over their blocks are redone only when the variable set or a
    /// gradient changed (see [`VarTable`](crate::vars::VarTable)).
    pub(super) fn measure(&mut self) -> Result<IterationStats> {
        let ds = ffi::device_stats(self.slot)?;
        let state = ffi::state()?;

        self.table.refresh(&vars::lock(&self.variables))?;
        if self.hunter.is_some() && self.recorder.is_none() {
            // Keeps the layers of leak origins right when variables change (the step
            // recorder does it at each iteration start).
            self.params.sync(&self.table)?;
        }
        let weights_changed = self.sums.update_weights(&self.table);
        // The weight gradients born in this iteration's backward passes, by the place
        // of their births in its log: left out of the intermediate gradients' peak.
        let (log, overflow) = self.log_reader.read()?;
        let sums = &mut self.sums;
        let born_bytes = accounting::mark_grad_births(
            log,
            self.slot,
            self.table.grad_blocks(),
            &mut sums.births,
            &mut sums.unborn,
        );
        let intermediate = accounting::intermediate_peak(log, self.slot as u32, &sums.births);
        let grads_changed = self.sums.update_grads(&self.table, born_bytes);

        let next_step = self.step + 1;
        let (sums, table) = (&self.sums, &self.table);
        self.with_shared(|sh| {
            let o = &mut sh.oom;
            o.step = next_step;
            if weights_changed {
                o.weights = sums.weights.iter().map(|b| b.base).collect();
                o.weight_bytes = sums.weight_bytes;
                o.weights_by_layer.clear();
                for (e, b, _) in table.rows() {
                    *o.weights_by_layer.entry(e.layer.clone()).or_default() += b.bytes;
                }
            }
            if grads_changed {
                o.grads.clear();
                o.grads.extend(sums.grads.iter().map(|b| b.base));
            }
        });

        if weights_changed || grads_changed {
            self.sums.optimizer_claimed =
                accounting::optimizer_claimed(self.sums.weights.iter().chain(&self.sums.grads));
        }
        let optimizer_state =
            accounting::optimizer_state(ds.optimizer_born_live, self.sums.optimizer_claimed);
        let (weights, buffers, gradients) = (
            self.sums.weight_bytes,
            self.sums.buffer_bytes,
            self.sums.grad_bytes,
        );

        let (allocated, peak_allocated, reserved, peak_reserved, cuda) = match self.device {
            Device::Cuda(i) => {
                let cuda = self.device_memory.stats(i).ok();
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
        // The cuBLAS workspaces PyTorch holds on this device: allocated bytes no tensor
        // owns, named apart from "other" (read from PyTorch's table, a few map lookups).
        let blas_workspaces = match self.device {
            Device::Cuda(i) => crate::cuda::blas_workspaces()
                .map(|ws| ws.iter().filter(|w| w.device == i).map(|w| w.bytes).sum())
                .unwrap_or(0),
            _ => 0,
        };
        let other = allocated
            .saturating_sub(weights)
            .saturating_sub(gradients)
            .saturating_sub(optimizer_state)
            .saturating_sub(blas_workspaces);

        // A variable's bytes change only with its block (a table rebuild), its gradient's
        // with the gradient blocks: new gradient blocks of the same sizes (an optimizer's
        // zero_grad sets them to none, backward makes new ones) keep the list.
        let kept = !weights_changed
            && self.sums.variables.as_ref().is_some_and(|list| {
                !grads_changed
                    || (list.len() == self.table.len()
                        && list
                            .iter()
                            .zip(self.table.grad_blocks())
                            .all(|(v, g)| v.grad_bytes == g.defined.then_some(g.bytes)))
            });
        if !kept {
            self.sums.variables = Some(
                self.table
                    .rows()
                    .map(|(e, b, g)| VariableStats {
                        name: e.name.clone(),
                        kind: if e.trainable {
                            VariableKind::Weight
                        } else {
                            VariableKind::Buffer
                        },
                        dtype: e.dtype.clone(),
                        shape: e.shape.clone(),
                        bytes: b.bytes,
                        grad_bytes: g.defined.then_some(g.bytes),
                    })
                    .collect(),
            );
        }
        let variables = self.sums.variables.clone().unwrap_or_default();

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
            blas_workspaces_bytes: blas_workspaces,
            other_bytes: other,
            backward_passes: state.backward_passes,
            variables,
            cuda,
            cuda_devices: match self.device {
                Device::Cuda(_) => self.device_memory.devices_in_use(),
                _ => Vec::new(),
            },
        })
    }
}

/// Sums over the variables' blocks, redone only when what they sum changed.
#[derive(Debug, Default)]
pub(super) struct Sums {
    /// The table generation the weight sums are of.
    generation: Option<u64>,
    /// Every variable's block, and the buffers' (by name).
    weights: Vec<BlockInfo>,
    weight_bytes: u64,
    buffer_bytes: u64,
    /// Every defined gradient's block (by name), their addresses and distinct bytes.
    grads: Vec<BlockInfo>,
    /// The previous iteration's `grads`, kept for its room.
    spare_grads: Vec<BlockInfo>,
    grad_bytes: u64,
    /// Which events of the backward log are weight gradients' births, and the defined
    /// gradients' blocks born elsewhere: kept for their room.
    births: Vec<bool>,
    unborn: Vec<BlockInfo>,
    /// The table version the gradient sums are of.
    grads_version: Option<u64>,
    /// Bytes of the weight and gradient blocks born in an optimizer phase.
    optimizer_claimed: u64,
    /// The report's variables, as of the last change.
    variables: Option<VariableList>,
}

impl Sums {
    /// Redoes the weight sums if the table was rebuilt; returns whether it did.
    fn update_weights(&mut self, table: &VarTable) -> bool {
        if self.generation == Some(table.generation()) {
            return false;
        }
        self.generation = Some(table.generation());
        self.weights = table.rows().map(|(_, b, _)| info(&b)).collect();
        self.weight_bytes = accounting::distinct_bytes(&self.weights);
        let buffers: Vec<BlockInfo> = table
            .rows()
            .filter(|(e, _, _)| !e.trainable)
            .map(|(_, b, _)| info(&b))
            .collect();
        self.buffer_bytes = accounting::distinct_bytes(&buffers);
        true
    }

    /// Redoes the gradient sums if any gradient block changed (appeared, went, was
    /// reallocated); returns whether it did. `born_bytes` and `unborn` are this
    /// iteration's gradient blocks as [`accounting::mark_grad_births`] split them.
    fn update_grads(&mut self, table: &VarTable, born_bytes: u64) -> bool {
        if self.grads_version == Some(table.version()) {
            return false;
        }
        self.grads_version = Some(table.version());
        // Read into the spare vector and compared there: gradients that kept their
        // blocks (or came back at the same addresses after `zero_grad` set them to
        // none) change nothing below. Both vectors keep their room between iterations.
        let mut now = std::mem::take(&mut self.spare_grads);
        now.clear();
        now.extend(table.grad_blocks().filter(|g| g.defined).map(info));
        if now == self.grads {
            self.spare_grads = now;
            return false;
        }
        self.spare_grads = std::mem::replace(&mut self.grads, now);
        // The distinct blocks' bytes (gradients that share storage count once): those
        // born in this iteration's backward were counted by their births; the others
        // (none in a loop whose optimizer sets gradients to none) here.
        self.grad_bytes = born_bytes + accounting::distinct_bytes(&self.unborn);
        true
    }
}

/// Allocated bytes on `device`: on CUDA the caching allocator's own counter (or, if its
/// statistics cannot be read, the total it passed with its last report); on the CPU the
/// live bytes of the tracking allocator.
fn allocated_bytes(
    device: Device,
    ds: &ffi::DeviceCounters,
    cuda: Option<&crate::cuda::CudaStats>,
) -> u64 {
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

/// The process's resident memory and its peak since start, in bytes: /proc/self/statm's
/// resident pages (the figure /proc/self/status calls VmRSS) and getrusage's ru_maxrss
/// (the high-water mark /proc/self/status calls VmHWM); zeros where the system does not
/// tell. Two system calls: cheap enough for every `record_stats`.
pub(crate) fn process_memory() -> (u64, u64) {
    crate::ffi::process_memory().unwrap_or((0, 0))
}
