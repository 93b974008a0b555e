//! A model on the meta device and its dry run: the meta trace of its weights, of an
//! inference or of training steps.

use std::rc::Rc;
use std::time::Instant;

use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::models::{self, Chain};
use crate::replay::{as_requested, peak_step, predicted_step, through_allocator};

mod dry_run;
mod exported;
mod fit;
mod gpus;
mod input_words;
mod plan;
mod script;
mod sharded;
mod steps;
mod variables;
use super::compare::Comparison;
use super::recorded::{Peaks, Recording};
use super::{Estimate, Input, Mode, Options, NOT_MODELLED};
use crate::error::{catching, torch_message, Error, Result};
use crate::events::Event;
use crate::ffi;
use crate::names::{Names, MISSING};
use crate::phase::Phase;
use crate::program::Program;
use crate::timeline::sites::SiteNames;
use crate::timeline::UNKNOWN_SITE;
pub(crate) use dry_run::DryRun;
pub(crate) use gpus::{GpuPlans, Sharding, MOST_GPUS};
pub use sharded::RankEstimate;

/// The scope of the dry run's loss, when [`Model::sharded_run`] asks for it.
pub(crate) const LOSS_SCOPE: &str = "tch-memprof loss";

/// What a sharded estimate's dry run does beyond a one-GPU one.
#[derive(Clone, Copy, Debug, Default)]
struct ShardedRun {
    /// FSDP2's `cast_forward_inputs`: the floating-point inputs cast to this dtype as
    /// the model's forward pass begins (its root's pre-forward).
    inputs_in: Option<Kind>,
}

type ForwardFn = Box<dyn Fn(&[Tensor], bool) -> Tensor>;

/// How much of the predicted step a replay works out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Analysis {
    /// The peaks and where allocated peaked (the plan's search).
    Peak,
    /// The predicted step's anatomy too ([`Estimate::step`]).
    Step,
    /// And the blocks idle at its peak.
    StepAndIdle,
}

/// A segment of a model given as a chain ([`Model::from_segments`]): `f(input, train)`
/// returns its output.
pub type Segment = Box<dyn Fn(&Tensor, bool) -> Tensor>;

/// A user's segments as a chain.
struct Segments(Vec<Segment>);

impl Chain for Segments {
    fn segments(&self) -> usize {
        self.0.len()
    }

    fn segment(&self, i: usize, x: &Tensor, train: bool) -> Tensor {
        (self.0[i])(x, train)
    }
}

enum Runner {
    Code {
        vs: nn::VarStore,
        forward: ForwardFn,
    },
    Script {
        module: ffi::ScriptModule,
        vs: nn::VarStore,
        /// The dry run's [`Options::jit_optimize`], set at its start.
        optimize: std::cell::Cell<bool>,
    },
    Program {
        program: Box<Program>,
        /// The program's weights, in its signature's order (on meta).
        weights: Vec<Tensor>,
        vs: nn::VarStore,
    },
}

/// A model on the meta device, ready for estimates: its weights hold no memory.
pub struct Model {
    runner: Runner,
    /// The meta trace of the weights' allocations, in the order a CUDA run makes them.
    weights: Vec<Event>,
    weights_bytes: u64,
    /// The model's name in messages: its file name, its built-in name, or `tch model`.
    label: String,
    /// The model as a chain of segments, when it is given as one: what activation
    /// checkpointing ([`Options::checkpoint`]) runs.
    chain: Option<Rc<dyn Chain>>,
    /// The model is the user's tch code: the idle blocks of its dry run are located in
    /// that code (the last step's allocations keep their call stacks).
    user_code: bool,
    /// A sharded estimate's dry run: its loss runs in a scope of its own
    /// ([`LOSS_SCOPE`]), where the model's forward pass is found ended (its root's
    /// post-forward), and its inputs are cast as [`ShardedRun`] says.
    sharded_run: std::cell::Cell<Option<ShardedRun>>,
    /// A built-in model's input (its default): an input of another rank is refused before
    /// the model runs, in words that say what the model takes.
    takes: Option<Input>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("weights_bytes", &self.weights_bytes)
            .finish_non_exhaustive()
    }
}

/// The meta trace of one dry run: begun on creation, ended on drop (also when the
/// model's code panics).
struct Trace;

impl Trace {
    fn begin() -> Result<Trace> {
        ffi::meta_begin()?;
        Ok(Trace)
    }

    fn finish(self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        let complete = ffi::meta_read(&mut events)?;
        drop(self);
        if !complete {
            return Err(Error::Native(format!(
                "the dry run made more than {} allocator events; the estimate would be incomplete",
                ffi::META_TRACE_CAPACITY
            )));
        }
        Ok(events)
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Err(e) = ffi::meta_end() {
            log::error!("tch-memprof: ending the meta trace failed: {e}");
        }
    }
}

