//! `plan --gpus N`: the sharding levers (DDP, FSDP2 kept or resharded, with bf16 mixed precision
//! and activation checkpointing) over N GPUs, cheapest first, and the smallest N that fits.

use super::Model;
use crate::error::Result;
use crate::estimate::parallel::{Ddp, Fsdp};
use crate::estimate::{Input, Mode, Optimizer, Options};

/// How a plan over several GPUs runs the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sharding {
    /// DDP: every rank the whole model, gradients all-reduced.
    Ddp,
    /// FSDP2, each unit's parameters kept unsharded from its forward pass to the end of
    /// its backward pass (`reshard_after_forward=False`).
    FsdpKept,
    /// FSDP2 with FSDP2's defaults (units resharded after forward, the root kept).
    Fsdp,
}

/// One plan over several GPUs.
#[derive(Clone, Debug)]
pub(crate) struct GpuPlan {
    pub sharding: Sharding,
    /// FSDP2's bf16 mixed precision (`MixedPrecisionPolicy(param_dtype=bfloat16,
    /// reduce_dtype=float32)`).
    pub mixed: bool,
    /// Activation checkpointing of every block.
    pub checkpoint: bool,
    /// The largest rank's peak reserved (rank 0 or N-1).
    pub peak_reserved: u64,
    /// Bytes each rank sends and receives per step in a ring (all-reduce: 2 (N-1)/N of
    /// the gradients; all-gather and reduce-scatter: (N-1)/N of what they gather or
    /// scatter).
    pub traffic: u64,
    /// The collectives per step, in words.
    pub collectives: String,
}

/// The plans over `gpus` GPUs, cheapest first (communication, then recomputation and
/// precision), each with its largest rank's peak; and the smallest world (a power of
/// two up to `gpus`) at which the cheapest that fits still fits.
pub(crate) struct GpuPlans {
    pub gpus: u32,
    pub memory: u64,
    /// Every plan tried, cheapest first.
    pub plans: Vec<GpuPlan>,
    /// Index into `plans` of the cheapest that fits.
    pub cheapest: Option<usize>,
    /// The fewest GPUs the cheapest plan fits on.
    pub fewest: Option<u32>,
    /// When no plan fits on `gpus`: the leanest plan there (the smallest peak) tried
    /// over twice, four times, ... as many GPUs, up to [`MOST_GPUS`]; the first world it
    /// fits in, with its peak there (`None` inside: not within [`MOST_GPUS`]).
    pub more: Option<Option<(u32, u64)>>,
}

/// The most GPUs `plan --gpus` looks for when nothing fits on the GPUs asked for.
pub(crate) const MOST_GPUS: u32 = 1024;

