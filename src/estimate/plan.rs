//! Make it fit: the cheapest configurations of a training step whose predicted peak
//! reserved stays within a memory budget.
//!
//! The levers, from free to last resort (see docs/plan.md):
//! - **allocator settings** (`PYTORCH_CUDA_ALLOC_CONF`): they change reserved, never
//!   allocated, and cost nothing; every dry run is replayed under each candidate setting
//!   (the trace does not depend on them);
//! - **gradients to none first** (`opt.zero_grad()` before the forward pass instead of
//!   after it): free;
//! - **mixed precision** (autocast in bfloat16, float16 on GPUs without bfloat16);
//! - **gradient accumulation**: the batch split into micro-batches, the effective batch
//!   kept (cost: more, smaller steps);
//! - **activation checkpointing** of every second segment or of every segment of a model
//!   given as a chain ([`crate::Checkpointed`]; cost: the recomputed FLOPs, counted in
//!   the dry run);
//! - **the optimizer** (AdamW or Adam to SGD with momentum, to SGD): it changes training,
//!   so it comes last and is marked.
//!
//! Plans are ordered by [`Cost`]; the search evaluates configurations cheapest first and
//! keeps those that fit, so the first plan is the cheapest that fits. Because a tighter
//! budget only removes plans, the chosen plan's peak never rises when the budget falls.

use std::cmp::Ordering;

use tch::Kind;

use super::{AllocatorConfig, Estimate, Optimizer, Options};
use crate::error::Result;

/// One configuration of the training step.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Autocast dtype (`None`: float32 throughout).
    pub autocast: Option<Kind>,
    /// Micro-batches per step (1: no accumulation); the micro-batch is the batch divided
    /// by it.
    pub accumulate: u32,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Activation checkpointing ([`Options::checkpoint`]): every k-th segment of the
    /// model's chain, or none.
    pub checkpoint: Option<u32>,
    /// Gradients set to none before the forward pass ([`Options::zero_grad_first`]);
    /// always with checkpointing, which runs forward and backward in one call.
    pub zero_grad_first: bool,
    /// The caching allocator's settings.
    pub allocator: AllocatorConfig,
    /// The allocator settings as `PYTORCH_CUDA_ALLOC_CONF` reads them (empty: the
    /// user's own, unchanged).
    pub allocator_conf: String,
}

/// What a plan costs, compared in this order: a change of optimizer (changes
/// training; the further from the one asked for, the costlier), then recomputation (the
/// segments checkpointed), then micro-batches per step, then lower precision, then the
/// free levers (gradients to none first, allocator settings). Two costs are equal when
/// they compare equal: the recomputed share is measured, and follows the segments
/// checkpointed.
#[derive(Clone, Debug)]
pub struct Cost {
    /// The optimizer differs from the one asked for.
    pub changes_training: bool,
    /// How far the optimizer is from the one asked for, in the order they are tried
    /// (AdamW or Adam, SGD with momentum, SGD): 0 for the one asked for.
    pub optimizer_rank: u32,
    /// Segments checkpointed (recomputed in backward; 0 without checkpointing).
    pub checkpointed: u32,
    /// FLOPs the checkpointed step adds to the same step without checkpointing (the
    /// recomputed forward passes), as a share of that step's FLOPs, both counted in the
    /// dry run; 0 without checkpointing.
    pub recompute: f64,
    /// Micro-batches per step.
    pub accumulate: u32,
    /// Autocast dtype, if any.
    pub lower_precision: Option<Kind>,
    /// `opt.zero_grad()` moved before the forward pass.
    pub zero_grad_moved: bool,
    /// Allocator settings changed.
    pub allocator_changed: bool,
}

impl Cost {
    /// Known before the dry run (the recomputed share is measured by it, and grows
    /// with the segments checkpointed), so the search can go cheapest first.
    fn key(&self) -> (u32, u32, u32, bool, bool, bool) {
        (
            self.optimizer_rank,
            self.checkpointed,
            self.accumulate,
            self.lower_precision.is_some(),
            self.zero_grad_moved,
            self.allocator_changed,
        )
    }
}

impl PartialEq for Cost {
    fn eq(&self, other: &Cost) -> bool {
        self.key() == other.key()
    }
}

