//! A rank's estimate under FSDP2: the dry run of one GPU, sharded (`estimate::fsdp`),
//! through the one replay on its streams.

use std::collections::HashMap;

use super::Model;
use crate::error::{Error, Result};
use crate::estimate::parallel::{self, Ddp, Fsdp, ShardedCategory, Var};
use crate::estimate::{Input, Mode, Optimizer, Options};
use crate::events::EventKind;
use crate::ffi;
use crate::replay::through_allocator;

/// One rank's predicted peaks under FSDP2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEstimate {
    /// The rank (0 to world - 1).
    pub rank: u32,
    /// Predicted `torch.cuda.max_memory_allocated()` of the rank.
    pub peak_allocated: u64,
    /// Predicted `torch.cuda.max_memory_reserved()` of the rank.
    pub peak_reserved: u64,
    /// What the rank holds when allocated peaks, by category, in the bytes the caching
    /// allocator charges (every category listed, in order; they add up to the peak).
    pub at_peak: Vec<(ShardedCategory, u64)>,
    /// The rank's model states as PyTorch counts them (requested bytes): its padded
    /// parameter shards and its optimizer state (the unpadded local shard per state
    /// tensor), after the last step.
    pub sharded_parameter_bytes: u64,
    /// See [`RankEstimate::sharded_parameter_bytes`].
    pub optimizer_state_bytes: u64,
    /// The modules wrapped as units, in name order (the root holds the rest; none: the
    /// whole model is one unit, the root).
    pub units: Vec<String>,
}

impl Model {
    /// Ranks 0 and `world - 1` (they differ where padding leaves the last rank fewer real
    /// rows) of `mode` under `fsdp`, in the loop `options` say (gradients set to none
    /// after the loss, or first with [`Options::zero_grad_first`]): the one-GPU dry run with
    /// FSDP2's shards and buffers on their streams ([`Fsdp`]), through the caching
    /// allocator's model.
    pub fn estimate_sharded(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        fsdp: &Fsdp,
    ) -> Result<Vec<RankEstimate>> {
        fsdp.validate()?;
        let refuse = |name: &'static str, value: String, reason: &str| {
            Err(Error::InvalidInput {
                name,
                value,
                reason: reason.to_string(),
            })
        };
        if mode == Mode::Steps {
            return refuse(
                "mode",
                mode.label(),
                "a sharded estimate runs the built-in loop",
            );
        }
        if options.accumulate > 1 {
            return refuse(
                "accumulate",
                options.accumulate.to_string(),
                "gradient accumulation under FSDP is not modelled yet",
            );
        }
        let vars = self.fsdp_vars()?;
        let names: Vec<&str> = vars.iter().map(|v| v.name.as_str()).collect();
        let mut units = parallel::units(&names, fsdp.units.as_deref())?;
        units.sort_by_key(|u| natural(u));
        // Mixed precision: the step computes with the parameters and the inputs in
        // param_dtype (the shards keep the parameters' dtype: `vars` was taken before).
        let cast = self.cast_parameters(fsdp.param_dtype)?;
        self.sharded_run.set(Some(super::ShardedRun {
            inputs_in: fsdp.param_dtype,
        }));
        let run = self.dry_run(inputs, mode, options, false);
        self.sharded_run.set(None);
        drop(cast);
        let run = run?;
        let loss_scope = Some(ffi::intern(super::LOSS_SCOPE)?);
        let mut ranks = vec![0];
        if fsdp.world > 1 {
            ranks.push(fsdp.world - 1);
        }
        ranks
            .into_iter()
            .map(|rank| {
                let s = parallel::shard(
                    &self.weights,
                    &run.events,
                    &vars,
                    fsdp,
                    rank,
                    loss_scope,
                    foreach_set(mode),
                )?;
                let device = through_allocator(&s.weights, &s.events, &options.device());
                let at_peak = at_peak(&device.events, &s.categories);
                let sharded_parameter_bytes = s
                    .weights
                    .iter()
                    .filter(|e| {
                        e.is_alloc()
                            && s.categories.get(&e.ptr) == Some(&ShardedCategory::ShardedParameters)
                    })
                    .map(|e| e.value.max(0) as u64)
                    .sum();
                let optimizer_state_bytes = live_requested(&s.events, &s.categories);
                Ok(RankEstimate {
                    rank,
                    peak_allocated: device.stats.peak_allocated,
                    peak_reserved: device.stats.peak_reserved,
                    at_peak,
                    sharded_parameter_bytes,
                    optimizer_state_bytes,
                    units: units.clone(),
                })
            })
            .collect()
    }

    /// A rank of `mode` under `ddp` (every rank holds the same), in the loop `options`
    /// say (gradients set to none after the loss, or first): the one-GPU
    /// dry run with DDP's gradient buckets ([`Ddp`]), through the caching allocator's
    /// model.
    pub fn estimate_replicated(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        ddp: &Ddp,
    ) -> Result<RankEstimate> {
        if ddp.world == 0 {
            return Err(Error::InvalidInput {
                name: "ddp",
                value: "0".into(),
                reason: "DDP replicates over at least 1 rank".into(),
            });
        }
        let refuse = |name: &'static str, value: String| {
            Err(Error::InvalidInput {
                name,
                value,
                reason: "DDP is modelled for the built-in loop without gradient \
                         accumulation or checkpointing"
                    .into(),
            })
        };
        if mode == Mode::Steps {
            return refuse("mode", mode.label());
        }
        if options.accumulate > 1 {
            return refuse("accumulate", options.accumulate.to_string());
        }
        if let Some(k) = options.checkpoint {
            return refuse("checkpoint", k.to_string());
        }
        // The parameters in the order the model registered them.
        let by_name: HashMap<String, Var> = self
            .fsdp_vars()?
            .into_iter()
            .map(|v| (v.name.clone(), v))
            .collect();
        let vars: Vec<Var> = super::variables::creation_order(self.var_store())
            .into_iter()
            .filter_map(|(name, _)| by_name.get(&name).cloned())
            .collect();
        let run = self.dry_run(inputs, mode, options, false)?;
        let s = parallel::replicate(&self.weights, &run.events, &vars, ddp, foreach_set(mode));
        let device = through_allocator(&s.weights, &s.events, &options.device());
        Ok(RankEstimate {
            rank: 0,
            peak_allocated: device.stats.peak_allocated,
            peak_reserved: device.stats.peak_reserved,
            at_peak: at_peak(&device.events, &s.categories),
            sharded_parameter_bytes: 0,
            optimizer_state_bytes: live_requested(&s.events, &s.categories),
            units: Vec::new(),
        })
    }
}

