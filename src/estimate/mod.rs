//! Will it fit? The CUDA peak of a model, predicted without a GPU.
//!
//! A **dry run** on libtorch's meta device (tensors with shapes and dtypes but no
//! memory) runs the model's forward pass, and for training its backward pass and the
//! optimizer step, as libtorch would run them on CUDA. The native layer logs every
//! allocation and free in order (the meta trace), with the ops that ran; nothing the
//! size of an activation is ever allocated. The sequence is then replayed through a
//! model of PyTorch's CUDA caching allocator ([`allocator`]), which gives the predicted
//! **peak allocated** and **peak reserved** bytes, as `torch.cuda.max_memory_allocated`
//! and `max_memory_reserved` would report them.
//!
//! What a CUDA run allocates that the meta device does not:
//! - **cuBLAS workspace** (modelled): PyTorch takes it from the caching allocator at a
//!   thread's first cuBLAS call (`mm`, `addmm`, `bmm`, ... on CUDA) and keeps it. The
//!   training thread and the autograd engine's CUDA thread (which runs backward) each
//!   get one. Its size depends on the GPU ([`Gpu`]). A batched linear layer with bias
//!   runs on cuBLASLt, which takes a workspace of its own (1 MiB) the same way.
//! - **cuDNN workspaces** (not modelled): cuDNN's heuristics choose a convolution
//!   algorithm at run time and PyTorch allocates its workspace for the span of the
//!   call; see [`Estimate::not_modelled`].
//! - **The CUDA context** (stated apart): the driver's and libraries' own memory, which
//!   `nvidia-smi` shows on top of reserved; never part of PyTorch's numbers.
//!
//! ```no_run
//! use tch_memprof::estimate::{Gpu, Input, Mode, Model, Optimizer, Options};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Model::builtin("resnet50")?;
//! let input = Input::parse("32x3x224x224", None)?;
//! let options = Options::for_gpu(Gpu::named("h100")?);
//! let e = model.estimate(&[input.clone()], Mode::Train(Optimizer::Adam), &options)?;
//! println!("peak allocated {} B, peak reserved {} B", e.peak_allocated, e.peak_reserved);
//! let fit = model.largest_batch(&[input], Mode::Train(Optimizer::Adam), &options, None)?;
//! println!("largest batch that fits: {}", fit.batch);
//! # Ok(()) }
//! ```

pub mod allocator;
pub mod models;
mod gpu;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::ffi::{self, native, MetaEvent};

pub use allocator::{AllocatorConfig, AllocatorStats, CachingAllocator};
pub use gpu::{gpu_memory, parse_size, Gpu, CONTEXT_ALLOWANCE};

/// Bytes in human units, as every report of the crate shows them (`1.50 MiB`).
pub fn format_bytes(n: u64) -> String {
    crate::format::bytes(n)
}

/// The peak resident memory of this process so far (its host memory), when it can be
/// read.
pub fn host_peak_rss() -> Option<u64> {
    ffi::process_memory().ok().map(|(_, peak)| peak)
}

/// Marks the dry run puts into the meta trace (their values).
mod mark {
    pub const FORWARD: i32 = 0;
    pub const BACKWARD: i32 = 1;
    pub const OPTIMIZER: i32 = 2;
    /// The inputs of the first step are on the device: the baseline.
    pub const BASELINE: i32 = 10;
}

/// An optimizer whose step (and state) the estimate of a training step includes: tch's
/// optimizers, which are libtorch's C++ ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum 0.9: one state tensor per parameter.
    SgdMomentum,
    /// Adam: two state tensors per parameter.
    Adam,
    /// AdamW (weight decay 0.01): two state tensors per parameter.
    AdamW,
}

