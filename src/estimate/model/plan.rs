//! The plan search of a model: the configurations of a training step that fit a memory,
//! cheapest first ([`Model::plan`]); what a plan is and costs is `estimate/plan.rs`.

use std::cmp::Ordering;

use super::{Analysis, Model};
use crate::error::{Error, Result};
use crate::estimate::plan::{
    accumulate_candidates, allocator_candidates, autocast_candidates, checkpoint_candidates,
    checkpointed, describe, optimizer_candidates, Config, Cost, Plan, Plans, StepKey, MAX_PLANS,
};
use crate::estimate::{AllocatorConfig, Input, Mode, Optimizer, Options};

impl Model {
    /// The configurations of a training step at `inputs` (the batch is the first size of
    /// the first input, kept as the effective batch) whose predicted peak reserved fits
    /// in `memory`, cheapest first (at most 5), or, when none does, the one
    /// with the smallest peak.
    pub fn plan(
        &self,
        inputs: &[Input],
        optimizer: Optimizer,
        options: &Options,
        memory: u64,
    ) -> Result<Plans> {
        self.plan_with_progress(inputs, optimizer, options, memory, &mut |_| {})
    }

    /// [`plan`](Self::plan), calling `progress` with the number of dry runs made so far
    /// before each new one (a progress line).
    pub fn plan_with_progress(
        &self,
        inputs: &[Input],
        optimizer: Optimizer,
        options: &Options,
        memory: u64,
        progress: &mut dyn FnMut(u32),
    ) -> Result<Plans> {
        let batch = inputs.first().map_or(1, Input::batch);
        options.validate(Mode::Train(optimizer))?;
        if memory == 0 {
            return Err(Error::InvalidInput {
                name: "memory",
                value: "0".into(),
                reason: "the budget must be positive".into(),
            });
        }
        let allocators = allocator_candidates(&options.allocator)?;
        let segments = self.segments().unwrap_or(0);
        // Every configuration but the allocator's, cheapest first (the allocator's
        // settings are free, so each is tried with all of them).
        let mut configs = Vec::new();
        for o in optimizer_candidates(optimizer) {
            for c in checkpoint_candidates(segments, options.checkpoint) {
                for k in accumulate_candidates(batch) {
                    for a in autocast_candidates(options) {
                        // Checkpointing sets the gradients to none first by itself.
                        let zero_grad = match c {
                            Some(_) => vec![true],
                            None if options.zero_grad_first => vec![true],
                            None => vec![false, true],
                        };
                        for z in zero_grad {
                            configs.push(Config {
                                autocast: a,
                                accumulate: k,
                                optimizer: o,
                                checkpoint: c,
                                zero_grad_first: z,
                                allocator: options.allocator.clone(),
                                allocator_conf: String::new(),
                            });
                        }
                    }
                }
            }
        }
        let cost = |c: &Config, recompute: f64| Cost {
            changes_training: c.optimizer != optimizer,
            optimizer_rank: optimizer_candidates(optimizer)
                .iter()
                .position(|o| *o == c.optimizer)
                .unwrap_or(0) as u32,
            checkpointed: match c.checkpoint == options.checkpoint {
                true => 0,
                false => checkpointed(segments, c.checkpoint),
            },
            recompute,
            accumulate: c.accumulate,
            lower_precision: c.autocast.filter(|_| options.autocast.is_none()),
            zero_grad_moved: c.zero_grad_first && !options.zero_grad_first,
            allocator_changed: !c.allocator_conf.is_empty(),
        };
        configs.sort_by(|x, y| {
            cost(x, 0.0)
                .partial_cmp(&cost(y, 0.0))
                .unwrap_or(Ordering::Equal)
        });
        let mut fits: Vec<Plan> = Vec::new();
        let mut smallest: Option<Plan> = None;
        let mut dry_runs = 0;
        let mut skipped = Vec::new();
        let mut as_is = 0;
        // FLOPs of each step without checkpointing, by (optimizer, micro-batches,
        // autocast): what a checkpointed step's recomputation is measured against. The
        // search reaches a checkpointed configuration after the same one without.
        let mut plain_flops: Vec<(StepKey, u64)> = Vec::new();
        let settings: Vec<AllocatorConfig> = allocators.iter().map(|(_, c)| c.clone()).collect();
        for config in configs {
            if fits.len() >= MAX_PLANS {
                break;
            }
            let (o, k, a) = (config.optimizer, config.accumulate, config.autocast);
            let micro = batch / i64::from(k);
            let xs: Vec<Input> = inputs.iter().map(|i| i.with_batch(micro)).collect();
            let opts = Options {
                accumulate: k,
                autocast: a,
                checkpoint: config.checkpoint,
                zero_grad_first: config.zero_grad_first,
                ..options.clone()
            };
            let first = dry_runs == 0;
            progress(dry_runs);
            dry_runs += 1;
            let (run, estimates) = match self.estimate_each(&xs, Mode::Train(o), &opts, &settings) {
                Ok(e) => e,
                // The step as asked fails: the model does, say so. A lever's
                // configuration fails (an op autocast refuses): skip it, say why.
                Err(e) if first => return Err(e),
                Err(e) => {
                    skipped.push(format!(
                        "{}: {e}",
                        describe(&config, micro, optimizer, &cost(&config, 0.0))
                    ));
                    continue;
                }
            };
            if first {
                as_is = estimates[0].peak_reserved;
            }
            let flops = estimates[0].step_flops;
            let recompute = match config.checkpoint {
                None => {
                    plain_flops.push(((o, k, a), flops));
                    0.0
                }
                Some(_) if config.checkpoint == options.checkpoint => 0.0,
                // The same step without checkpointing ran first (it costs less); when
                // its dry run failed, so would this one's measure: skip it, say why.
                Some(_) => match plain_flops.iter().find(|(c, _)| *c == (o, k, a)) {
                    Some((_, plain)) => {
                        flops.saturating_sub(*plain) as f64 / (*plain).max(1) as f64
                    }
                    None => {
                        skipped.push(format!(
                            "{}: the same step without checkpointing failed, so its recomputed FLOPs are unknown",
                            describe(&config, micro, optimizer, &cost(&config, 0.0))
                        ));
                        continue;
                    }
                },
            };
            let mut tried: Vec<Plan> = allocators
                .iter()
                .zip(estimates)
                .map(|((conf, c), e)| {
                    let config = Config {
                        allocator: c.clone(),
                        allocator_conf: conf.clone(),
                        ..config.clone()
                    };
                    Plan {
                        micro_batch: micro,
                        cost: cost(&config, recompute),
                        config,
                        estimate: e,
                        allocator_alternatives: Vec::new(),
                    }
                })
                .collect();
            let alternatives: Vec<(String, u64)> = tried
                .iter()
                .map(|p| (p.config.allocator_conf.clone(), p.estimate.peak_reserved))
                .collect();
            // The user's allocator settings when they fit; else the setting that gives the
            // smallest reserved, when it fits. The others are listed beside the plan.
            let user = tried.remove(0);
            let chosen = if user.estimate.peak_reserved <= memory {
                user
            } else {
                tried
                    .into_iter()
                    .chain(std::iter::once(user))
                    .min_by_key(|p| p.estimate.peak_reserved)
                    .expect("the user's settings at least")
            };
            let mut chosen = Plan {
                allocator_alternatives: alternatives,
                ..chosen
            };
            let kept = if chosen.estimate.peak_reserved <= memory {
                !fits
                    .iter()
                    .any(|f| f.estimate.peak_reserved <= chosen.estimate.peak_reserved)
            } else {
                smallest.as_ref().map_or(true, |s| {
                    chosen.estimate.peak_reserved < s.estimate.peak_reserved
                })
            };
            if kept {
                // The predicted step of a plan that is kept: its breakdown.
                let elapsed = chosen.estimate.elapsed;
                let with_step = Options {
                    allocator: chosen.config.allocator.clone(),
                    ..opts.clone()
                };
                chosen.estimate =
                    self.replayed(&run, &xs, Mode::Train(o), &with_step, Analysis::Step)?;
                chosen.estimate.elapsed = elapsed;
            }
            if chosen.estimate.peak_reserved <= memory {
                // A cheaper plan (found before) with a peak no higher beats it.
                if !fits
                    .iter()
                    .any(|f| f.estimate.peak_reserved <= chosen.estimate.peak_reserved)
                {
                    fits.push(chosen);
                }
            } else if smallest.as_ref().map_or(true, |s| {
                chosen.estimate.peak_reserved < s.estimate.peak_reserved
            }) {
                smallest = Some(chosen);
            }
        }
        fits.sort_by(|x, y| x.cost.partial_cmp(&y.cost).unwrap_or(Ordering::Equal));
        Ok(Plans {
            memory,
            batch,
            optimizer,
            smallest: if fits.is_empty() { smallest } else { None },
            fits,
            dry_runs,
            skipped,
            as_is,
            pytorch_file: self.from_pytorch(),
        })
    }
}