/// `build` run on a VarStore whose variables are made on the meta device, under a meta
/// trace: the VarStore, what `build` made, and the weights' trace.
fn meta_build<T>(build: impl FnOnce(&nn::Path) -> T) -> Result<(nn::VarStore, T, Vec<Event>)> {
    let trace = Trace::begin()?;
    let vs = nn::VarStore::new(Device::Mps);
    let made = catching(|| build(&vs.root())).map_err(|reason| Error::DryRun {
        model: "tch model".into(),
        reason: format!("building the model on the meta device failed: {reason}"),
    })?;
    let weights = trace.finish()?;
    Ok((vs, made, weights))
}

fn live_bytes(events: &[Event]) -> u64 {
    let live: i64 = events
        .iter()
        .filter(|e| e.is_block())
        .map(|e| e.value)
        .sum();
    live.max(0) as u64
}

impl Model {
    /// A tch model: its `VarStore` (built on the CPU) and its forward pass
    /// (`forward(inputs, train)`). Every variable moves to the meta device in place
    /// (the model's layers share them, so they follow), in the order tch created them,
    /// which is the order a CUDA run allocates them; the CPU memory is released.
    pub fn from_var_store<F>(vs: nn::VarStore, forward: F) -> Result<Model>
    where
        F: Fn(&[Tensor], bool) -> Tensor + 'static,
    {
        if vs.device() != Device::Cpu {
            return Err(Error::InvalidInput {
                name: "VarStore device",
                value: format!("{:?}", vs.device()),
                reason: "build the model on the CPU: the estimator moves it to the meta device"
                    .into(),
            });
        }
        let vars = variables::creation_order(&vs);
        let trace = Trace::begin()?;
        for (_, t) in &vars {
            ffi::meta_convert(t)?;
        }
        let weights = trace.finish()?;
        let weights_bytes = live_bytes(&weights);
        Ok(Model {
            runner: Runner::Code {
                vs,
                forward: Box::new(forward),
            },
            weights,
            weights_bytes,
            label: "tch model".to_string(),
            chain: None,
            user_code: true,
            sharded_run: std::cell::Cell::new(None),
            takes: None,
        })
    }

    /// The same model, named `label` in messages (a dry run that fails names it).
    pub fn with_label(mut self, label: impl Into<String>) -> Model {
        self.label = label.into();
        self
    }

    /// The model's name in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The model is a file PyTorch wrote (a TorchScript file or an exported program), not
    /// tch code: its estimate is of the file as it runs, which eager PyTorch running the
    /// original module may exceed ([`EAGER_ABOVE`](crate::estimate::EAGER_ABOVE)).
    pub fn from_pytorch(&self) -> bool {
        matches!(self.runner, Runner::Script { .. } | Runner::Program { .. })
    }

    /// A dry run of this model failed: `what` and libtorch's reason, in one line.
    fn failed(&self, what: &str, reason: impl std::fmt::Display) -> Error {
        Error::DryRun {
            model: self.label.clone(),
            reason: format!("{what}: {reason}"),
        }
    }

    /// A tch module (`ModuleT`) over `vs`, called with the first input.
    pub fn from_module<M>(vs: nn::VarStore, module: M) -> Result<Model>
    where
        M: nn::ModuleT + 'static,
    {
        Model::from_var_store(vs, move |xs, train| module.forward_t(&xs[0], train))
    }

    /// A tch model built straight on the meta device: `build` makes the model on the
    /// path it is given, whose VarStore creates every variable on meta (no host memory,
    /// so a model of any size can be estimated on a small machine). The weights'
    /// allocations, the initialisers' temporaries included, are traced in the order
    /// `build` makes them, as building the model on the GPU would make them.
    ///
    /// Inside the dry run a meta tensor's `device()` reads as `Device::Mps` in tch (tch
    /// has no meta device); the dry run maps every MPS request to meta, so code that
    /// makes tensors on its input's device runs unchanged.
    pub fn build_on_meta<M, F>(build: F) -> Result<Model>
    where
        M: nn::ModuleT + 'static,
        F: FnOnce(&nn::Path) -> M,
    {
        let (vs, module, weights) = meta_build(build)?;
        Ok(Model::code(
            vs,
            Box::new(move |xs, train| module.forward_t(&xs[0], train)),
            weights,
            None,
        ))
    }