impl Optimizer {
    /// Every optimizer, by its command-line name.
    pub const ALL: [(&'static str, Optimizer); 4] = [
        ("sgd", Optimizer::Sgd),
        ("sgd-momentum", Optimizer::SgdMomentum),
        ("adam", Optimizer::Adam),
        ("adamw", Optimizer::AdamW),
    ];

    /// The optimizer called `name` (`sgd`, `sgd-momentum`, `adam`, `adamw`).
    pub fn parse(name: &str) -> Result<Optimizer> {
        let lower = name.to_ascii_lowercase();
        Self::ALL
            .iter()
            .find(|(n, _)| *n == lower)
            .map(|(_, o)| *o)
            .ok_or_else(|| Error::InvalidConfig {
                name: "optimizer",
                value: name.to_string(),
                reason: format!("unknown; known: {}", Self::ALL.map(|(n, _)| n).join(", ")),
            })
    }

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, o)| *o == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }

    fn build(self, vs: &nn::VarStore) -> std::result::Result<nn::Optimizer, tch::TchError> {
        match self {
            Optimizer::Sgd => nn::Sgd::default().build(vs, 1e-2),
            Optimizer::SgdMomentum => nn::Sgd {
                momentum: 0.9,
                ..Default::default()
            }
            .build(vs, 1e-2),
            Optimizer::Adam => nn::Adam::default().build(vs, 1e-3),
            Optimizer::AdamW => nn::AdamW::default().build(vs, 1e-3),
        }
    }
}

/// What is estimated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One forward pass in evaluation mode under `no_grad`.
    Inference,
    /// Training steps (forward, loss, backward, optimizer step), from a fresh optimizer:
    /// the peak is taken over [`Options::steps`] steps, so that it includes a step that
    /// runs with the optimizer's state already there.
    Train(Optimizer),
}

impl Mode {
    /// `inference`, or `train-<optimizer>`.
    pub fn label(self) -> String {
        match self {
            Mode::Inference => "inference".to_string(),
            Mode::Train(o) => format!("train-{}", o.name()),
        }
    }
}

/// One input of the model: its shape (batch first) and dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// Sizes, the batch first.
    pub shape: Vec<i64>,
    /// Element type.
    pub kind: Kind,
}

/// Dtype names accepted by [`Input::parse`].
const DTYPES: [(&str, Kind); 12] = [
    ("f32", Kind::Float),
    ("float", Kind::Float),
    ("float32", Kind::Float),
    ("f16", Kind::Half),
    ("half", Kind::Half),
    ("float16", Kind::Half),
    ("bf16", Kind::BFloat16),
    ("bfloat16", Kind::BFloat16),
    ("f64", Kind::Double),
    ("i64", Kind::Int64),
    ("int64", Kind::Int64),
    ("i32", Kind::Int),
];

impl Input {
    /// An input of `shape` (batch first) and `kind`.
    pub fn new(shape: &[i64], kind: Kind) -> Input {
        Input {
            shape: shape.to_vec(),
            kind,
        }
    }

    /// Parses `1x3x224x224` (sizes separated by `x`, batch first) and an optional dtype
    /// (`f32` by default; `f16`, `bf16`, `f64`, `i64`, `i32` and their long names).
    pub fn parse(shape: &str, dtype: Option<&str>) -> Result<Input> {
        let bad = |reason: String| Error::InvalidConfig {
            name: "input",
            value: shape.to_string(),
            reason,
        };
        let mut dims = Vec::new();
        for part in shape.split(['x', 'X', ',']) {
            let n: i64 = part.trim().parse().map_err(|_| {
                bad(format!(
                    "{part:?} is not a size (write the sizes separated by x, batch first: 1x3x224x224)"
                ))
            })?;
            if n <= 0 {
                return Err(bad(format!("size {n} must be positive")));
            }
            dims.push(n);
        }
        let kind = match dtype {
            None => Kind::Float,
            Some(d) => {
                let lower = d.to_ascii_lowercase();
                DTYPES
                    .iter()
                    .find(|(n, _)| *n == lower)
                    .map(|(_, k)| *k)
                    .ok_or_else(|| Error::InvalidConfig {
                        name: "dtype",
                        value: d.to_string(),
                        reason: format!("unknown; known: {}", DTYPES.map(|(n, _)| n).join(", ")),
                    })?
            }
        };
        Ok(Input { shape: dims, kind })
    }

