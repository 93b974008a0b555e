//! The columns of every CSV file of a run, defined once: the profiler writes these rows
//! (`csv::Writer::serialize`) and [`Run::open`](super::Run::open) reads them back
//! (`csv::StringRecord::deserialize`), so a column cannot be renamed on one side only.
//! The meaning of each column is in `docs/csv.md`. The rows of `tch-memprof estimate
//! --csv` and `tch-memprof plan --csv` are here too ([`EstimateRow`], [`PlanRow`]).

use serde::{Deserialize, Serialize};

use crate::phase::Phase;

/// `<run>_summary.csv`: one row per reported iteration (required).
pub const SUMMARY: &str = "_summary.csv";
/// `<run>_epochs.csv`: one row per `epoch_end`.
pub const EPOCHS: &str = "_epochs.csv";
/// `<run>_parameters.csv`: every variable and gradient, the whole set at each report where
/// it changed and at each epoch's first report.
pub const PARAMETERS: &str = "_parameters.csv";
/// `<run>_layers.csv`: the profiled step's layers (with the step timeline on).
pub const LAYERS: &str = "_layers.csv";
/// `<run>_run.csv`'s key saying where the profiled step's files are, and its one value:
/// `plain`, the folder's `timeline.csv`, `layers.csv` and `idle.csv` (`tch-memprof
/// profile`), that one step being the run's only and so its peak step.
pub(crate) const STEP_FILES: (&str, &str) = ("step_files", "plain");

/// `<run>_timeline.csv`: the profiled step op by op (with the step timeline on).
pub const TIMELINE: &str = "_timeline.csv";
/// `<run>_idle.csv`: the blocks idle at the profiled step's peak (with `idle_at_peak`).
pub const IDLE: &str = "_idle.csv";
/// `<run>_leaks.csv`: leak suspects, once there is one.
pub const LEAKS: &str = "_leaks.csv";
/// `<run>_run.csv`: what made the run, as `key,value` rows.
pub const META: &str = "_run.csv";

/// A row of `<run>_summary.csv`. The `cuda_*` columns are written by CUDA runs only
/// (empty where the caching allocator's statistics could not be read) and are absent
/// from CPU runs; read back, they are `None` when absent or empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SummaryRow {
    /// When the row was written: the machine's local time, `2026-11-26 20:31:07.123`, a
    /// form spreadsheets read as a date and time (the run's UTC offset is in the run
    /// file's `started`).
    pub timestamp: String,
    /// The epoch, from 1.
    pub epoch: u64,
    /// The iteration within its epoch, from 1.
    pub iteration: u64,
    /// `cpu`, `cuda:0`, ...
    pub device: String,
    /// Live bytes when `record_stats` ran.
    pub allocated_bytes: u64,
    /// The highest live bytes during the iteration.
    pub peak_allocated_bytes: u64,
    /// CUDA: the caching allocator's reserved bytes; CPU: the process's resident memory,
    /// whose column CPU runs name `resident_bytes` (`RESIDENT_COLUMNS`).
    #[serde(alias = "resident_bytes")]
    pub reserved_bytes: u64,
    /// The peak of `reserved_bytes` (CPU runs: `peak_resident_bytes`).
    #[serde(alias = "peak_resident_bytes")]
    pub peak_reserved_bytes: u64,
    /// Trainable variables' storage.
    pub weights_bytes: u64,
    /// Other variables' storage (batch-norm running statistics).
    pub buffers_bytes: u64,
    /// Weight gradients' storage.
    pub gradients_bytes: u64,
    /// Forward bytes still live when backward started (the largest over backward passes).
    pub feature_maps_bytes: u64,
    /// The peak, during backward, of live backward bytes that are not weight gradients.
    pub intermediate_gradients_bytes: u64,
    /// Bytes born in optimizer steps that are still live.
    pub optimizer_state_bytes: u64,
    /// Allocated less weights, buffers, gradients and optimizer state.
    pub other_bytes: u64,
    /// The number of `record_stats` calls so far (the iteration over the whole run).
    pub step: u64,
    /// Backward passes in the iteration.
    pub backward_passes: u64,
    /// The caching allocator's allocated bytes (`allocated_bytes.all.current`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_allocated_bytes: Option<Option<i64>>,
    /// Its peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_peak_allocated_bytes: Option<Option<i64>>,
    /// The caching allocator's reserved bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_reserved_bytes: Option<Option<i64>>,
    /// Its peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_peak_reserved_bytes: Option<Option<i64>>,
    /// Active bytes (allocated, or freed but awaiting a stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_active_bytes: Option<Option<i64>>,
    /// Its peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_peak_active_bytes: Option<Option<i64>>,
    /// Bytes requested before rounding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_requested_bytes: Option<Option<i64>>,
    /// Its peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_peak_requested_bytes: Option<Option<i64>>,
    /// Allocations retried after freeing the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_alloc_retries: Option<Option<i64>>,
    /// Out-of-memory errors the allocator raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_ooms: Option<Option<i64>>,
    /// The device's free memory (`cudaMemGetInfo`, read when the reserved bytes changed or
    /// at most a second before the row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_device_free_bytes: Option<Option<i64>>,
    /// The device's total memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_device_total_bytes: Option<Option<i64>>,
    /// The cuBLAS and cuBLASLt workspaces PyTorch keeps on the device, part of
    /// `allocated_bytes` and not of `other_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_blas_workspaces_bytes: Option<Option<i64>>,
}