impl PartialOrd for Cost {
    fn partial_cmp(&self, other: &Cost) -> Option<Ordering> {
        Some(self.key().cmp(&other.key()))
    }
}

/// A configuration with its predicted peak.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The configuration.
    pub config: Config,
    /// The micro-batch (the batch divided by [`Config::accumulate`]).
    pub micro_batch: i64,
    /// Its cost.
    pub cost: Cost,
    /// The estimate of one step at the micro-batch.
    pub estimate: Estimate,
    /// Peak reserved under each allocator setting tried (`""`: the user's own), for the
    /// same step: allocated does not change, reserved does.
    pub allocator_alternatives: Vec<(String, u64)>,
}

impl Plan {
    /// Memory left under `memory` (0 when it does not fit).
    pub fn margin(&self, memory: u64) -> u64 {
        memory.saturating_sub(self.estimate.peak_reserved)
    }
}

/// What dominates a peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dominant {
    /// The model's variables.
    Weights,
    /// The gradients.
    Gradients,
    /// The optimizer's state.
    OptimizerState,
    /// Activations and temporaries (the rest of the peak).
    Activations,
}

/// The peak allocated of a plan split into weights (parameters and buffers), gradients,
/// optimizer state and the rest (activations, temporaries, workspaces), in bytes: the
/// categories of the predicted step at its peak ([`Estimate::step`]), in the bytes the
/// caching allocator charges. All in the rest when the dry run made no step.
pub fn breakdown(plan: &Plan) -> [(Dominant, u64); 4] {
    use crate::timeline::Category;
    let e = &plan.estimate;
    let Some(step) = &e.step else {
        return [
            (Dominant::Weights, 0),
            (Dominant::Gradients, 0),
            (Dominant::OptimizerState, 0),
            (Dominant::Activations, e.peak_allocated),
        ];
    };
    let at = &step.peak.breakdown;
    let weights = at.get(Category::Param) + at.get(Category::Buffer);
    let grads = at.get(Category::Grad);
    let state = at.get(Category::Opt);
    [
        (Dominant::Weights, weights),
        (Dominant::Gradients, grads),
        (Dominant::OptimizerState, state),
        (
            Dominant::Activations,
            step.peak.bytes.saturating_sub(weights + grads + state),
        ),
    ]
}

/// The result of a search.
#[derive(Clone, Debug)]
pub struct Plans {
    /// The budget: the predicted peak reserved must stay within it.
    pub memory: u64,
    /// The batch asked for (the effective batch of every plan).
    pub batch: i64,
    /// The optimizer asked for.
    pub optimizer: Optimizer,
    /// The plans that fit, cheapest first.
    pub fits: Vec<Plan>,
    /// When none fits: the plan with the smallest peak reserved among those tried.
    pub smallest: Option<Plan>,
    /// Dry runs made.
    pub dry_runs: u32,
    /// Configurations whose dry run failed (an op the autocast dtype refuses), with why:
    /// left out of the search.
    pub skipped: Vec<String>,
    /// The peak reserved of the step as it is (no lever, the user's allocator settings).
    pub as_is: u64,
    /// The model is a file PyTorch wrote ([`Model::from_pytorch`](crate::estimate::Model::from_pytorch)): the plans are also
    /// given as PyTorch code.
    pub pytorch_file: bool,
}

/// A plan, or a largest batch, that leaves less than this share of the budget is
/// flagged: the most the estimate's peak reserved was measured under a GPU's (an H200's)
/// is 2.4% (tch code, either way) and 2.2% (real-world models' files run as tch runs
/// them), docs/estimate.md; `tests/gpu_truth.rs` holds this share above both.
pub const THIN_MARGIN: f64 = 0.025;

/// How many plans that fit a search returns at most.
pub const MAX_PLANS: usize = 5;

/// The allocator settings tried with every configuration: the user's own, then each
/// candidate (`expandable_segments:True` maps segments as they grow, which removes most
/// of the gap between reserved and allocated; `max_split_size_mb:128` keeps large free
/// blocks whole; `roundup_power2_divisions:4` rounds requests to fewer sizes).
pub fn allocator_candidates(base: &AllocatorConfig) -> Result<Vec<(String, AllocatorConfig)>> {
    let mut out = vec![(String::new(), base.clone())];
    for conf in [
        "expandable_segments:True",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
    ] {
        let c = AllocatorConfig::parse(conf)?;
        if !out.iter().any(|(_, have)| *have == c) {
            out.push((conf.to_string(), c));
        }
    }
    Ok(out)
}

