//! The dry run's raw trace as live bytes, without the caching allocator: for the checks
//! of the dry run against a real CPU run of the same tch model (`tests/dry_run_vs_cpu.rs`).
//! Not a stable API.

use std::collections::HashMap;

use super::{Input, Mode, Model, Options};
use crate::error::Result;
use crate::events::{Event, EventKind};
use crate::ffi::{self, AutocastList};
use crate::phase::Phase;

/// Whose autocast op lists the dry run follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lists {
    /// CUDA autocast's (what an estimate uses).
    Cuda,
    /// CPU autocast's (to compare with a real CPU run under CPU autocast).
    Cpu,
}

/// One outermost op of the dry run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceOp {
    /// Its name (`aten::linear`, `AddmmBackward0`).
    pub op: String,
    /// Training step (1-based; 1 for inference).
    pub step: u32,
    /// Its phase.
    pub phase: Phase,
    /// Live bytes (weights included) when it returned: the running sum of the trace's
    /// allocations and frees, no rounding, no workspace.
    pub live_bytes: u64,
    /// Bytes allocated inside it, from its call to its return (its frees not subtracted).
    pub allocated_bytes: u64,
}

/// Step `step` (from 1) of the dry run of `mode` on `model` with `lists`' autocast lists,
/// replayed as the estimate replays its predicted step, but in the bytes a CPU run holds
/// (each block its request, no cuBLAS workspace): the same `StepProfile` a profiled CPU
/// step gives, category by category, for the checks of the one replay.
pub fn dry_run_step(
    model: &Model,
    inputs: &[Input],
    mode: Mode,
    options: &Options,
    lists: Lists,
    step: u32,
) -> Result<crate::timeline::StepProfile> {
    let list = match lists {
        Lists::Cuda => AutocastList::Cuda,
        Lists::Cpu => AutocastList::Cpu,
    };
    let run = model.dry_run_lists(inputs, mode, options, list, false)?;
    model.step_as_requested(&run, options, step)
}

/// Step `step` (from 1) of the dry run of the user's own steps
/// ([`Model::estimate_steps`]), in the bytes a CPU run holds, as [`dry_run_step`] gives
/// it for the built-in loop.
pub fn dry_run_own_step<T, S>(
    model: &Model,
    options: &Options,
    state: &mut T,
    run_step: S,
    step: u32,
) -> Result<crate::timeline::StepProfile>
where
    S: FnMut(&mut T, tch::Device),
{
    let run = model.dry_run_steps(options, state, run_step, false)?;
    model.step_as_requested(&run, options, step)
}

/// The meta-kernel inventory of this process: every aten op that has a CPU kernel but
/// no composite kernel and no meta kernel in libtorch's C++ (PyTorch covers many of
/// them from Python), with `true` where the dry run registers its own.
pub fn meta_kernel_inventory() -> Result<Vec<(String, bool)>> {
    crate::ffi::meta_inventory()
}

/// The live bytes of one dry run.
#[derive(Clone, Debug, Default)]
pub struct DryRunTrace {
    /// Bytes of the model's variables.
    pub weights_bytes: u64,
    /// Every outermost op, in order.
    pub ops: Vec<TraceOp>,
    /// Per step (index 0: step 1), the highest live bytes, at allocation granularity.
    pub step_peaks: Vec<u64>,
    /// Per step, the sizes of its allocations in order.
    pub step_allocations: Vec<Vec<u64>>,
}

/// The dry run of `mode` on `model` with `lists`' autocast lists (when
/// `options.autocast` is set), as live bytes.
pub fn dry_run_trace(
    model: &Model,
    inputs: &[Input],
    mode: Mode,
    options: &Options,
    lists: Lists,
) -> Result<DryRunTrace> {
    let list = match lists {
        Lists::Cuda => AutocastList::Cuda,
        Lists::Cpu => AutocastList::Cpu,
    };
    let run = model.dry_run_lists(inputs, mode, options, list, false)?;
    from_events(model.weights_bytes(), &run.events)
}