    /// The same input at batch `b`.
    pub fn with_batch(&self, b: i64) -> Input {
        let mut shape = self.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = b;
        }
        Input {
            shape,
            kind: self.kind,
        }
    }

    /// The batch (the first size).
    pub fn batch(&self) -> i64 {
        self.shape.first().copied().unwrap_or(1)
    }
}

/// Settings of an estimate.
#[derive(Clone, Debug)]
pub struct Options {
    /// The GPU: its cuBLAS workspace size and its memory (for [`Model::largest_batch`]).
    pub gpu: Gpu,
    /// The caching allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`).
    pub allocator: AllocatorConfig,
    /// Training steps replayed (at least 1; default 2: the second runs with the
    /// optimizer's state in memory).
    pub steps: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            gpu: Gpu::generic(),
            allocator: AllocatorConfig::default(),
            steps: 2,
        }
    }
}

impl Options {
    /// Defaults for `gpu`.
    pub fn for_gpu(gpu: Gpu) -> Options {
        Options {
            gpu,
            ..Options::default()
        }
    }
}

/// Something a CUDA run may allocate that the estimate does not include.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotModelled {
    /// What it is.
    pub what: &'static str,
    /// Its likely size and when it matters.
    pub likely: &'static str,
}

/// The CUDA allocations that are not modelled, with their likely size.
pub const NOT_MODELLED: [NotModelled; 3] = [
    NotModelled {
        what: "cuDNN convolution workspaces",
        likely: "chosen by cuDNN's heuristics at run time, allocated through the caching \
                 allocator for the span of one convolution and freed: they can raise the \
                 peak by the largest one (usually a few MiB to tens of MiB; PyTorch tries \
                 another algorithm when the workspace cannot be allocated)",
    },
    NotModelled {
        what: "cuDNN batch-norm reserve space and workspace (training)",
        likely: "sized by cuDNN at run time; usually zero or small next to the activations",
    },
    NotModelled {
        what: "the CUDA context",
        likely: "the driver's and the CUDA libraries' own memory (kernels of cuBLAS and \
                 cuDNN): not part of allocated or reserved; nvidia-smi shows it on top, \
                 commonly several hundred MiB per process",
    },
];

/// A predicted CUDA peak.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Estimate {
    /// What was estimated.
    pub mode: Mode,
    /// The batch (first size of the first input).
    pub batch: i64,
    /// Bytes of the model's variables (parameters and buffers).
    pub weights_bytes: u64,
    /// Predicted allocated bytes once the weights and the first batch are on the GPU.
    pub baseline_allocated: u64,
    /// Predicted peak allocated bytes (`torch.cuda.max_memory_allocated`).
    pub peak_allocated: u64,
    /// Predicted peak reserved bytes (`torch.cuda.max_memory_reserved`).
    pub peak_reserved: u64,
    /// Bytes the model's requests asked for at the peak of requested bytes (before the
    /// allocator's rounding).
    pub peak_requested: u64,
    /// The op that was running when allocated peaked.
    pub peak_op: String,
    /// Its phase: forward, backward or optimizer.
    pub peak_phase: &'static str,
    /// The training step (1-based) whose peak is the run's peak; 1 for inference.
    pub peak_step: u32,
    /// cuBLAS workspaces charged (one per thread that ran a cuBLAS op).
    pub cublas_workspaces: u32,
    /// cuBLASLt workspaces charged (one per thread that ran an `addmm` CUDA runs on
    /// cuBLASLt: a batched linear layer with bias), [`gpu::CUBLASLT_WORKSPACE`] each.
    pub cublaslt_workspaces: u32,
    /// Size of one cuBLAS workspace on this GPU.
    pub cublas_workspace_bytes: u64,
    /// Allocations the dry run made.
    pub allocations: u64,
    /// Time of the dry run and of the replay.
    pub elapsed: Duration,
    /// What a CUDA run may add that is not modelled.
    pub not_modelled: &'static [NotModelled],
}

