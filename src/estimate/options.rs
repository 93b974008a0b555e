//! The settings of an estimate ([`Options`]): the GPU, the allocator, the training
//! loop's shape (steps, accumulation, checkpointing, where gradients are set to none),
//! attention, autocast and how a TorchScript file runs; and their check against a mode.

use tch::Kind;

use super::{AllocatorConfig, Attention, Gpu, Mode};
use crate::error::{Error, Result};

/// Settings of an estimate.
#[derive(Clone, Debug)]
pub struct Options {
    /// The GPU: its cuBLAS workspace size and its memory (for [`Model::largest_batch`](super::Model::largest_batch)).
    pub gpu: Gpu,
    /// The caching allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`).
    pub allocator: AllocatorConfig,
    /// Training steps replayed (at least 1; default 2: the second runs with the
    /// optimizer's state in memory).
    pub steps: u32,
    /// Micro-batches per training step (gradient accumulation; default 1): each step
    /// runs forward, loss and backward this many times, at the batch of the inputs,
    /// adding into the gradients (set to none before the first), then the optimizer
    /// step once.
    pub accumulate: u32,
    /// How `scaled_dot_product_attention` runs: as CUDA picks for [`Options::gpu`]
    /// (default), or a forced backend (a call the backend cannot take fails the
    /// estimate, saying why).
    pub attention: Attention,
    /// Mixed precision: `Some(Kind::BFloat16)` or `Some(Kind::Half)` runs the forward
    /// pass and the loss as a loop wrapped in CUDA autocast in that dtype runs them
    /// (`tch_memprof::autocast(Device::Cuda(0), dtype, ..)`), backward and the optimizer
    /// step outside it; weights, gradients and optimizer state stay float32. `None`
    /// (default): no autocast.
    pub autocast: Option<Kind>,
    /// Activation checkpointing of a training step, as [`crate::Checkpointed`] runs it:
    /// `Some(k)` checkpoints every `k`-th segment of the model's chain (segments 0, k,
    /// 2k, ...; the last segment never), the others kept; `Some(1)` every segment but
    /// the last. Needs a model given as a chain (a built-in transformer or ResNet,
    /// [`Model::from_segments`](super::Model::from_segments), [`Model::build_chain_on_meta`](super::Model::build_chain_on_meta)). `None` (default): no
    /// checkpointing.
    pub checkpoint: Option<u32>,
    /// A TorchScript file's forward passes as tch runs them by default: through the
    /// graph executor's optimizations (`true`, default), where from the second call a
    /// training forward runs as autodiff subgraphs that keep more for backward than the
    /// ops as written (a dropout's output and mask, even at p=0; under autocast, the
    /// casts the JIT's autocast pass puts into the graph); `false`: as written,
    /// op by op, as in a program that calls
    /// `tch::jit::set_graph_executor_optimize(false)`. Other models: no effect.
    pub jit_optimize: bool,
    /// Training: the gradients are set to none before the forward pass
    /// (`opt.zero_grad()` first, as PyTorch's canonical loop and `Checkpointed`'s do), so
    /// the last step's gradients are gone while the activations grow. `false` (default):
    /// after the forward pass, before backward, as tch's `backward_step` does.
    pub zero_grad_first: bool,
}

/// The autocast dtypes of [`Options::autocast`] by their command-line names.
pub const AUTOCAST_DTYPES: [(&str, Kind); 2] = [("bf16", Kind::BFloat16), ("f16", Kind::Half)];

/// The autocast dtype called `name` (`bf16`, `f16`).
pub fn parse_autocast(name: &str) -> Result<Kind> {
    let lower = name.to_ascii_lowercase();
    AUTOCAST_DTYPES
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(_, k)| *k)
        .ok_or_else(|| Error::InvalidInput {
            name: "autocast",
            value: name.to_string(),
            reason: "autocast computes in bf16 or f16".into(),
        })
}

