//! Will it fit? The CUDA peak of a model, predicted without a GPU.
//!
//! A **dry run** on libtorch's meta device (tensors with shapes and dtypes but no
//! memory) runs the model's forward pass, and for training its backward pass and the
//! optimizer step, as libtorch would run them on CUDA. The native layer logs every
//! allocation and free in order (the meta trace), with the ops that ran; nothing the
//! size of an activation is ever allocated. The sequence is then replayed through a
//! model of PyTorch's CUDA caching allocator ([`CachingAllocator`]), which gives the predicted
//! **peak allocated** and **peak reserved** bytes, as `torch.cuda.max_memory_allocated`
//! and `max_memory_reserved` would report them.
//!
//! What a CUDA run allocates that the meta device does not:
//! - **cuBLAS workspace** (modelled): PyTorch takes it from the caching allocator at a
//!   thread's first cuBLAS call (`mm`, `addmm`, `bmm`, ... on CUDA) and keeps it. The
//!   training thread and the autograd engine's CUDA thread (which runs backward) each
//!   get one. Its size depends on the GPU ([`Gpu`]). A batched linear layer with bias
//!   runs on cuBLASLt, which takes a workspace of its own (1 MiB) the same way.
//! - **cuDNN convolution workspaces** (measured, else on the safe side): cuDNN's
//!   heuristics choose a convolution's execution plan at run time and PyTorch allocates
//!   its workspace for the span of the call. On a GPU of compute capability 9.0 with 132
//!   multiprocessors (the H200, the H100 SXM), a call measured on an H200 is charged
//!   what it took; any other call, and every call on another GPU, the larger plausible
//!   workspace the measured calls give. Where a workspace is not known request by
//!   request, the peak reserved is the largest of the replays with them as charged,
//!   without them, and at the larger plausible size. docs/estimate.md says which models
//!   and calls were measured and the rule for the rest. Other kernels' workspaces: see
//!   [`Estimate::not_modelled`].
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

mod compare;
mod gpu;
mod model;
mod options;
mod parallel;
mod plan;
pub mod recorded;
#[doc(hidden)]
pub mod trace;

#[cfg(test)]
mod attention_tests;

use std::time::Duration;

use tch::nn::{self, OptimizerConfig};
use tch::Kind;

use crate::error::{Error, Result};
use crate::phase::Phase;
use crate::timeline::{IdleAtPeak, StepProfile};

pub use crate::replay::allocator::{
    AllocatorConfig, AllocatorStats, CachingAllocator, PoolState, SegmentState,
};
pub use crate::workload::Input;
pub use compare::{Comparison, Divergence};
pub use gpu::Gpu;
pub(crate) use gpu::{gpu_memory, CONTEXT_ALLOWANCE, CUBLASLT_WORKSPACE};
pub(crate) use model::{GpuPlans, Sharding, MOST_GPUS};
pub use model::{Model, RankEstimate, Segment};
pub use options::Options;
pub(crate) use options::{autocast_name, parse_autocast};
pub(crate) use parallel::{mixed_dtype_name, parse_mixed_dtype};
pub use parallel::{Ddp, Fsdp, ShardedCategory};
pub(crate) use plan::allocator_candidates;
pub use plan::{breakdown, Config, Cost, Dominant, Plan, Plans};

