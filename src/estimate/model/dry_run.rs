//! The dry run: the meta trace of an inference or of training steps, run as the loop a
//! tch user writes (plain, with gradient accumulation, under autocast, or through
//! `Checkpointed`).

use std::rc::Rc;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

use super::{Model, Trace};
use crate::error::{catching, torch_message, Error, Result};
use crate::estimate::{AttentionRuns, Input, Mode, Options};
use crate::events::Event;
use crate::ffi::{self, AutocastList, Mark, Target};
use crate::optim::{meta_autocast, Checkpointed};
use crate::workload::loss;

/// `f` under the dry run's autocast in `dtype` with the op lists `list`, or plainly.
fn autocasting<T>(
    dtype: Option<Kind>,
    list: AutocastList,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    match dtype {
        Some(k) => meta_autocast(list, k, f)?,
        None => f(),
    }
}

/// What a dry run gives: its meta trace, the attention calls by backend, its time.
#[derive(Debug, Clone)]
pub(crate) struct DryRun {
    pub events: Vec<Event>,
    pub attention: AttentionRuns,
    pub elapsed: Duration,
    /// Why a TorchScript file's forward passes ran as written although
    /// [`Options::jit_optimize`] asked for the executor's optimized graph: that graph
    /// failed on the dry run's meta tensors (its message).
    pub jit_fallback: Option<String>,
}

impl Model {
    /// The dry run: the meta trace of `mode` at these inputs, under `options` (the
    /// settings that change what a CUDA run allocates, not the allocator's); with
    /// `sites`, its last step's allocations keep their call stacks (the idle blocks'
    /// lines in the user's code).
    pub(crate) fn dry_run(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        sites: bool,
    ) -> Result<DryRun> {
        self.dry_run_lists(inputs, mode, options, AutocastList::Cuda, sites)
    }

    /// The dry run with autocast's op lists of `autocast_list` (CUDA's for an estimate, CPU's to check the dry run against a real CPU run).
    pub(in crate::estimate) fn dry_run_lists(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        autocast_list: AutocastList,
        sites: bool,
    ) -> Result<DryRun> {
        let optimize = options.jit_optimize && self.is_script();
        // A TorchScript file's forward passes as `on` asks: optimized, or as written.
        let run = |on: bool| {
            self.set_jit_optimize(on);
            let run = self.dry_run_once(inputs, mode, options, autocast_list, sites);
            self.set_jit_optimize(true);
            run
        };
        let first = run(optimize);
        match first {
            // The optimized graph may compute with a constant's value (a scalar tensor
            // folded into the graph), which meta tensors do not have: the file as
            // written, said so. A file that fails as written too fails with that error.
            Err(e) if optimize => {
                let mut written = run(false)?;
                written.jit_fallback = Some(e.to_string());
                Ok(written)
            }
            first => first,
        }
    }