    /// A tch model given as a chain of segments, each one tensor in and one out (the
    /// embedding, each block, the head), over its `VarStore` built on the CPU (moved to
    /// the meta device as [`Model::from_var_store`] does): estimates run the segments in
    /// order, and [`Options::checkpoint`] runs them as [`crate::Checkpointed`] does, so
    /// the plan can try activation checkpointing. `segments[0]` takes the first input.
    pub fn from_segments(vs: nn::VarStore, segments: Vec<Segment>) -> Result<Model> {
        if segments.is_empty() {
            return Err(Error::InvalidInput {
                name: "segments",
                value: "0".into(),
                reason: "a chain needs at least one segment".into(),
            });
        }
        let chain: Rc<dyn Chain> = Rc::new(Segments(segments));
        let run = Rc::clone(&chain);
        let mut model =
            Model::from_var_store(vs, move |xs, train| run.forward_plain(&xs[0], train))?;
        model.chain = Some(chain);
        Ok(model)
    }

    /// A chain of segments ([`models::Chain`]) built straight on the meta device, as
    /// [`Model::build_on_meta`] builds a module: estimates run its plain forward pass,
    /// [`Options::checkpoint`] its segments as [`crate::Checkpointed`] does.
    pub fn build_chain_on_meta<C, F>(build: F) -> Result<Model>
    where
        C: Chain + 'static,
        F: FnOnce(&nn::Path) -> C,
    {
        let (vs, chain, weights) = meta_build(build)?;
        let chain: Rc<dyn Chain> = Rc::new(chain);
        Ok(Model::chained(vs, chain, weights))
    }

    fn chained(vs: nn::VarStore, chain: Rc<dyn Chain>, weights: Vec<Event>) -> Model {
        let run = Rc::clone(&chain);
        Model::code(
            vs,
            Box::new(move |xs, train| run.forward_plain(&xs[0], train)),
            weights,
            Some(chain),
        )
    }

    fn code(
        vs: nn::VarStore,
        forward: ForwardFn,
        weights: Vec<Event>,
        chain: Option<Rc<dyn Chain>>,
    ) -> Model {
        Model {
            runner: Runner::Code { vs, forward },
            weights_bytes: live_bytes(&weights),
            weights,
            label: "tch model".to_string(),
            chain,
            user_code: true,
            sharded_run: std::cell::Cell::new(None),
            takes: None,
        }
    }

    /// Segments of the model's chain, when it is given as one.
    pub fn segments(&self) -> Option<usize> {
        self.chain.as_ref().map(|c| c.segments())
    }

    /// A built-in model by name ([`models::BUILTINS`]), 1000 classes.
    /// Built on the meta device ([`Model::build_on_meta`]): no host memory.
    pub fn builtin(name: &str) -> Result<Model> {
        let builtin = models::builtin(name)?;
        let (vs, built, weights) = meta_build(|p| (builtin.build)(p, 1000))?;
        let mut model = match built {
            models::Built::Chain(chain) => {
                let chain: Box<dyn models::Chain> = chain;
                Model::chained(vs, Rc::from(chain), weights)
            }
            models::Built::Module(module) => Model::code(
                vs,
                Box::new(move |xs, train| module.forward_t(&xs[0], train)),
                weights,
                None,
            ),
        };
        // Not the user's code: no sites (they would point into this crate).
        model.user_code = false;
        model.takes = Some(models::default_input(name));
        Ok(model.with_label(name.to_string()))
    }

    /// Bytes of the model's variables.
    pub fn weights_bytes(&self) -> u64 {
        self.weights_bytes
    }

    fn forward(&self, xs: &[Tensor], train: bool) -> Result<Tensor> {
        if let Some(takes) = &self.takes {
            let rank = takes.shape.len();
            if xs.len() != 1 || xs[0].dim() != rank {
                let given: Vec<String> = xs
                    .iter()
                    .map(|t| {
                        let s: Vec<String> = t.size().iter().map(|d| d.to_string()).collect();
                        s.join("x")
                    })
                    .collect();
                let (what, sizes) = if takes.kind == Kind::Int64 {
                    ("token ids [batch, tokens]", "any batch and length")
                } else {
                    (
                        "images [batch, channels, height, width]",
                        "any batch and size",
                    )
                };
                let given = given.join(" and ");
                return Err(self.failed(
                    "wrong input",
                    format!(
                        "it takes one input, {what} (--input {}, {sizes}); given {given}",
                        takes.spec()
                    ),
                ));
            }
        }
        let cast = self.cast_inputs(xs)?;
        self.forward_as_given(&cast, train).map_err(|e| match e {
            Error::DryRun { model, reason } => Error::DryRun {
                reason: input_words::input_type_words(&reason, xs).unwrap_or(reason),
                model,
            },
            other => other,
        })
    }