/// The largest batch that fits (see [`Model::largest_batch`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Fit {
    /// The memory the reserved peak must stay within.
    pub memory: u64,
    /// The largest batch whose predicted peak reserved fits; 0 when not even batch 1 does.
    pub batch: i64,
    /// The estimate at that batch.
    pub fits: Option<Estimate>,
    /// The estimate at the smallest batch tried that does not fit.
    pub too_big: Option<Estimate>,
    /// Estimates run during the search.
    pub tries: u32,
}

impl Fit {
    /// Memory left at the largest batch that fits (memory - its peak reserved).
    pub fn margin(&self) -> Option<u64> {
        self.fits
            .as_ref()
            .map(|e| self.memory.saturating_sub(e.peak_reserved))
    }
}

type ForwardFn = Box<dyn Fn(&[Tensor], bool) -> Tensor>;

enum Runner {
    Code {
        vs: nn::VarStore,
        forward: ForwardFn,
    },
    Script {
        module: ffi::ScriptModule,
        vs: nn::VarStore,
    },
}

/// A model on the meta device, ready for estimates: its weights hold no memory.
pub struct Model {
    runner: Runner,
    /// The meta trace of the weights' allocations, in the order a CUDA run makes them.
    weights: Vec<MetaEvent>,
    weights_bytes: u64,
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