    fn dry_run_once(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        autocast_list: AutocastList,
        sites: bool,
    ) -> Result<DryRun> {
        let start = Instant::now();
        let steps = options.steps;
        if inputs.is_empty() {
            return Err(Error::InvalidInput {
                name: "input",
                value: "(none)".into(),
                reason: "the model needs at least one input shape".into(),
            });
        }
        options.validate(mode)?;
        self.fresh_executor()?;
        let trace = self.begin_trace(options)?;
        match mode {
            Mode::Steps => {
                return Err(Error::InvalidInput {
                    name: "mode",
                    value: mode.label(),
                    reason: "a user's own steps run through Model::estimate_steps".into(),
                })
            }
            Mode::Inference => {
                self.set_train(false)?;
                keep_sites(sites);
                // The step begins with its batch, as a profiled iteration does.
                ffi::meta_mark(Mark::Forward)?;
                let xs = Model::make_inputs(inputs)?;
                ffi::meta_mark(Mark::Baseline)?;
                let y = autocasting(options.autocast, autocast_list, || {
                    tch::no_grad(|| self.forward(&xs, false))
                })?;
                drop(y);
                drop(xs);
                ffi::meta_mark(Mark::End)?;
            }
            Mode::Train(opt) => {
                let checkpointed = self.checkpointed(inputs, options, autocast_list)?;
                self.set_train(true)?;
                let mut o = opt
                    .build(self.var_store())
                    .map_err(|e| Error::Native(format!("building the optimizer: {e}")))?;
                let result = (|| -> Result<()> {
                    let accumulate = options.accumulate.max(1);
                    for step in 0..steps.max(1) {
                        // A plain loop holds its batch, output and loss through the
                        // optimizer step; an accumulation loop drops each micro-batch's
                        // at the end of its inner loop.
                        let mut held = Vec::new();
                        for micro in 0..accumulate {
                            if step + 1 == steps.max(1) && micro == 0 {
                                keep_sites(sites);
                            }
                            // The step begins with its batch, as a profiled iteration
                            // does.
                            ffi::meta_mark(Mark::Forward)?;
                            let xs = Model::make_inputs(inputs)?;
                            if step == 0 && micro == 0 {
                                ffi::meta_mark(Mark::Baseline)?;
                            }
                            // Gradients to none before the forward pass: asked for, or
                            // the loop `Checkpointed` takes (forward and backward are one
                            // call); otherwise after it, before backward, as tch's
                            // `backward_step` does.
                            let first = options.zero_grad_first || checkpointed.is_some();
                            if first && micro == 0 {
                                o.zero_grad();
                            }
                            let kept = match &checkpointed {
                                // Forward and backward in one call, which marks where
                                // backward begins; it keeps no output.
                                Some(c) => {
                                    let x = self.cast_inputs(&xs[..1])?.remove(0);
                                    let loss = catching(|| {
                                        c.forward_backward(&x, |out| {
                                            loss(out, meta_targets)
                                                .unwrap_or_else(|e| panic!("the loss failed: {e}"))
                                        })
                                    })
                                    .map_err(|e| self.failed("the checkpointed step failed", e))?
                                    .map_err(|e| self.failed("the checkpointed step failed", e))?;
                                    vec![loss]
                                }
                                None => {
                                    // Forward and loss under autocast, backward and step
                                    // outside.
                                    let (out, loss) =
                                        autocasting(options.autocast, autocast_list, || {
                                            let out = self.forward(&xs, true)?;
                                            let _scope = self
                                                .sharded_run
                                                .get()
                                                .map(|_| crate::timeline::scope(super::LOSS_SCOPE));
                                            let loss = loss(&out, meta_targets)
                                                .map_err(|e| self.failed("the loss failed", e))?;
                                            Ok((out, loss))
                                        })?;
                                    ffi::meta_mark(Mark::Backward)?;
                                    if !first && micro == 0 {
                                        o.zero_grad();
                                    }
                                    catching(|| loss.backward())
                                        .map_err(|e| self.failed("the backward pass failed", e))?;
                                    vec![loss, out]
                                }
                            };
                            if accumulate == 1 {
                                held = kept;
                                held.extend(xs);
                            }
                        }
                        ffi::meta_mark(Mark::Optimizer)?;
                        catching(|| o.step())
                            .map_err(|e| self.failed("the optimizer step failed", e))?;
                        drop(held);
                    }
                    ffi::meta_mark(Mark::End)?;
                    Ok(())
                })();
                // Gradients back to none, state dropped, whatever happened.
                o.zero_grad();
                drop(o);
                drop(checkpointed);
                self.set_train(false)?;
                result?;
            }
        }
        finish(trace, start)
    }

    /// Begins the meta trace of a dry run: the attention rules of `options`' GPU, and
    /// the model's variables for the op recorder (the layer of each op).
    fn begin_trace(&self, options: &Options) -> Result<Trace> {
        // Set once this trace is ours (one trace per process at a time), read before it
        // ends: no other dry run can change them in between.
        let gpu = &options.gpu;
        if gpu.multiprocessors == 0 || gpu.threads_per_multiprocessor == 0 {
            return Err(Error::InvalidInput {
                name: "gpu",
                value: format!(
                    "{} multiprocessors, {} threads each",
                    gpu.multiprocessors, gpu.threads_per_multiprocessor
                ),
                reason: "a GPU has at least one multiprocessor of at least one thread \
                         (Gpu::named or Gpu::generic fill them in)"
                    .to_string(),
            });
        }
        let trace = Trace::begin()?;
        ffi::meta_attention_set(options.gpu.sm as i32, options.attention.backend())?;
        ffi::meta_gpu_set(
            options.gpu.multiprocessors as i32,
            options.gpu.threads_per_multiprocessor as i32,
        )?;
        ffi::meta_conv_workspaces_set(options.gpu.measured_conv_workspaces())?;
        // The op recorder finds the model's variables among op inputs, as the profiled
        // step's does: the layer of each op.
        let vars = self.vars()?;
        ffi::set_params(
            Target::DryRun,
            &vars.ptrs,
            &(0..vars.ptrs.len() as i32).collect::<Vec<_>>(),
            &vars
                .entries
                .iter()
                .map(|e| ffi::intern(&e.layer).unwrap_or(-1))
                .collect::<Vec<_>>(),
        )?;
        Ok(trace)
    }

