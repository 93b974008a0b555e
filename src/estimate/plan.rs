//! Make it fit: the cheapest configurations of a training step whose predicted peak
//! reserved stays within a memory budget.
//!
//! The levers, from free to last resort (see docs/plan.md):
//! - **allocator settings** (`PYTORCH_CUDA_ALLOC_CONF`): they change reserved, never
//!   allocated, and cost nothing; every dry run is replayed under each candidate setting
//!   (the trace does not depend on them);
//! - **mixed precision** (autocast in bfloat16, float16 on GPUs without bfloat16);
//! - **gradient accumulation**: the batch split into micro-batches, the effective batch
//!   kept (cost: more, smaller steps);
//! - **the optimizer** (AdamW or Adam to SGD with momentum, to SGD): it changes training,
//!   so it comes last and is marked.
//!
//! Plans are ordered by [`Cost`]; the search evaluates configurations cheapest first and
//! keeps those that fit, so the first plan is the cheapest that fits. Because a tighter
//! budget only removes plans, the chosen plan's peak never rises when the budget falls.

use std::cmp::Ordering;
use std::fmt;

use tch::Kind;

use super::{AllocatorConfig, Estimate, Input, Mode, Model, Optimizer, Options};
use crate::error::{Error, Result};

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
    /// The caching allocator's settings.
    pub allocator: AllocatorConfig,
    /// The allocator settings as `PYTORCH_CUDA_ALLOC_CONF` reads them (empty: the
    /// user's own, unchanged).
    pub allocator_conf: String,
}

/// What a plan costs, compared in this order: a change of optimizer (changes
/// training), then extra compute, then micro-batches per step, then lower precision,
/// then allocator settings (free).
#[derive(Clone, Debug, PartialEq)]
pub struct Cost {
    /// The optimizer differs from the one asked for.
    pub changes_training: bool,
    /// Forward FLOPs recomputed, as a share of the step's FLOPs (activation
    /// checkpointing; 0 without).
    pub recompute: f64,
    /// Micro-batches per step.
    pub accumulate: u32,
    /// Autocast dtype, if any.
    pub lower_precision: Option<Kind>,
    /// Allocator settings changed.
    pub allocator_changed: bool,
}

impl Cost {
    fn key(&self) -> (bool, u64, u32, bool, bool) {
        (
            self.changes_training,
            (self.recompute * 1e6).round() as u64,
            self.accumulate,
            self.lower_precision.is_some(),
            self.allocator_changed,
        )
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

    /// The levers this plan pulls, in words: `bf16 autocast`, `2 x micro-batch 4`, ...
    pub fn levers(&self, asked: Optimizer) -> Vec<String> {
        let mut out = lever_words(
            self.cost.lower_precision,
            self.config.accumulate,
            self.micro_batch,
            self.config.optimizer,
            asked,
        );
        if !self.config.allocator_conf.is_empty() {
            out.push(self.config.allocator_conf.clone());
        }
        if out.is_empty() {
            out.push("as is".to_string());
        }
        out
    }

    fn describe_levers(
        autocast: Option<Kind>,
        accumulate: u32,
        micro: i64,
        optimizer: Optimizer,
        asked: Optimizer,
        asked_autocast: Option<Kind>,
    ) -> String {
        let lower = autocast.filter(|_| asked_autocast.is_none());
        let words = lever_words(lower, accumulate, micro, optimizer, asked);
        if words.is_empty() {
            "as is".to_string()
        } else {
            words.join(", ")
        }
    }

    /// How to apply it in a tch training loop, a line per lever.
    pub fn code(&self, asked: Optimizer) -> Vec<String> {
        let mut out = Vec::new();
        if !self.config.allocator_conf.is_empty() {
            out.push(format!(
                "export PYTORCH_CUDA_ALLOC_CONF={}",
                self.config.allocator_conf
            ));
        }
        if let Some(k) = self.cost.lower_precision {
            out.push(format!(
                "let loss = tch_memprof::autocast(Device::Cuda(0), Kind::{k:?}, || loss_fn(&model.forward_t(&xs, true)))?;"
            ));
        }
        if self.config.accumulate > 1 {
            // The loop the estimate ran: one micro-batch on the GPU at a time, gradients
            // set to none at the first backward, one optimizer step per batch.
            out.push(format!(
                "for (i, xs) in micro_batches.enumerate() {{ let loss = loss_fn(&model.forward_t(&xs, true)) / {k}.; if i % {k} == 0 {{ opt.zero_grad(); }} loss.backward(); if i % {k} == {last} {{ opt.step(); }} }}  // micro-batches of {micro}",
                k = self.config.accumulate,
                last = self.config.accumulate - 1,
                micro = self.micro_batch
            ));
        }
        if self.config.optimizer != asked {
            out.push(format!(
                "let opt = {}.build(&vs, lr)?;",
                optimizer_code(self.config.optimizer)
            ));
        }
        out
    }
}

fn lever_words(
    lower_precision: Option<Kind>,
    accumulate: u32,
    micro: i64,
    optimizer: Optimizer,
    asked: Optimizer,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(k) = lower_precision {
        out.push(format!("{} autocast", dtype_name(k)));
    }
    if accumulate > 1 {
        out.push(format!("{accumulate} x micro-batch {micro}"));
    }
    if optimizer != asked {
        out.push(format!("optimizer {}", optimizer.name()));
    }
    out
}

fn dtype_name(k: Kind) -> &'static str {
    match k {
        Kind::BFloat16 => "bf16",
        Kind::Half => "f16",
        _ => "f32",
    }
}