/// The reserved columns as CPU runs name them, where they hold the process's resident
/// memory: (the CUDA name, the CPU name). Files of either name read back alike.
pub const RESIDENT_COLUMNS: [(&str, &str); 2] = [
    ("reserved_bytes", "resident_bytes"),
    ("peak_reserved_bytes", "peak_resident_bytes"),
];

/// A row of `<run>_parameters.csv`: one variable, or its gradient, from the report that
/// wrote it until the next set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ParameterRow {
    /// When the row was written.
    pub timestamp: String,
    /// The epoch.
    pub epoch: u64,
    /// The iteration within its epoch.
    pub iteration: u64,
    /// The VarStore name (`fc1.weight`).
    pub parameter: String,
    /// `weight`, `buffer` or `gradient`.
    pub kind: String,
    /// `f32`, `bf16`, ...
    pub dtype: String,
    /// `[256, 4096]`.
    pub shape: String,
    /// Storage bytes.
    pub bytes: u64,
}

/// A row of `<run>_epochs.csv`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EpochRow {
    /// When the row was written.
    pub timestamp: String,
    /// The epoch.
    pub epoch: u64,
    /// Iterations it recorded.
    pub iterations: u64,
    /// Its highest peak allocated.
    pub peak_allocated_bytes: u64,
    /// Its highest peak reserved (CPU runs: resident, the column `peak_resident_bytes`).
    #[serde(alias = "peak_resident_bytes")]
    pub peak_reserved_bytes: u64,
    /// Its largest feature maps.
    pub peak_feature_maps_bytes: u64,
    /// Its largest intermediate gradients.
    pub peak_intermediate_gradients_bytes: u64,
    /// Allocated at its end.
    pub allocated_bytes: u64,
    /// Change of allocated since the previous epoch's end.
    pub allocated_change_bytes: i64,
}

/// A row of `<run>_leaks.csv`: one group of blocks that grows across epochs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeakRow {
    /// The epoch whose end found it.
    pub epoch: u64,
    /// The op that made the blocks.
    pub op: String,
    /// The phase they were born in.
    pub phase: Phase,
    /// The layer the op ran in.
    pub layer: String,
    /// The first iteration that left such a block.
    pub first_iteration: u64,
    /// The last one.
    pub last_iteration: u64,
    /// Blocks in the group.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// A row of `<run>_layers.csv` (the profiled step's layers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LayerRow {
    /// The layer (`layer1.0.conv1`, or a scope's name).
    pub layer: String,
    /// Bytes of the variables it owns.
    pub parameters_bytes: u64,
    /// Activation bytes born in it that were alive when backward started.
    pub activation_bytes: u64,
    /// FLOPs of its forward ops.
    pub forward_flops: u64,
    /// FLOPs of its backward ops.
    pub backward_flops: u64,
}

/// A row of `<run>_timeline.csv`: live bytes by category after one op of the profiled
/// step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TimelineRow {
    /// The op's index in the step, from 0.
    pub op_index: u32,
    /// The op (`aten::addmm`, `autograd::engine::evaluate_function: AddmmBackward0`).
    pub op: String,
    /// The phase it ran in.
    pub phase: Phase,
    /// The layer it ran in.
    pub layer: String,
    /// Trainable variables.
    pub param_bytes: u64,
    /// Other variables.
    pub buffer_bytes: u64,
    /// Weight gradients.
    pub grad_bytes: u64,
    /// Activations kept for backward.
    pub act_bytes: u64,
    /// Blocks made and freed within one phase.
    pub temp_bytes: u64,
    /// Optimizer state.
    pub opt_bytes: u64,
    /// CUDA: the cuBLAS and cuBLASLt workspaces (0 on the CPU, and in files written
    /// before the column was).
    #[serde(default)]
    pub workspace_bytes: u64,
    /// Everything else.
    pub other_bytes: u64,
    /// The sum: the allocator's live bytes after the op.
    pub total_bytes: u64,
    /// The highest live bytes since the previous row, inside this op (at allocation
    /// granularity): the largest over the rows is the step's peak (0 in files written
    /// before the column).
    #[serde(default)]
    pub peak_bytes: u64,
    /// Of the sum, the bytes of blocks idle at the step's peak that no op reads again
    /// after this one (0 without `idle_at_peak`, and in files written before the column).
    #[serde(default)]
    pub idle_bytes: u64,
}