    /// The dry run of the user's own steps (`Mode::Steps`): `step(state, device)`
    /// `options.steps` times, each begun with a step mark (its phases found as the
    /// profiler finds them).
    pub(in crate::estimate) fn dry_run_steps<T, S>(
        &self,
        options: &Options,
        state: &mut T,
        mut step: S,
        sites: bool,
    ) -> Result<DryRun>
    where
        S: FnMut(&mut T, Device),
    {
        let start = Instant::now();
        options.validate(Mode::Steps)?;
        let trace = self.begin_trace(options)?;
        let result = (|| -> Result<()> {
            let steps = options.steps.max(1);
            for s in 0..steps {
                if s + 1 == steps {
                    keep_sites(sites);
                }
                ffi::meta_mark(Mark::Step)?;
                if s == 0 {
                    ffi::meta_mark(Mark::Baseline)?;
                }
                catching(|| step(state, Device::Mps)).map_err(|e| {
                    self.failed(&format!("step {} failed", s + 1), torch_message(&e))
                })?;
            }
            ffi::meta_mark(Mark::End)
        })();
        result?;
        finish(trace, start)
    }

    /// The model's chain as [`Checkpointed`] runs it for [`Options::checkpoint`] in the
    /// dry run (autocast's op lists `list`), or `None` without checkpointing.
    fn checkpointed(
        &self,
        inputs: &[Input],
        options: &Options,
        list: AutocastList,
    ) -> Result<Option<Checkpointed<'static>>> {
        let Some(every) = options.checkpoint else {
            return Ok(None);
        };
        let invalid = |value: String, reason: &str| Error::InvalidInput {
            name: "checkpoint",
            value,
            reason: reason.to_string(),
        };
        let Some(chain) = &self.chain else {
            return Err(invalid(
                format!("every {every}"),
                "checkpointing needs the model as a chain of segments (a built-in transformer or ResNet, Model::from_segments); a TorchScript file or a module is not one",
            ));
        };
        if inputs.len() != 1 {
            return Err(Error::InvalidInput {
                name: "input",
                value: format!("{} inputs", inputs.len()),
                reason: "a chain of segments (checkpointing) takes one input".into(),
            });
        }
        let mut c = Checkpointed::new(self.var_store())
            .for_dry_run(list, || ffi::meta_mark(Mark::Backward));
        for i in 0..chain.segments() {
            let chain = Rc::clone(chain);
            let f = move |x: &Tensor, train: bool| chain.segment(i, x, train);
            c = if i % every as usize == 0 {
                c.segment(f)
            } else {
                c.segment_kept(f)
            };
        }
        if let Some(k) = options.autocast {
            c = c.mixed_precision(k);
        }
        Ok(Some(c))
    }
}

/// The dry run whose trace is `trace`, begun at `start`: its events and the attention
/// calls by backend.
fn finish(trace: Trace, start: Instant) -> Result<DryRun> {
    let [flash, efficient, cudnn, math] = ffi::meta_attention_runs()?;
    Ok(DryRun {
        events: trace.finish()?,
        attention: AttentionRuns {
            flash,
            efficient,
            cudnn,
            math,
        },
        elapsed: start.elapsed(),
        jit_fallback: None,
    })
}

/// From here on, the trace's allocations keep their call stacks, when this dry run is to
/// name the idle blocks' lines ([`Model::estimate`] of the user's tch code); without them
/// (a profiled step keeps sites now) the lines are unknown.
fn keep_sites(sites: bool) {
    if sites {
        if let Err(e) = ffi::meta_sites(true) {
            log::debug!("tch-memprof: the dry run keeps no allocation sites: {e}");
        }
    }
}

/// `n` int64 class indices on the meta device: the targets of the dry run's loss.
fn meta_targets(n: i64) -> Result<Tensor> {
    let like = Tensor::empty([0], (Kind::Int64, Device::Cpu));
    ffi::meta_empty(&[n], &like)
}