/// The categories' bytes when allocated first reaches its peak, over the replay's
/// charged events.
fn at_peak(
    events: &[crate::events::Event],
    categories: &HashMap<u64, ShardedCategory>,
) -> Vec<(ShardedCategory, u64)> {
    let all = [
        ShardedCategory::Parameters,
        ShardedCategory::ShardedParameters,
        ShardedCategory::Buffers,
        ShardedCategory::Buckets,
        ShardedCategory::UnshardedParameters,
        ShardedCategory::AllGather,
        ShardedCategory::UnshardedGradients,
        ShardedCategory::ReduceScatter,
        ShardedCategory::ShardedGradients,
        ShardedCategory::OptimizerState,
        ShardedCategory::Other,
    ];
    let index = |c: ShardedCategory| all.iter().position(|a| *a == c).unwrap_or(all.len() - 1);
    let mut now = vec![0i64; all.len()];
    let mut live: HashMap<u64, (usize, i64)> = HashMap::new();
    let (mut total, mut best, mut best_at) = (0i64, -1i64, now.clone());
    for e in events {
        match e.kind {
            EventKind::Alloc { .. } => {
                let c = index(
                    categories
                        .get(&e.ptr)
                        .copied()
                        .unwrap_or(ShardedCategory::Other),
                );
                live.insert(e.ptr, (c, e.value));
                now[c] += e.value;
                total += e.value;
                if total > best {
                    best = total;
                    best_at.clone_from(&now);
                }
            }
            EventKind::Free => {
                if let Some((c, bytes)) = live.remove(&e.ptr) {
                    now[c] -= bytes;
                    total -= bytes;
                }
            }
            _ => {}
        }
    }
    all.iter()
        .zip(best_at)
        .map(|(c, b)| (*c, b.max(0) as u64))
        .collect()
}

/// Requested bytes of the optimizer's state when the last step begins (its temporaries
/// gone; the run's end frees the optimizer).
fn live_requested(
    events: &[crate::events::Event],
    categories: &HashMap<u64, ShardedCategory>,
) -> u64 {
    let last = events
        .iter()
        .filter(|e| e.kind == EventKind::Phase)
        .map(|e| e.generation)
        .max()
        .unwrap_or(0);
    let mut live: HashMap<u64, i64> = HashMap::new();
    for e in events {
        match e.kind {
            EventKind::Phase if e.generation == last && last > 1 => break,
            EventKind::Alloc { .. }
                if categories.get(&e.ptr) == Some(&ShardedCategory::OptimizerState) =>
            {
                live.insert(e.ptr, e.value);
            }
            EventKind::Free => {
                live.remove(&e.ptr);
            }
            _ => {}
        }
    }
    live.values().map(|&v| v.max(0) as u64).sum()
}

/// A module path ordered as people count (`h.2` before `h.10`).
fn natural(path: &str) -> Vec<(String, u64)> {
    path.split('.')
        .map(|c| {
            let word = c.trim_end_matches(|ch: char| ch.is_ascii_digit());
            (word.to_string(), c[word.len()..].parse().unwrap_or(0))
        })
        .collect()
}

/// Whether the step's optimizer is one PyTorch runs as foreach by default with a
/// state-sized set made at once (Adam, AdamW).
fn foreach_set(mode: Mode) -> bool {
    matches!(mode, Mode::Train(Optimizer::Adam | Optimizer::AdamW))
}