    fn finish(self) -> Result<Vec<MetaEvent>> {
        let mut events = Vec::new();
        let complete = ffi::meta_read(&mut events)?;
        drop(self);
        if !complete {
            return Err(Error::Native(format!(
                "the dry run made more than {} allocator events; the estimate would be incomplete",
                native::META_CAPACITY
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

/// Runs `f`, turning a panic of the model's code (tch panics on libtorch errors, such as
/// a shape a layer rejects) into an error.
fn catching<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".to_string());
        Error::Run(format!("{what}: {}", torch_message(&msg)))
    })
}

/// The first line of libtorch's message inside a tch panic or error text (without
/// `called Result::unwrap()...Torch("` and the C++ backtrace).
fn torch_message(text: &str) -> String {
    let start = text.find("Torch(\"").map_or(0, |i| i + 7);
    let rest = &text[start..];
    let end = ["\\n", "\n", "Exception raised from", "\")"]
        .iter()
        .filter_map(|pat| rest.find(pat))
        .min()
        .unwrap_or(rest.len());
    let line = rest[..end].trim();
    if line.is_empty() {
        "failed".to_string()
    } else {
        line.to_string()
    }
}

/// The variables of `vs` in the order tch created them: trainable variables keep their
/// creation order; each buffer goes just before the first trainable variable of its
/// module (tch's batch norm creates its running statistics first), and buffers of
/// modules without trainable variables go last, by name.
fn creation_order(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let named = vs.variables();
    let by_ptr: HashMap<usize, &String> = named
        .iter()
        .filter(|(_, t)| t.numel() > 0)
        .map(|(n, t)| (t.data_ptr() as usize, n))
        .collect();
    let trainable: Vec<String> = vs
        .trainable_variables()
        .iter()
        .filter(|t| t.numel() > 0)
        .filter_map(|t| by_ptr.get(&(t.data_ptr() as usize)).map(|n| (*n).clone()))
        .collect();
    let parent = |n: &str| n.rsplit_once('.').map_or("", |(p, _)| p).to_string();
    let mut buffers: Vec<&String> = named.keys().filter(|n| !trainable.contains(n)).collect();
    buffers.sort();
    let mut order: Vec<String> = Vec::with_capacity(named.len());
    for t in &trainable {
        let p = parent(t);
        buffers.retain(|b| {
            if parent(b) == p {
                order.push((*b).clone());
                false
            } else {
                true
            }
        });
        order.push(t.clone());
    }
    order.extend(buffers.into_iter().cloned());
    order
        .into_iter()
        .filter_map(|n| named.get(&n).map(|t| (n.clone(), t.shallow_clone())))
        .collect()
}

fn live_bytes(events: &[MetaEvent]) -> u64 {
    let mut live: i64 = 0;
    for e in events {
        match e.kind {
            native::META_ALLOC => live += e.bytes,
            native::META_FREE => live -= e.bytes,
            _ => {}
        }
    }
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
            return Err(Error::InvalidConfig {
                name: "VarStore device",
                value: format!("{:?}", vs.device()),
                reason: "build the model on the CPU: the estimator moves it to the meta device"
                    .into(),
            });
        }
        let vars = creation_order(&vs);
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
        })
    }

    /// A tch module (`ModuleT`) over `vs`, called with the first input.
    pub fn from_module<M>(vs: nn::VarStore, module: M) -> Result<Model>
    where
        M: nn::ModuleT + 'static,
    {
        Model::from_var_store(vs, move |xs, train| module.forward_t(&xs[0], train))
    }

    /// A TorchScript file (`torch.jit.trace` / `torch.jit.script`, saved with
    /// `.save()`), loaded straight onto the meta device: the weights' bytes are read from
    /// the file and dropped, in the file's order, which is the order a CUDA load
    /// allocates them.
    pub fn torchscript(path: &Path) -> Result<Model> {
        if !path.is_file() {
            return Err(Error::Run(format!(
                "{}: no such file (a TorchScript model saved with torch.jit.save)",
                path.display()
            )));
        }
        let trace = Trace::begin()?;
        let module = ffi::ScriptModule::load(path).map_err(|e| {
            Error::Run(format!(
                "{}: cannot load as TorchScript: {e}",
                path.display()
            ))
        })?;
        let weights = trace.finish()?;
        let weights_bytes = live_bytes(&weights);
        let vs = nn::VarStore::new(Device::Cpu);
        for (name, t) in module.tensors(false)? {
            let _ = vs.root().add(&name.replace('.', "_"), t, true);
        }
        Ok(Model {
            runner: Runner::Script { module, vs },
            weights,
            weights_bytes,
        })
    }

    /// A built-in model by name ([`models::BUILTIN`]), 1000 classes.
    pub fn builtin(name: &str) -> Result<Model> {
        let vs = nn::VarStore::new(Device::Cpu);
        let module = models::build(name, &vs.root(), 1000)?;
        Model::from_var_store(vs, move |xs, train| module.forward_t(&xs[0], train))
    }

    /// Bytes of the model's variables.
    pub fn weights_bytes(&self) -> u64 {
        self.weights_bytes
    }

    fn forward(&self, xs: &[Tensor], train: bool) -> Result<Tensor> {
        match &self.runner {
            Runner::Code { forward, .. } => {
                catching("the model's forward pass failed", || forward(xs, train))
            }
            Runner::Script { module, .. } => module.forward(xs).map_err(|e| {
                Error::Run(format!(
                    "the model's forward pass failed: {}",
                    torch_message(&e.to_string())
                ))
            }),
        }
    }

    fn set_train(&self, on: bool) -> Result<()> {
        if let Runner::Script { module, .. } = &self.runner {
            module.set_train(on)?;
        }
        Ok(())
    }

    fn var_store(&self) -> &nn::VarStore {
        match &self.runner {
            Runner::Code { vs, .. } | Runner::Script { vs, .. } => vs,
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

    /// The dry run: the meta trace of `mode` at these inputs.
    fn dry_run(&self, inputs: &[Input], mode: Mode, steps: u32) -> Result<Vec<MetaEvent>> {
        if inputs.is_empty() {
            return Err(Error::InvalidConfig {
                name: "input",
                value: "(none)".into(),
                reason: "the model needs at least one input shape".into(),
            });
        }
        let trace = Trace::begin()?;
        match mode {
            Mode::Inference => {
                self.set_train(false)?;
                let xs = Model::make_inputs(inputs)?;
                ffi::meta_mark(mark::BASELINE)?;
                ffi::meta_mark(mark::FORWARD)?;
                let y = tch::no_grad(|| self.forward(&xs, false))?;
                drop(y);
                drop(xs);
            }
            Mode::Train(opt) => {
                self.set_train(true)?;
                let mut o = opt
                    .build(self.var_store())
                    .map_err(|e| Error::Native(format!("building the optimizer: {e}")))?;
                let result = (|| -> Result<()> {
                    for step in 0..steps.max(1) {
                        let xs = Model::make_inputs(inputs)?;
                        if step == 0 {
                            ffi::meta_mark(mark::BASELINE)?;
                        }
                        ffi::meta_mark(mark::FORWARD)?;
                        let out = self.forward(&xs, true)?;
                        let loss = catching("the loss failed", || -> Result<Tensor> {
                            let float = matches!(
                                out.kind(),
                                Kind::Float | Kind::Half | Kind::BFloat16 | Kind::Double
                            );
                            if !float {
                                return Err(Error::Run(format!(
                                    "the model's output has dtype {:?}: training needs a floating-point output",
                                    out.kind()
                                )));
                            }
                            Ok(if out.dim() == 2 {
                                // Class scores: cross-entropy against one class per row.
                                let like = Tensor::empty([0], (Kind::Int64, Device::Cpu));
                                let target = ffi::meta_empty(&[out.size()[0]], &like)?;
                                out.cross_entropy_for_logits(&target)
                            } else {
                                out.mean(out.kind())
                            })
                        })??;
                        ffi::meta_mark(mark::BACKWARD)?;
                        o.zero_grad();
                        catching("the backward pass failed", || loss.backward())?;
                        ffi::meta_mark(mark::OPTIMIZER)?;
                        catching("the optimizer step failed", || o.step())?;
                        drop(loss);
                        drop(out);
                        drop(xs);
                    }
                    Ok(())
                })();
                // Gradients back to none, state dropped, whatever happened.
                o.zero_grad();
                drop(o);
                self.set_train(false)?;
                result?;
            }
        }
        trace.finish()
    }

    /// Predicts the CUDA peak of `mode` at these inputs (the batch is the first size of
    /// the first input).
    pub fn estimate(&self, inputs: &[Input], mode: Mode, options: &Options) -> Result<Estimate> {
        let start = Instant::now();
        let run = self.dry_run(inputs, mode, options.steps)?;
        let mut e = replay(&self.weights, &run, options)?;
        e.mode = mode;
        e.batch = inputs.first().map_or(1, Input::batch);
        e.weights_bytes = self.weights_bytes;
        e.elapsed = start.elapsed();
        Ok(e)
    }

    /// The largest batch whose predicted peak reserved fits in `memory` (default: the
    /// GPU's usable memory, [`Gpu::usable`]): batches 1, 2, 4, ... until one does not
    /// fit, then a bisection between the last two.
    pub fn largest_batch(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        memory: Option<u64>,
    ) -> Result<Fit> {
        let memory = match memory {
            Some(m) => m,
            None => options.gpu.usable().ok_or_else(|| Error::InvalidConfig {
                name: "memory",
                value: options.gpu.name.clone(),
                reason: "this GPU's memory is unknown: give the memory (80GiB) or a GPU name"
                    .into(),
            })?,
        };
        const MAX_BATCH: i64 = 1 << 24;
        let mut tries = 0;
        let mut at = |b: i64| -> Result<Estimate> {
            tries += 1;
            let xs: Vec<Input> = inputs.iter().map(|i| i.with_batch(b)).collect();
            self.estimate(&xs, mode, options)
        };
        let mut fits: Option<Estimate> = None;
        let mut too_big: Option<Estimate> = None;
        let mut b = 1;
        while b <= MAX_BATCH {
            let e = at(b)?;
            if e.peak_reserved <= memory {
                fits = Some(e);
                b *= 2;
            } else {
                too_big = Some(e);
                break;
            }
        }
        if let (Some(lo), Some(hi)) = (&fits, &too_big) {
            let (mut lo_b, mut hi_b) = (lo.batch, hi.batch);
            while hi_b - lo_b > 1 {
                let mid = lo_b + (hi_b - lo_b) / 2;
                let e = at(mid)?;
                if e.peak_reserved <= memory {
                    lo_b = mid;
                    fits = Some(e);
                } else {
                    hi_b = mid;
                    too_big = Some(e);
                }
            }
        }
        Ok(Fit {
            memory,
            batch: fits.as_ref().map_or(0, |e| e.batch),
            fits,
            too_big,
            tries,
        })
    }
}

/// Ids of the cuBLAS workspaces in the replay (meta block ids start at 1 and stay far
/// below).
const WORKSPACE_ID: u64 = u64::MAX - 16;

/// Replays the weights' and the run's meta traces through the caching allocator model.
fn replay(weights: &[MetaEvent], run: &[MetaEvent], options: &Options) -> Result<Estimate> {
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
    let mut phase = "forward";
    let mut step = 0u32;
    let mut op: i32 = -1;
    let mut workspaces = [false; 4]; // cuBLAS: user, autograd thread; cuBLASLt: same
    let mut peak = alloc.stats().allocated;
    let mut peak_op = -1;
    let mut peak_phase = "forward";
    let mut peak_step = 1;
    let mut allocations = 0u64;
    for e in run {
        match e.kind {
            native::META_ALLOC | native::META_BLAS => {
                if e.kind == native::META_ALLOC {
                    allocations += 1;
                    alloc.malloc(e.id, e.bytes as u64);
                } else {
                    // The autograd engine's CUDA thread runs backward with a handle (and
                    // workspaces) of its own. A cuBLASLt call gets its handle through
                    // the cuBLAS one, so it takes the cuBLAS workspace first, then its own.
                    let thread = usize::from(phase == "backward");
                    let mut wants = vec![(thread, options.gpu.cublas_workspace)];
                    if e.bytes == 1 {
                        wants.push((2 + thread, gpu::CUBLASLT_WORKSPACE));
                    }
                    for (slot, size) in wants {
                        if !workspaces[slot] && size > 0 {
                            workspaces[slot] = true;
                            alloc.malloc(WORKSPACE_ID + slot as u64, size);
                        }
                    }
                }
                let now = alloc.stats().allocated;
                if now > peak {
                    peak = now;
                    peak_op = op;
                    peak_phase = phase;
                    peak_step = step.max(1);
                }
            }
            native::META_FREE => alloc.free(e.id),
            native::META_OP => op = e.name,
            native::META_MARK => match e.bytes as i32 {
                mark::BASELINE => baseline = alloc.stats().allocated,
                mark::FORWARD => {
                    phase = "forward";
                    step += 1;
                }
                mark::BACKWARD => phase = "backward",
                mark::OPTIMIZER => phase = "optimizer",
                _ => {}
            },
            _ => {}
        }
    }
    let stats = alloc.stats();
    let peak_op = if peak_op < 0 {
        crate::names::MISSING.to_string()
    } else {
        ffi::name(peak_op)?.unwrap_or_else(|| crate::names::MISSING.to_string())
    };
    Ok(Estimate {
        mode: Mode::Inference,
        batch: 1,
        weights_bytes: 0,
        baseline_allocated: baseline,
        peak_allocated: stats.peak_allocated,
        peak_reserved: stats.peak_reserved,
        peak_requested: stats.peak_requested,
        peak_op,
        peak_phase,
        peak_step,
        cublas_workspaces: workspaces[..2].iter().filter(|w| **w).count() as u32,
        cublaslt_workspaces: workspaces[2..].iter().filter(|w| **w).count() as u32,
        cublas_workspace_bytes: options.gpu.cublas_workspace,
        allocations,
        elapsed: Duration::ZERO,
        not_modelled: &NOT_MODELLED,
    })
}