    /// The inputs as the model's forward pass gets them: under a sharded run with mixed
    /// precision, the floating-point ones cast as FSDP2's root casts them.
    fn cast_inputs(&self, xs: &[Tensor]) -> Result<Vec<Tensor>> {
        let into = self.sharded_run.get().and_then(|r| r.inputs_in);
        xs.iter()
            .map(|x| match into {
                Some(k) if x.is_floating_point() && x.kind() != k => x
                    .f_to_kind(k)
                    .map_err(|e| self.failed("casting the input", torch_message(&e.to_string()))),
                _ => Ok(x.shallow_clone()),
            })
            .collect()
    }

    fn forward_as_given(&self, xs: &[Tensor], train: bool) -> Result<Tensor> {
        match &self.runner {
            Runner::Code { forward, .. } => catching(|| forward(xs, train))
                .map_err(|e| self.failed("the model's forward pass failed", e)),
            Runner::Script {
                module, optimize, ..
            } => module.forward(xs, optimize.get()).map_err(|e| {
                let msg = torch_message(&e.to_string());
                let hint = if fixed_shape(&msg) {
                    "; a file made by torch.jit.trace fixes the sizes it was traced at: \
                     trace it at the shape you estimate"
                } else {
                    ""
                };
                self.failed("the model's forward pass failed", format!("{msg}{hint}"))
            }),
            Runner::Program {
                program, weights, ..
            } => {
                let shapes: Vec<Vec<i64>> = xs.iter().map(Tensor::size).collect();
                program.check_inputs(&shapes)?;
                program.forward(weights, xs, "meta").map_err(|e| match e {
                    Error::Native(m) => self.failed("the model's forward pass failed", m),
                    other => other,
                })
            }
        }
    }

    fn var_store(&self) -> &nn::VarStore {
        match &self.runner {
            Runner::Code { vs, .. } | Runner::Script { vs, .. } | Runner::Program { vs, .. } => vs,
        }
    }

    fn make_inputs(inputs: &[Input]) -> Result<Vec<Tensor>> {
        inputs
            .iter()
            .map(|i| {
                let like = Tensor::empty([0], (i.kind, Device::Cpu));
                ffi::meta_empty(&i.shape, &like)
            })
            .collect()
    }

    /// A dry run's events through the allocator under `options`, and as much of the
    /// predicted step as `analysis` asks for.
    pub(super) fn replayed(
        &self,
        run: &DryRun,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        analysis: Analysis,
    ) -> Result<Estimate> {
        let device = through_allocator(&self.weights, &run.events, &options.device());
        let peak = peak_step(&device);
        let step = match (analysis, peak) {
            (Analysis::Peak, _) | (_, None) => None,
            (_, Some(at)) => {
                let idle = analysis == Analysis::StepAndIdle;
                let vars = self.vars()?;
                let mut names = Names::default();
                let mut sites = (idle && self.user_code).then(SiteNames::new);
                let mut site_name = |aux: i32| {
                    sites
                        .as_mut()
                        .and_then(|s| s.name_in_model(aux))
                        .unwrap_or_else(|| UNKNOWN_SITE.to_string())
                };
                let mut p = predicted_step(
                    &device,
                    at.step,
                    &vars,
                    &mut names,
                    idle.then_some(&mut site_name as &mut dyn FnMut(i32) -> String),
                );
                p.device = format!("{} (predicted)", options.gpu.name);
                Some(p)
            }
        };
        let stats = device.stats;
        let steps = match mode {
            Mode::Inference => 1,
            Mode::Train(_) | Mode::Steps => options.steps.max(1),
        };
        let name = |id: i32| -> Result<String> {
            Ok(match id {
                id if id < 0 => MISSING.to_string(),
                id => ffi::name(id)?.unwrap_or_else(|| MISSING.to_string()),
            })
        };
        Ok(Estimate {
            mode,
            // A user's own step makes its own batch: 0.
            batch: match mode {
                Mode::Steps => 0,
                _ => inputs.first().map_or(1, Input::batch),
            },
            weights_bytes: self.weights_bytes,
            weights_allocated: device.weights,
            baseline_allocated: device.baseline,
            peak_allocated: stats.peak_allocated,
            peak_reserved: stats.peak_reserved,
            peak_requested: stats.peak_requested,
            peak_op: match &step {
                Some(s) => s.peak.op.clone(),
                None => name(peak.map_or(-1, |p| p.op))?,
            },
            peak_layer: step
                .as_ref()
                .map(|s| s.peak.layer.clone())
                .filter(|l| l != MISSING),
            peak_phase: step
                .as_ref()
                .and_then(|s| s.peak.phase)
                .or(peak.map(|p| p.phase))
                .unwrap_or(Phase::Forward),
            peak_step: peak.map_or(1, |p| p.step),
            cublas_workspaces: device.workspaces[..2].iter().filter(|w| **w).count() as u32,
            cublaslt_workspaces: device.workspaces[2..].iter().filter(|w| **w).count() as u32,
            cublas_workspace_bytes: options.gpu.cublas_workspace,
            kernel_workspaces: device.transients,
            largest_kernel_workspace: device.largest_transient,
            bounded_kernel_workspaces: device.bounded_transients,
            allocations: device.allocations,
            elapsed: run.elapsed,
            unknown_frees: device.unknown_frees,
            refused_requests: device.refused_requests,
            host_peak_rss: None,
            not_modelled: &NOT_MODELLED,
            jit_fallback: run.jit_fallback.clone(),
            attention: run.attention,
            autocast: options.autocast,
            step_flops: device.flops / u64::from(steps),
            step,
        })
    }