/// The optimizers tried: the one asked for, then those with less state.
pub(crate) fn optimizer_candidates(asked: Optimizer) -> Vec<Optimizer> {
    match asked {
        Optimizer::Adam | Optimizer::AdamW => {
            vec![asked, Optimizer::SgdMomentum, Optimizer::Sgd]
        }
        Optimizer::SgdMomentum => vec![asked, Optimizer::Sgd],
        Optimizer::Sgd => vec![asked],
    }
}

/// A step's optimizer, micro-batches and autocast: what its FLOPs depend on besides
/// checkpointing.
pub(crate) type StepKey = (Optimizer, u32, Option<Kind>);

/// The checkpointing tried for a chain of `segments` segments: the one asked for (none
/// by default), then every second segment and every segment (a chain of 2 has one
/// segment to checkpoint; a model that is no chain has none).
pub(crate) fn checkpoint_candidates(segments: usize, asked: Option<u32>) -> Vec<Option<u32>> {
    let mut out = vec![asked];
    if asked.is_none() {
        if segments > 2 {
            out.push(Some(2));
        }
        if segments > 1 {
            out.push(Some(1));
        }
    }
    out
}

/// Segments that checkpointing every `every`-th segment of a chain of `segments`
/// recomputes: 0, k, 2k, ... below the last.
pub(crate) fn checkpointed(segments: usize, every: Option<u32>) -> u32 {
    match every {
        None => 0,
        Some(k) => (0..segments.saturating_sub(1))
            .filter(|i| i % k.max(1) as usize == 0)
            .count() as u32,
    }
}

/// Micro-batches per step that split `batch` evenly, fewest first.
pub(crate) fn accumulate_candidates(batch: i64) -> Vec<u32> {
    (1..=batch)
        .filter(|k| batch % k == 0)
        .filter_map(|k| u32::try_from(k).ok())
        .collect()
}

/// The autocast dtypes tried: the one asked for (none by default), then bfloat16 on a
/// GPU that has it (compute capability 8.0 and later), else float16.
pub(crate) fn autocast_candidates(options: &Options) -> Vec<Option<Kind>> {
    let lower = if options.gpu.sm >= 80 {
        Kind::BFloat16
    } else {
        Kind::Half
    };
    let mut out = vec![options.autocast];
    if options.autocast.is_none() {
        out.push(Some(lower));
    }
    out
}

/// `every segment`, `every 2nd segment`, `every 3rd segment`, `every 4th segment`, ...
pub(crate) fn every_segment(k: u32) -> String {
    let suffix = match (k % 10, k % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    match k {
        0 | 1 => "every segment".to_string(),
        k => format!("every {k}{suffix} segment"),
    }
}

/// The levers of a configuration, in words (`as is` for none).
pub(super) fn describe(config: &Config, micro: i64, asked: Optimizer, cost: &Cost) -> String {
    let words = lever_words(config, micro, asked, cost);
    if words.is_empty() {
        "as is".to_string()
    } else {
        words.join(", ")
    }
}

pub(crate) fn lever_words(
    config: &Config,
    micro: i64,
    asked: Optimizer,
    cost: &Cost,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(k) = cost.lower_precision {
        out.push(format!("{} autocast", dtype_name(k)));
    }
    if let Some(k) = config.checkpoint {
        out.push(format!("checkpoint {}", every_segment(k)));
    } else if cost.zero_grad_moved {
        out.push("gradients to none first".to_string());
    }
    if config.accumulate > 1 {
        out.push(format!("{} x micro-batch {micro}", config.accumulate));
    }
    if config.optimizer != asked {
        out.push(format!("optimizer {}", config.optimizer.name()));
    }
    out
}

/// `bf16`, `f16` or `f32`: a lower precision's short name.
pub(crate) fn dtype_name(k: Kind) -> &'static str {
    match k {
        Kind::BFloat16 => "bf16",
        Kind::Half => "f16",
        _ => "f32",
    }
}