fn optimizer_code(o: Optimizer) -> &'static str {
    match o {
        Optimizer::Sgd => "nn::Sgd::default()",
        Optimizer::SgdMomentum => "nn::Sgd { momentum: 0.9, ..Default::default() }",
        Optimizer::Adam => "nn::Adam::default()",
        Optimizer::AdamW => "nn::AdamW::default()",
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

impl fmt::Display for Dominant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dominant::Weights => "weights",
            Dominant::Gradients => "gradients",
            Dominant::OptimizerState => "optimizer state",
            Dominant::Activations => "activations",
        })
    }
}

/// The peak of a plan split into weights, gradients (one per weight, float32 as tch
/// keeps them), optimizer state (per weight: Adam and AdamW 2, SGD with momentum 1,
/// SGD 0) and the rest (activations, temporaries, workspaces), in bytes.
pub fn breakdown(plan: &Plan) -> [(Dominant, u64); 4] {
    let w = plan.estimate.weights_bytes;
    let state = match plan.config.optimizer {
        Optimizer::Adam | Optimizer::AdamW => 2 * w,
        Optimizer::SgdMomentum => w,
        Optimizer::Sgd => 0,
    };
    let rest = plan.estimate.peak_allocated.saturating_sub(2 * w + state);
    [
        (Dominant::Weights, w),
        (Dominant::Gradients, w),
        (Dominant::OptimizerState, state),
        (Dominant::Activations, rest),
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
}

/// How many plans that fit a search returns at most.
pub const MAX_PLANS: usize = 5;

/// The allocator settings tried with every configuration: the user's own, then each
/// candidate (`expandable_segments:True` maps segments as they grow, which removes most
/// of the gap between reserved and allocated; `max_split_size_mb:128` keeps large free
/// blocks whole; `roundup_power2_divisions:4` rounds requests to fewer sizes).
fn allocator_candidates(base: &AllocatorConfig) -> Result<Vec<(String, AllocatorConfig)>> {
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
fn optimizer_candidates(asked: Optimizer) -> Vec<Optimizer> {
    match asked {
        Optimizer::Adam | Optimizer::AdamW => {
            vec![asked, Optimizer::SgdMomentum, Optimizer::Sgd]
        }
        Optimizer::SgdMomentum => vec![asked, Optimizer::Sgd],
        Optimizer::Sgd => vec![asked],
    }
}

/// Micro-batches per step that split `batch` evenly, fewest first.
fn accumulate_candidates(batch: i64) -> Vec<u32> {
    (1..=batch)
        .filter(|k| batch % k == 0)
        .filter_map(|k| u32::try_from(k).ok())
        .collect()
}

/// The autocast dtypes tried: the one asked for (none by default), then bfloat16 on a
/// GPU that has it (compute capability 8.0 and later), else float16.
fn autocast_candidates(options: &Options) -> Vec<Option<Kind>> {
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

impl Model {
    /// The configurations of a training step at `inputs` (the batch is the first size of
    /// the first input, kept as the effective batch) whose predicted peak reserved fits
    /// in `memory`, cheapest first (at most [`MAX_PLANS`]), or, when none does, the one
    /// with the smallest peak.
    pub fn plan(
        &self,
        inputs: &[Input],
        optimizer: Optimizer,
        options: &Options,
        memory: u64,
    ) -> Result<Plans> {
        let batch = inputs.first().map_or(1, Input::batch);
        if memory == 0 {
            return Err(Error::InvalidInput {
                name: "memory",
                value: "0".into(),
                reason: "the budget must be positive".into(),
            });
        }
        let allocators = allocator_candidates(&options.allocator)?;
        // Every configuration but the allocator's, cheapest first (the allocator's
        // settings are free, so each is tried with all of them).
        let mut configs = Vec::new();
        for o in optimizer_candidates(optimizer) {
            for k in accumulate_candidates(batch) {
                for a in autocast_candidates(options) {
                    configs.push((o, k, a));
                }
            }
        }
        let cost = |o: Optimizer, k: u32, a: Option<Kind>, alloc: bool| Cost {
            changes_training: o != optimizer,
            recompute: 0.0,
            accumulate: k,
            lower_precision: a.filter(|_| options.autocast.is_none()),
            allocator_changed: alloc,
        };
        configs.sort_by(|x, y| {
            cost(x.0, x.1, x.2, false)
                .partial_cmp(&cost(y.0, y.1, y.2, false))
                .unwrap_or(Ordering::Equal)
        });
        let mut fits: Vec<Plan> = Vec::new();
        let mut smallest: Option<Plan> = None;
        let mut dry_runs = 0;
        let mut skipped = Vec::new();
        for (o, k, a) in configs {
            if fits.len() >= MAX_PLANS {
                break;
            }
            let micro = batch / i64::from(k);
            let xs: Vec<Input> = inputs.iter().map(|i| i.with_batch(micro)).collect();
            let opts = Options {
                accumulate: k,
                autocast: a,
                ..options.clone()
            };
            let settings: Vec<AllocatorConfig> =
                allocators.iter().map(|(_, c)| c.clone()).collect();
            let first = dry_runs == 0;
            dry_runs += 1;
            let estimates = match self.estimate_each(&xs, Mode::Train(o), &opts, &settings) {
                Ok(e) => e,
                // The step as asked fails: the model does, say so. A lever's
                // configuration fails (an op autocast refuses): skip it, say why.
                Err(e) if first => return Err(e),
                Err(e) => {
                    let what = Plan::describe_levers(a, k, micro, o, optimizer, options.autocast);
                    skipped.push(format!("{what}: {e}"));
                    continue;
                }
            };
            let mut tried: Vec<Plan> = allocators
                .iter()
                .zip(estimates)
                .map(|((conf, c), e)| Plan {
                    config: Config {
                        autocast: a,
                        accumulate: k,
                        optimizer: o,
                        allocator: c.clone(),
                        allocator_conf: conf.clone(),
                    },
                    micro_batch: micro,
                    cost: cost(o, k, a, !conf.is_empty()),
                    estimate: e,
                    allocator_alternatives: Vec::new(),
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
            let chosen = Plan {
                allocator_alternatives: alternatives,
                ..chosen
            };
            if chosen.estimate.peak_reserved <= memory {
                fits.push(chosen);
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
        })
    }
}

impl Cost {
    /// In words: `free`, `2 steps per batch`, `+33% FLOPs`, `changes training`, ...
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.changes_training {
            parts.push("changes training".to_string());
        }
        if self.recompute > 0.0 {
            parts.push(format!("+{:.0}% FLOPs recomputed", 100.0 * self.recompute));
        }
        if self.accumulate > 1 {
            parts.push(format!("{} steps per batch", self.accumulate));
        }
        if let Some(k) = self.lower_precision {
            parts.push(format!("{} numerics", dtype_name(k)));
        }
        if parts.is_empty() {
            parts.push("free".to_string());
        }
        parts.join(", ")
    }
}

impl Plans {
    /// When no plan fits: one line with the smallest peak reserved any plan reached, its
    /// levers and what dominates its peak allocated (weights, gradients, optimizer state,
    /// activations). `None` when a plan fits.
    pub fn nothing_fits(&self) -> Option<String> {
        use crate::format::bytes;

        if !self.fits.is_empty() {
            return None;
        }
        let mut line = format!("nothing fits in {}", bytes(self.memory));
        if let Some(p) = &self.smallest {
            let parts = breakdown(p);
            let (what, _) = parts
                .iter()
                .max_by_key(|(_, b)| *b)
                .copied()
                .unwrap_or((Dominant::Activations, 0));
            let list: Vec<String> = parts
                .iter()
                .map(|(d, b)| format!("{d} {}", bytes(*b)))
                .collect();
            line.push_str(&format!(
                ": the smallest peak reserved of any plan is {} ({}), dominated by {what} ({} of {} allocated)",
                bytes(p.estimate.peak_reserved),
                p.levers(self.optimizer).join(", "),
                list.join(", "),
                bytes(p.estimate.peak_allocated)
            ));
        }
        Some(line)
    }
}

impl fmt::Display for Plans {
    /// The plans that fit as a table (cheapest first) and the code of the first; or,
    /// when none fits, the smallest peak reached and what dominates it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use comfy_table::{presets::UTF8_FULL, CellAlignment, ContentArrangement, Table};

        use crate::format::bytes;

        for why in &self.skipped {
            writeln!(f, "skipped ({why})")?;
        }
        if let Some(line) = self.nothing_fits() {
            return writeln!(f, "{line}");
        }
        let mut t = Table::new();
        t.load_preset(UTF8_FULL)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(vec!["#", "plan", "peak reserved", "cost"]);
        // A lever per line, so that the table reads on a narrow terminal.
        for (i, p) in self.fits.iter().enumerate() {
            t.add_row(vec![
                (i + 1).to_string(),
                p.levers(self.optimizer).join("\n"),
                format!(
                    "{}\n{} left",
                    bytes(p.estimate.peak_reserved),
                    bytes(p.margin(self.memory))
                ),
                p.cost.describe().replace(", ", "\n"),
            ]);
        }
        for c in [0, 2] {
            if let Some(col) = t.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        writeln!(f, "{t}")?;
        writeln!(
            f,
            "{} plan(s) fit in {} ({} dry run(s)).",
            self.fits.len(),
            bytes(self.memory),
            self.dry_runs
        )?;
        let first = &self.fits[0];
        let others: Vec<String> = first
            .allocator_alternatives
            .iter()
            .filter(|(conf, _)| *conf != first.config.allocator_conf)
            .map(|(conf, reserved)| {
                let name = if conf.is_empty() {
                    "your settings"
                } else {
                    conf
                };
                format!("{name} {}", bytes(*reserved))
            })
            .collect();
        if !others.is_empty() {
            writeln!(
                f,
                "Plan 1's peak reserved under other allocator settings: {}.",
                others.join(", ")
            )?;
        }
        let code = first.code(self.optimizer);
        if code.is_empty() {
            writeln!(f, "Plan 1 is the step as it is: nothing to change.")
        } else {
            writeln!(f, "Plan 1 in a tch loop:")?;
            for line in code {
                writeln!(f, "    {line}")?;
            }
            Ok(())
        }
    }
}