pub(crate) use gpu::is_size;
pub use plan::THIN_MARGIN;
pub(crate) use plan::{dtype_name, every_segment, lever_words};

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
        by_name(&Self::ALL, "optimizer", name)
    }

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        name_in(&Self::ALL, self)
    }

    /// The tch optimizer over `vs` whose step the estimate runs: SGD at learning rate
    /// 0.01 (momentum 0.9 for [`SgdMomentum`](Optimizer::SgdMomentum)), Adam and AdamW
    /// at 0.001 with tch's defaults. The learning rate moves no byte; the optimizer's
    /// kind does.
    pub fn build(self, vs: &nn::VarStore) -> std::result::Result<nn::Optimizer, tch::TchError> {
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

/// The value called `name` (any case) in `table`, a list of choices by their
/// command-line names; an error naming `what`, the value and the known names otherwise.
fn by_name<T: Copy>(table: &[(&'static str, T)], what: &'static str, name: &str) -> Result<T> {
    let lower = name.to_ascii_lowercase();
    table
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(_, v)| *v)
        .ok_or_else(|| Error::InvalidInput {
            name: what,
            value: name.to_string(),
            reason: format!(
                "unknown; known: {}",
                table.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ),
        })
}

/// The command-line name of `value` in `table`.
fn name_in<T: PartialEq>(table: &[(&'static str, T)], value: T) -> &'static str {
    table
        .iter()
        .find(|(_, v)| *v == value)
        .map(|(n, _)| *n)
        .unwrap_or("?")
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
    /// The user's own steps, run as written ([`Model::estimate_steps`]): their batch,
    /// loss, backward, optimizer and whatever else a step of theirs does.
    Steps,
}

impl Mode {
    /// `inference`, `train-<optimizer>`, or `steps` (the user's own).
    pub fn label(self) -> String {
        match self {
            Mode::Inference => "inference".to_string(),
            Mode::Train(o) => format!("train-{}", o.name()),
            Mode::Steps => "steps".to_string(),
        }
    }
}

/// How the dry run runs `scaled_dot_product_attention`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attention {
    /// As PyTorch 2.11's CUDA build picks for the GPU ([`Gpu::sm`]), the dtype, head
    /// sizes, mask, dropout, causality and grouped-query heads of each call.
    #[default]
    Auto,
    /// Flash attention (f16/bf16, no mask).
    Flash,
    /// Memory-efficient attention (CUTLASS).
    Efficient,
    /// cuDNN attention (f16/bf16, compute capability 8.0 and up).
    Cudnn,
    /// The math (reference) path: the batch x heads x L x S scores kept for backward.
    Math,
}

impl Attention {
    /// Every choice, by its command-line name.
    pub const ALL: [(&'static str, Attention); 5] = [
        ("auto", Attention::Auto),
        ("flash", Attention::Flash),
        ("efficient", Attention::Efficient),
        ("cudnn", Attention::Cudnn),
        ("math", Attention::Math),
    ];

    /// The choice called `name` (`auto`, `flash`, `efficient`, `cudnn`, `math`).
    pub fn parse(name: &str) -> Result<Attention> {
        by_name(&Self::ALL, "attention", name)
    }

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        name_in(&Self::ALL, self)
    }

    /// The backend the dry run is told to take.
    pub(crate) fn backend(self) -> crate::ffi::SdpaBackend {
        use crate::ffi::SdpaBackend;
        match self {
            Attention::Auto => SdpaBackend::Auto,
            Attention::Flash => SdpaBackend::Flash,
            Attention::Efficient => SdpaBackend::Efficient,
            Attention::Cudnn => SdpaBackend::Cudnn,
            Attention::Math => SdpaBackend::Math,
        }
    }
}

/// The `scaled_dot_product_attention` calls of an estimate's dry run, by the backend
/// that ran them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionRuns {
    /// Flash attention.
    pub flash: u64,
    /// Memory-efficient attention.
    pub efficient: u64,
    /// cuDNN attention.
    pub cudnn: u64,
    /// The math path.
    pub math: u64,
}

impl AttentionRuns {
    /// The backends that ran, by name, joined with `+` (`efficient`, `flash+math`), or
    /// `none` when the model has no attention.
    pub fn label(&self) -> String {
        let ran: Vec<&str> = [
            ("flash", self.flash),
            ("efficient", self.efficient),
            ("cudnn", self.cudnn),
            ("math", self.math),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, _)| *name)
        .collect();
        if ran.is_empty() {
            "none".to_string()
        } else {
            ran.join("+")
        }
    }
}

/// Whether the file at `path` is an exported program (a `.pt2` archive of
/// `torch.export.save`) rather than a TorchScript file: read from its contents, not its
/// name.
pub(crate) fn is_exported_program(path: &std::path::Path) -> bool {
    crate::program::is_program(path)
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
pub(crate) const NOT_MODELLED: [NotModelled; 3] = [
    NotModelled {
        what: "cuDNN batch-norm reserve space and workspace (training)",
        likely: "sized by cuDNN at run time; usually zero or small next to the activations",
    },
    NotModelled {
        what: "attention workspaces",
        likely: "flash attention's split-KV buffers (inference at small batch x \
                 heads): taken inside the attention call and freed",
    },
    NotModelled {
        what: "the CUDA context",
        likely: "the driver's and the CUDA libraries' own memory (kernels of cuBLAS and \
                 cuDNN): not part of allocated or reserved; nvidia-smi shows it on top, \
                 commonly several hundred MiB per process",
    },
];

/// How much more eager PyTorch running a model's original module allocated at its peak
/// than the estimate of the same model's traced file, at most, as a share of the
/// estimate's peak allocated: inference, then training (f32 and bf16 autocast). Measured
/// on an NVIDIA H200 with PyTorch 2.11 over 42 cases of 19 real-world models
/// (`tests/data/gpu-truth/h200-2026-11-26`); `tests/gpu_truth.rs` holds these to the
/// measurements. Mostly Python's locals, which eager code holds until a module's forward
/// returns and the file frees after their last use, and grouped-query attention, which
/// eager transformers runs on another kernel than its traced file (docs/estimate.md).
pub const EAGER_ABOVE: (f64, f64) = (0.210, 0.290);

/// A predicted CUDA peak.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Estimate {
    /// What was estimated.
    pub mode: Mode,
    /// The batch (first size of the first input); 0 for a user's own step
    /// ([`Mode::Steps`]), which makes its own batch.
    pub batch: i64,
    /// Bytes of the model's variables (parameters and buffers).
    pub weights_bytes: u64,
    /// The same variables as the caching allocator holds them: each block's size (its
    /// request rounded up to 512 B, and the rest of a segment too small to split), what
    /// `torch.cuda.memory_allocated()` reads once the model is on the GPU.
    pub weights_allocated: u64,
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
    /// The layer of that op, as the predicted step names it ([`StepProfile`]): the module
    /// of a TorchScript file it ran in (`blocks.0.attn`, as `named_modules()` names it),
    /// the layer of the variable it read (`transformer.h.3.mlp.c_fc`), a backward node's
    /// forward op's; `None` without the predicted step, or before the first layer.
    pub peak_layer: Option<String>,
    /// Its phase.
    pub peak_phase: Phase,
    /// The training step (1-based) whose peak is the run's peak (the last such step);
    /// 1 for inference.
    pub peak_step: u32,
    /// cuBLAS workspaces charged (one per thread that ran a cuBLAS op).
    pub cublas_workspaces: u32,
    /// cuBLASLt workspaces charged (one per thread that ran an `addmm` CUDA runs on
    /// cuBLASLt: a batched linear layer with bias), 1 MiB each (PyTorch 2.11's default).
    pub cublaslt_workspaces: u32,
    /// Size of one cuBLAS workspace on this GPU.
    pub cublas_workspace_bytes: u64,
    /// Kernels' workspaces charged, taken and freed inside one call each: cuDNN's
    /// convolutions' (forward and backward: as measured where the GPU's table has the
    /// call, else at the larger plausible size; see the module's docs), cuDNN
    /// attention's forward one, the memory-efficient and cuDNN attention backward's,
    /// and the staging buffers and semaphores of CUDA's sums and means that split
    /// across thread blocks.
    pub kernel_workspaces: u64,
    /// The largest of them, as the allocator charges it.
    pub largest_kernel_workspace: u64,
    /// Of them, the convolutions' charged at the larger plausible size: no measurement
    /// of that call on a GPU like the one estimated for.
    pub bounded_kernel_workspaces: u64,
    /// Allocations the dry run made.
    pub allocations: u64,
    /// Time of the dry run and of the replay.
    pub elapsed: Duration,
    /// Frees the replay saw of blocks it never saw allocated (0 for a complete trace;
    /// more means the dry run's trace missed allocations and the peak may be low).
    pub unknown_frees: u64,
    /// Requests the modelled allocator refused (1 EiB or more), as PyTorch's would.
    pub refused_requests: u64,
    /// The peak resident memory of this process on the host when the estimate ended,
    /// when it can be read (what the dry run cost on the machine that ran it).
    pub host_peak_rss: Option<u64>,
    /// What a CUDA run may add that is not modelled.
    pub not_modelled: &'static [NotModelled],
    /// A TorchScript file estimated as written although [`Options::jit_optimize`] asked
    /// for the graph executor's optimized graph, which failed on the dry run's meta
    /// tensors (its message): the prediction may be low for training.
    pub jit_fallback: Option<String>,
    /// The dry run's attention calls, by the backend that ran them.
    pub attention: AttentionRuns,
    /// The autocast dtype the step ran under ([`Options::autocast`]).
    pub autocast: Option<Kind>,
    /// FLOPs of one step (training: forward, loss, backward and optimizer step, the
    /// recomputation of checkpointed segments included; inference: the forward pass), as
    /// the step anatomy counts them (docs/step-anatomy.md): the dry run's FLOPs divided
    /// by its steps.
    pub step_flops: u64,
    /// The predicted step, as a profiled step's anatomy reads: live bytes by category
    /// after every op (in the bytes the caching allocator charges, the workspaces
    /// included, so its peak is [`Estimate::peak_allocated`] whenever the run peaks in a
    /// step, as it does unless building the model on meta made a temporary larger than
    /// any step holds), the peak's split by category, layers with their FLOPs, and (from
    /// [`Model::estimate`]) the blocks idle at the peak. The step is the training step
    /// whose peak is the run's peak (the last such step), or the inference. `None` when
    /// the dry run made no step, and in the plan's search.
    pub step: Option<StepProfile>,
}

impl Estimate {
    /// What a `drop` would save: the blocks live at the predicted peak that no op reads
    /// again, with the predicted step's peak had they been freed right after their last
    /// reads (docs/step-anatomy.md); `None` where it was not analysed (the plan's
    /// configurations).
    pub fn idle(&self) -> Option<&IdleAtPeak> {
        self.step.as_ref().and_then(|s| s.idle.as_ref())
    }
}

/// The largest batch that fits (see [`Model::largest_batch`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Fit {
    /// The memory the reserved peak must stay within.
    pub memory: u64,
    /// The largest batch whose predicted peak reserved fits; 0 when not even batch 1 does.
    pub batch: i64,
    /// The estimate at that batch ([`Model::estimate`]: with the predicted step).
    pub fits: Option<Estimate>,
    /// The estimate at the smallest batch tried that does not fit: its peaks, without
    /// the predicted step.
    pub too_big: Option<Estimate>,
    /// Estimates run during the search.
    pub tries: u32,
    /// The batches the model takes, where it bounds them: an exported program's batch
    /// dimension (its range constraint; a static program's own batch, first = last).
    /// The search stays inside it, so [`batch`](Self::batch) at its last is the
    /// program's limit, not the memory's ([`Fit::program_limited`]).
    pub batches: Option<(i64, i64)>,
}

impl Fit {
    /// Whether the answer is the program's bound rather than the memory's: the program
    /// takes one batch only (exported with static sizes), or the search reached the last
    /// batch of its range still fitting. A larger batch may fit: the program must be
    /// exported with a (larger) dynamic batch to find it.
    pub fn program_limited(&self) -> bool {
        match self.batches {
            Some((first, last)) => first == last || (self.fits.is_some() && self.batch >= last),
            None => false,
        }
    }

    /// Whether the program takes a single batch (exported without `dynamic_shapes`).
    pub fn fixed_batch(&self) -> bool {
        matches!(self.batches, Some((first, last)) if first == last)
    }

    /// Memory left at the largest batch that fits (memory - its peak reserved).
    pub fn margin(&self) -> Option<u64> {
        self.fits
            .as_ref()
            .map(|e| self.memory.saturating_sub(e.peak_reserved))
    }
}