/// The live bytes of the run's steps: a step is the dry run's training step (its
/// micro-batches together), as the estimate's replay counts them.
fn from_events(weights_bytes: u64, run: &[Event]) -> Result<DryRunTrace> {
    let mut t = DryRunTrace {
        weights_bytes,
        ..DryRunTrace::default()
    };
    let mut live = weights_bytes as i64;
    let mut step = 0u32;
    let mut phase = Phase::Forward;
    let ensure = |t: &mut DryRunTrace, step: u32| {
        let i = step.max(1) as usize;
        while t.step_peaks.len() < i {
            t.step_peaks.push(0);
            t.step_allocations.push(Vec::new());
        }
    };
    // Per open op: its name, and the bytes allocated in the run before its call.
    let mut ops: HashMap<i32, (i32, u64)> = HashMap::new();
    let mut allocated: u64 = 0;
    let mut last_step = 1u32;
    for e in run {
        match e.kind {
            EventKind::Alloc { .. } => {
                live += e.value;
                ensure(&mut t, step);
                let i = step.max(1) as usize - 1;
                t.step_peaks[i] = t.step_peaks[i].max(live.max(0) as u64);
                t.step_allocations[i].push(e.value as u64);
                allocated += e.value.max(0) as u64;
            }
            EventKind::Free => live += e.value,
            EventKind::OpBegin => {
                ops.insert(e.op, (e.aux, allocated));
                last_step = step.max(1);
            }
            EventKind::OpEnd => {
                let (name, before) = ops.get(&e.op).copied().unwrap_or((e.aux, allocated));
                t.ops.push(TraceOp {
                    op: ffi::name(name)?.unwrap_or_default(),
                    step: step.max(1),
                    phase,
                    live_bytes: live.max(0) as u64,
                    allocated_bytes: allocated - before,
                })
            }
            EventKind::Phase => {
                if e.generation > step {
                    // A new step begins (or the loop's end: no op follows).
                    step = e.generation;
                    ops.clear();
                    ensure(&mut t, step);
                    let i = step as usize - 1;
                    t.step_peaks[i] = t.step_peaks[i].max(live.max(0) as u64);
                }
                phase = e.phase;
            }
            _ => {}
        }
    }
    // What the dry run frees after its loop is no step.
    t.step_peaks.truncate(last_step as usize);
    t.step_allocations.truncate(last_step as usize);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn autocast_listing(which: AutocastList) -> Result<Vec<String>> {
        ffi::autocast_listing(which)
    }

    fn ops(which: AutocastList) -> BTreeSet<String> {
        autocast_listing(which)
            .unwrap()
            .iter()
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect()
    }

    /// What libtorch_cuda registers on AutocastCUDA by itself (aten/src/ATen/cudnn/
    /// AutocastRNN.cpp), there only when that library is loaded in this process.
    const FROM_LIBTORCH_CUDA: [&str; 1] = ["aten::_cudnn_rnn"];

    /// The ops each libtorch registers on AutocastCUDA (with libtorch_cuda's
    /// `_cudnn_rnn`) and on AutocastCPU, counted in its Python with
    /// `torch._C._dispatch_has_kernel_for_dispatch_key` over every op name: an
    /// independent count beside the comparison of the sets below. 2.13 dropped the
    /// named-tensor overloads and added `rms_norm` to CUDA's fp32 list.
    fn registered_counts() -> Option<(usize, usize)> {
        match crate::LIBTORCH_VERSION.get(..4) {
            Some("2.11") => Some((126, 129)),
            Some("2.13") => Some((120, 127)),
            _ => None,
        }
    }

    #[test]
    fn the_cuda_lists_are_the_ops_libtorch_registers_on_autocast_cuda() {
        let ours = ops(AutocastList::Cuda);
        let mut theirs = ops(AutocastList::RegisteredCuda);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        if !maps.contains("libtorch_cuda.so") {
            for op in FROM_LIBTORCH_CUDA {
                assert!(!theirs.contains(op), "{op} without libtorch_cuda");
                theirs.insert(op.to_string());
            }
        }
        if let Some((cuda, _)) = registered_counts() {
            assert_eq!(
                theirs.len(),
                cuda,
                "PyTorch {} registers {cuda} ops on AutocastCUDA",
                crate::LIBTORCH_VERSION
            );
        }
        assert_eq!(
            ours.symmetric_difference(&theirs).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "ours {}, libtorch's {}",
            ours.len(),
            theirs.len()
        );
    }

    #[test]
    fn the_cpu_lists_are_the_ops_libtorch_registers_on_autocast_cpu() {
        let ours = ops(AutocastList::Cpu);
        let theirs = ops(AutocastList::RegisteredCpu);
        if let Some((_, cpu)) = registered_counts() {
            assert_eq!(
                theirs.len(),
                cpu,
                "PyTorch {} registers {cpu} ops on AutocastCPU",
                crate::LIBTORCH_VERSION
            );
        }
        assert_eq!(
            ours.symmetric_difference(&theirs).collect::<Vec<_>>(),
            Vec::<&String>::new()
        );
    }

    #[test]
    fn every_listed_op_has_one_policy_per_list() {
        for which in [AutocastList::Cuda, AutocastList::Cpu] {
            let lines = autocast_listing(which).unwrap();
            let names: BTreeSet<&str> =
                lines.iter().map(|l| l.split(' ').next().unwrap()).collect();
            assert_eq!(names.len(), lines.len(), "an op listed twice");
            // Policies by hand from autocast_mode.cpp (PyTorch 2.11).
            let policy = |op: &str| {
                lines
                    .iter()
                    .find(|l| l.split(' ').next() == Some(op))
                    .map(|l| l.split(' ').nth(1).unwrap().to_string())
            };
            if which == AutocastList::Cuda {
                assert_eq!(policy("aten::mm").as_deref(), Some("lower_precision_fp"));
                assert_eq!(
                    policy("aten::softmax.int").as_deref(),
                    Some("fp32_set_opt_dtype")
                );
                assert_eq!(policy("aten::layer_norm").as_deref(), Some("fp32"));
                assert_eq!(
                    policy("aten::norm.Scalar").as_deref(),
                    Some("fp32_append_dtype")
                );
                assert_eq!(policy("aten::index_put").as_deref(), Some("promote"));
                assert_eq!(
                    policy("aten::binary_cross_entropy").as_deref(),
                    Some("banned")
                );
                assert_eq!(policy("aten::cat"), None);
            } else {
                assert_eq!(
                    policy("aten::_addmm_activation").as_deref(),
                    Some("lower_precision_fp")
                );
                assert_eq!(policy("aten::cat").as_deref(), Some("promote"));
                assert_eq!(
                    policy("aten::binary_cross_entropy").as_deref(),
                    Some("fp32")
                );
                assert_eq!(policy("aten::layer_norm"), None);
            }
        }
    }
}