    /// Step `step` of a dry run in the bytes a CPU run holds (each block its request, no
    /// workspace), through the step timeline's passes: what the checks against a
    /// measured CPU step compare.
    pub(super) fn step_as_requested(
        &self,
        run: &DryRun,
        options: &Options,
        step: u32,
    ) -> Result<crate::timeline::StepProfile> {
        let device = as_requested(&self.weights, &run.events, &options.device());
        Ok(predicted_step(
            &device,
            step,
            &self.vars()?,
            &mut Names::default(),
            None,
        ))
    }

    /// One dry run replayed under each allocator setting of `allocators` (the trace does
    /// not depend on them): an estimate per setting, in their order, with its peak but
    /// not the predicted step ([`Model::replayed`] of the dry run gives it).
    pub(super) fn estimate_each(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        allocators: &[super::AllocatorConfig],
    ) -> Result<(DryRun, Vec<Estimate>)> {
        let run = self.dry_run(inputs, mode, options, false)?;
        let estimates = allocators
            .iter()
            .map(|a| {
                let options = Options {
                    allocator: a.clone(),
                    ..options.clone()
                };
                let replayed = Instant::now();
                let mut e = self.replayed(&run, inputs, mode, &options, Analysis::Peak)?;
                e.elapsed = run.elapsed + replayed.elapsed();
                Ok(e)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((run, estimates))
    }

    /// Predicts the CUDA peak of `mode` at these inputs (the batch is the first size of
    /// the first input), with the anatomy of the predicted step
    /// ([`Estimate::step`]) and what is idle at its peak.
    pub fn estimate(&self, inputs: &[Input], mode: Mode, options: &Options) -> Result<Estimate> {
        let start = Instant::now();
        let run = self.dry_run(inputs, mode, options, self.user_code)?;
        let mut e = self.replayed(&run, inputs, mode, options, Analysis::StepAndIdle)?;
        e.elapsed = start.elapsed();
        e.host_peak_rss = ffi::process_memory().ok().map(|(_, peak)| peak);
        if e.unknown_frees > 0 {
            log::warn!(
                "tch-memprof: the dry run of {} freed {} block(s) it never saw allocated; the predicted peak may be low",
                self.label,
                e.unknown_frees
            );
        }
        Ok(e)
    }

    /// The estimate of `mode` at `inputs` held to `recording`, a recorded CUDA run of
    /// the same step: the dry run's requests to the allocator aligned with the record's,
    /// where they part and with which op ([`Comparison`]).
    pub fn compare(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        recording: &Recording,
    ) -> Result<Comparison> {
        let run = self.dry_run(inputs, mode, options, false)?;
        let device = through_allocator(&self.weights, &run.events, &options.device());
        let peaks = Peaks {
            allocated: device.stats.peak_allocated,
            reserved: device.stats.peak_reserved,
        };
        Ok(Comparison::new(
            recording,
            &device.requests,
            device.weight_requests,
            &mut Names::default(),
            peaks,
        ))
    }
}

/// Whether a TorchScript forward pass failed on sizes that do not fit together: what a
/// traced file run at a shape other than its trace's gives (the trace keeps the sizes
/// it computed from its example input as constants).
fn fixed_shape(msg: &str) -> bool {
    (msg.contains("shape '[") && msg.contains("is invalid for input of size"))
        || msg.contains("must match the size of tensor")
        || msg.contains("Sizes of tensors must match")
        || msg.contains("The expanded size of the tensor")
        || msg.contains("shapes cannot be multiplied")
        || msg.contains("is not broadcastable")
}