/// The command-line name of an autocast setting: `bf16`, `f16`, or `off`.
pub fn autocast_name(autocast: Option<Kind>) -> &'static str {
    match autocast {
        None => "off",
        Some(k) => AUTOCAST_DTYPES
            .iter()
            .find(|(_, d)| *d == k)
            .map_or("?", |(n, _)| *n),
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            gpu: Gpu::generic(),
            allocator: AllocatorConfig::default(),
            steps: 2,
            accumulate: 1,
            attention: Attention::Auto,
            autocast: None,
            checkpoint: None,
            jit_optimize: true,
            zero_grad_first: false,
        }
    }
}

impl Options {
    /// The device the replay models under these options: their allocator settings, the
    /// GPU's cuBLAS workspace and cuBLASLt's.
    pub(crate) fn device(&self) -> crate::replay::DeviceModel<'_> {
        crate::replay::DeviceModel {
            allocator: &self.allocator,
            cublas_workspace: self.gpu.cublas_workspace,
            cublaslt_workspace: super::CUBLASLT_WORKSPACE,
        }
    }

    /// Defaults for `gpu`.
    pub fn for_gpu(gpu: Gpu) -> Options {
        Options {
            gpu,
            ..Options::default()
        }
    }

    /// Whether these settings make sense for `mode`: the first that does not, named with
    /// its value and why, in one line. Every estimate and plan checks them first; the
    /// command line reports this error as it is.
    pub fn validate(&self, mode: Mode) -> Result<()> {
        let bad = |name: &'static str, value: String, reason: &str| {
            Err(Error::InvalidInput {
                name,
                value,
                reason: reason.to_string(),
            })
        };
        let train = matches!(mode, Mode::Train(_));
        if self.steps == 0 {
            return bad("steps", "0".into(), "at least one step");
        }
        if mode == Mode::Steps {
            // The user's step is run as written: what it does, it says itself.
            let own = [
                (
                    "accumulate",
                    self.accumulate > 1,
                    self.accumulate.to_string(),
                ),
                (
                    "checkpoint",
                    self.checkpoint.is_some(),
                    format!("{:?}", self.checkpoint),
                ),
                ("zero_grad_first", self.zero_grad_first, "true".to_string()),
                (
                    "autocast",
                    self.autocast.is_some(),
                    format!("{:?}", self.autocast),
                ),
            ];
            if let Some((name, _, value)) = own.into_iter().find(|(_, set, _)| *set) {
                return bad(
                    name,
                    value,
                    "a user's own step runs as written: write it into the step",
                );
            }
        }
        if self.accumulate == 0 {
            return bad(
                "accumulate",
                "0".into(),
                "at least one micro-batch per step",
            );
        }
        if self.accumulate > 1 && !train {
            return bad(
                "accumulate",
                self.accumulate.to_string(),
                "gradient accumulation needs a training step",
            );
        }
        match self.checkpoint {
            Some(0) => {
                return bad(
                    "checkpoint",
                    "0".into(),
                    "checkpoint every k-th segment takes k >= 1",
                )
            }
            Some(k) if !train => {
                return bad(
                    "checkpoint",
                    k.to_string(),
                    "activation checkpointing needs a training step",
                )
            }
            _ => {}
        }
        if self.zero_grad_first && !train {
            return bad(
                "zero_grad_first",
                "true".into(),
                "gradients are set to none in a training step only",
            );
        }
        if !(10..=199).contains(&self.gpu.sm) {
            return bad(
                "GPU compute capability",
                self.gpu.sm.to_string(),
                "write it as major * 10 + minor (80 for 8.0, 90 for 9.0)",
            );
        }
        if let Some(k) = self.autocast {
            if !AUTOCAST_DTYPES.iter().any(|(_, d)| *d == k) {
                return bad(
                    "autocast",
                    format!("{k:?}"),
                    "autocast computes in bf16 or f16",
                );
            }
        }
        Ok(())
    }
}