/// A row of `<run>_idle.csv`: one block live at the profiled step's peak whose last read
/// came before it, written and read back as the step's own [`IdleBlock`](crate::IdleBlock)
/// (`(none)` where no op read it or it outlived the step, `(unknown)` where no frame of
/// the model's code allocated it).
pub type IdleRow = crate::timeline::IdleBlock;

/// A row of `<run>_run.csv`: `tch_memprof`, `libtorch`, `device`, `started`,
/// `print_period`, `label` when the run has one, and `timeline_step` when one was asked
/// for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MetaRow {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: String,
}

impl MetaRow {
    pub(crate) fn new(key: &str, value: impl Into<String>) -> MetaRow {
        MetaRow {
            key: key.to_string(),
            value: value.into(),
        }
    }
}

/// A row of `tch-memprof estimate --csv` (docs/estimate.md): one estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EstimateRow {
    /// The model's name: its file name or built-in name.
    pub model: String,
    /// The batch (the first size of the first input).
    pub batch: i64,
    /// `inference` or `train-<optimizer>`.
    pub mode: String,
    /// Bytes of the model's variables.
    pub weights_bytes: u64,
    /// Predicted peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Predicted peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// True on the row of the largest batch that fits `--memory`.
    pub largest_batch: bool,
    /// The attention backends that ran (`efficient`, `flash+math`, `none`).
    pub attention: String,
    /// `bf16`, `f16` or `off`.
    pub autocast: String,
    /// Bytes live at the predicted peak that no op reads again.
    pub idle_bytes: u64,
    /// The predicted peak allocated had they been freed after their last read.
    pub peak_if_dropped_bytes: u64,
}

/// A row of `tch-memprof plan --csv` (docs/plan.md): one plan that fits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PlanRow {
    /// The model's name.
    pub model: String,
    /// 1 for the cheapest plan.
    pub rank: usize,
    /// The levers in words, `; `-separated.
    pub levers: String,
    /// The batch asked for.
    pub batch: i64,
    /// The batch of one forward pass.
    pub micro_batch: i64,
    /// Micro-batches per optimizer step.
    pub accumulate: u32,
    /// `bf16`, `f16` or `off`.
    pub autocast: String,
    /// The optimizer (`adamw`, `sgd`, ...).
    pub optimizer: String,
    /// Every k-th segment checkpointed (`1`, `2`), or `off`.
    pub checkpoint: String,
    /// FLOPs recomputed, as a share of the step's (0 without checkpointing).
    pub recompute: f64,
    /// Gradients set to none before the forward pass.
    pub zero_grad_first: bool,
    /// The allocator settings (empty: the user's own).
    pub pytorch_cuda_alloc_conf: String,
    /// Predicted peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Predicted peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// The budget less the peak reserved.
    pub margin_bytes: u64,
    /// The plan changes the optimizer (so training itself).
    pub changes_training: bool,
}

/// A row of `tch-memprof replay --csv` and of `plan --csv` for a recorded run
/// (docs/replay.md): one allocator setting's peaks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplayRow {
    /// The allocator settings as `PYTORCH_CUDA_ALLOC_CONF` reads them (`default`:
    /// PyTorch's defaults, no setting), or `recorded` for the run as it was recorded.
    pub alloc_conf: String,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Whether the peak reserved fits the budget (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fits: Option<bool>,
}

impl ReplayRow {
    /// The row of one setting's peaks, against `budget` if there is one.
    pub fn new(alloc_conf: &str, allocated: u64, reserved: u64, budget: Option<u64>) -> Self {
        ReplayRow {
            alloc_conf: if alloc_conf.is_empty() {
                "default".to_string()
            } else {
                alloc_conf.to_string()
            },
            peak_allocated_bytes: allocated,
            peak_reserved_bytes: reserved,
            fits: budget.map(|b| reserved <= b),
        }
    }
}

/// A row of `tch-memprof replay --csv` of several ranks' snapshots (docs/replay.md): one
/// rank's peaks under one allocator setting (`recorded`: as the history gives them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RankRow {
    /// The rank: its file's name without `.pickle` or `.pickle.gz`.
    pub rank: String,
    /// As [`ReplayRow::alloc_conf`].
    pub alloc_conf: String,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Whether the peak reserved fits the budget (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fits: Option<bool>,
}