impl Model {
    /// The sharding plans of a training step with `optimizer` over `gpus` GPUs of
    /// `memory` bytes each (the predicted peak reserved of every rank within it).
    pub(crate) fn plan_gpus(
        &self,
        inputs: &[Input],
        optimizer: Optimizer,
        options: &Options,
        memory: u64,
        gpus: u32,
    ) -> Result<GpuPlans> {
        let mode = Mode::Train(optimizer);
        // What trains is all-reduced or reduce-scattered; FSDP2 all-gathers every
        // parameter, frozen ones too.
        let vars = self.fsdp_vars()?;
        let bytes_of = |keep: fn(&crate::estimate::parallel::Var) -> bool| -> u64 {
            vars.iter()
                .filter(|v| keep(v))
                .map(|v| v.padded_shard_bytes(1))
                .sum()
        };
        let parameter_bytes = bytes_of(|v| v.trainable);
        let sharded_bytes = bytes_of(|v| v.sharded());
        let n = u64::from(gpus);
        let share = |bytes: u64| bytes * (n - 1) / n.max(1);
        let mut plans = Vec::new();
        let levers = [(false, false), (true, false), (false, true), (true, true)];
        for sharding in [Sharding::Ddp, Sharding::FsdpKept, Sharding::Fsdp] {
            for (mixed, checkpoint) in levers {
                // Mixed precision and checkpointing cost compute: only the resharded
                // FSDP2, the one that needs them last, takes them.
                if (mixed || checkpoint) && sharding != Sharding::Fsdp {
                    continue;
                }
                let o = Options {
                    checkpoint: checkpoint.then_some(1),
                    ..options.clone()
                };
                let peak_reserved = self.gpu_peak(inputs, mode, &o, &sharding, mixed, gpus)?;
                // Mixed precision gathers the parameters in bf16 (half their f32
                // bytes) and reduce-scatters in f32.
                let gathered = if mixed {
                    sharded_bytes / 2
                } else {
                    sharded_bytes
                };
                let (traffic, collectives) = match sharding {
                    Sharding::Ddp => (
                        2 * share(parameter_bytes),
                        format!("all-reduce {}", words(parameter_bytes)),
                    ),
                    Sharding::FsdpKept => (
                        share(gathered) + share(parameter_bytes),
                        format!(
                            "all-gather {}, reduce-scatter {}",
                            words(gathered),
                            words(parameter_bytes)
                        ),
                    ),
                    Sharding::Fsdp => (
                        2 * share(gathered) + share(parameter_bytes),
                        format!(
                            "all-gather 2 x {}, reduce-scatter {}",
                            words(gathered),
                            words(parameter_bytes)
                        ),
                    ),
                };
                plans.push(GpuPlan {
                    sharding: sharding.clone(),
                    mixed,
                    checkpoint,
                    peak_reserved,
                    traffic,
                    collectives,
                });
            }
        }
        let cheapest = plans.iter().position(|p| p.peak_reserved <= memory);
        let fewest = match cheapest {
            None => None,
            Some(i) => {
                let p = &plans[i];
                let o = Options {
                    checkpoint: p.checkpoint.then_some(1),
                    ..options.clone()
                };
                let mut fewest = gpus;
                let mut world = 1;
                while world < gpus {
                    if self.gpu_peak(inputs, mode, &o, &p.sharding, p.mixed, world)? <= memory {
                        fewest = world;
                        break;
                    }
                    world *= 2;
                }
                Some(fewest)
            }
        };
        // Nothing fits: how many GPUs the leanest plan needs. A rank's activations do
        // not shrink with the world (its batch stays), so there may be no such number.
        let lean = plans.iter().min_by_key(|p| p.peak_reserved);
        let more = match (cheapest, lean) {
            (None, Some(p)) => {
                let o = Options {
                    checkpoint: p.checkpoint.then_some(1),
                    ..options.clone()
                };
                let mut found = None;
                let mut world = gpus.saturating_mul(2);
                while world <= MOST_GPUS && world > gpus {
                    let peak = self.gpu_peak(inputs, mode, &o, &p.sharding, p.mixed, world)?;
                    if peak <= memory {
                        found = Some((world, peak));
                        break;
                    }
                    world = world.saturating_mul(2);
                }
                Some(found)
            }
            _ => None,
        };
        Ok(GpuPlans {
            gpus,
            memory,
            plans,
            cheapest,
            fewest,
            more,
        })
    }

    /// The largest rank's peak reserved (rank 0 or N-1) of `sharding` over `world` GPUs,
    /// FSDP2 with bf16 mixed precision if `mixed`.
    fn gpu_peak(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        sharding: &Sharding,
        mixed: bool,
        world: u32,
    ) -> Result<u64> {
        let ranks = match sharding {
            Sharding::Ddp => vec![self.estimate_replicated(
                inputs,
                mode,
                options,
                &Ddp {
                    world,
                    gradient_as_bucket_view: false,
                },
            )?],
            Sharding::FsdpKept | Sharding::Fsdp => self.estimate_sharded(
                inputs,
                mode,
                options,
                &Fsdp {
                    reshard_after_forward: *sharding == Sharding::Fsdp,
                    param_dtype: mixed.then_some(tch::Kind::BFloat16),
                    reduce_dtype: mixed.then_some(tch::Kind::Float),
                    ..Fsdp::over(world)
                },
            )?,
        };
        Ok(ranks.iter().map(|e| e.peak_reserved).max().unwrap_or(0))
    }
}

fn words(bytes: u64) -> String {
    crate::format::bytes(bytes)
}
