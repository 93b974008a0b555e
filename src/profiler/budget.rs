//! Memory budgets that tests can assert.
//!
//! ```no_run
//! # use tch::nn;
//! # let vs = nn::VarStore::new(tch::Device::Cpu);
//! # let profiler = tch_memprof::MemoryProfiler::new(&vs).unwrap();
//! use tch_memprof::Budget;
//! // after a few training steps:
//! profiler.assert_budget(
//!     &Budget::new()
//!         .peak_allocated(96 << 20)
//!         .feature_maps(8 << 20),
//! );
//! ```

use std::collections::HashMap;
use std::fmt;

use crate::format;
use crate::names::layer_of;
use crate::stats::RunStats;
use crate::timeline::LayerProfile;

/// Limits, in bytes, on the numbers of a run; unset limits are not checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budget {
    peak_allocated: Option<u64>,
    feature_maps: Option<u64>,
    intermediate_gradients: Option<u64>,
    weights: Option<u64>,
    gradients: Option<u64>,
    optimizer_state: Option<u64>,
    other: Option<u64>,
}

macro_rules! limit {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub fn $name(mut self, bytes: u64) -> Self {
            self.$name = Some(bytes);
            self
        }
    };
}

impl Budget {
    /// A budget with no limit set.
    pub fn new() -> Self {
        Self::default()
    }

    limit!(
        /// The highest peak allocated bytes of any iteration of the run.
        peak_allocated
    );
    limit!(
        /// The largest feature maps of any iteration.
        feature_maps
    );
    limit!(
        /// The largest intermediate gradients of any iteration.
        intermediate_gradients
    );
    limit!(
        /// Weights (all VarStore variables) at the last report.
        weights
    );
    limit!(
        /// Weight gradients at the last report.
        gradients
    );
    limit!(
        /// Optimizer state at the last report.
        optimizer_state
    );
    limit!(
        /// Other live bytes at the last report (what is neither weights, gradients nor
        /// optimizer state: user tensors, leaks).
        other
    );

    pub(crate) fn check(
        &self,
        stats: &RunStats,
        peak_layers: Option<&[LayerProfile]>,
    ) -> Result<(), BudgetExceeded> {
        let Some(last) = &stats.last else {
            return Err(BudgetExceeded {
                over: Vec::new(),
                by_category: Vec::new(),
                by_layer: Vec::new(),
                note: Some(
                    "nothing was measured yet: call record_stats after at least one \
                     iteration before checking a budget"
                        .into(),
                ),
            });
        };
        let measured = [
            (
                "peak allocated",
                self.peak_allocated,
                stats.peak_allocated_bytes,
            ),
            (
                "feature maps",
                self.feature_maps,
                stats.peak_feature_maps_bytes,
            ),
            (
                "intermediate gradients",
                self.intermediate_gradients,
                stats.peak_intermediate_gradients_bytes,
            ),
            ("weights", self.weights, last.weights_bytes),
            ("gradients", self.gradients, last.gradients_bytes),
            (
                "optimizer state",
                self.optimizer_state,
                last.optimizer_state_bytes,
            ),
            ("other", self.other, last.other_bytes),
        ];
        let over: Vec<Overrun> = measured
            .iter()
            .filter_map(|&(what, limit, bytes)| {
                limit.filter(|&l| bytes > l).map(|limit| Overrun {
                    what,
                    limit,
                    measured: bytes,
                })
            })
            .collect();
        if over.is_empty() {
            return Ok(());
        }
        let mut by_category = vec![
            ("weights", last.weights_bytes),
            ("gradients", last.gradients_bytes),
            ("optimizer state", last.optimizer_state_bytes),
            ("other", last.other_bytes),
            ("feature maps (peak)", stats.peak_feature_maps_bytes),
            (
                "intermediate gradients (peak)",
                stats.peak_intermediate_gradients_bytes,
            ),
        ];
        by_category.sort_by_key(|&(name, b)| (std::cmp::Reverse(b), name));

        let mut layers: HashMap<String, LayerUse> = HashMap::new();
        for v in &last.variables {
            let l = layers.entry(layer_of(&v.name)).or_default();
            l.weights += v.bytes;
            l.gradients += v.grad_bytes.unwrap_or(0);
        }
        for p in peak_layers.unwrap_or_default() {
            layers.entry(p.layer.clone()).or_default().activations = Some(p.activation_bytes);
        }
        let mut by_layer: Vec<LayerUse> = layers
            .into_iter()
            .map(|(layer, u)| LayerUse { layer, ..u })
            .collect();
        by_layer.sort_by(|a, b| b.total().cmp(&a.total()).then(a.layer.cmp(&b.layer)));
        by_layer.truncate(10);
        Err(BudgetExceeded {
            over,
            by_category: by_category
                .into_iter()
                .map(|(n, b)| (n.to_string(), b))
                .collect(),
            by_layer,
            note: peak_layers.is_none().then(|| {
                "activations per layer need the step timeline (builder .timeline(true))".into()
            }),
        })
    }
}

/// A limit that was exceeded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overrun {
    /// Which number (`peak allocated`, `feature maps`, ...).
    pub what: &'static str,
    /// The limit, bytes.
    pub limit: u64,
    /// The measured value, bytes.
    pub measured: u64,
}

/// Memory of one layer, for a budget's failure message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerUse {
    /// Layer name (a VarStore path without its last component).
    pub layer: String,
    /// Its variables' bytes.
    pub weights: u64,
    /// Its variables' gradients.
    pub gradients: u64,
    /// Activations it kept for backward in the peak step (with the step timeline on).
    pub activations: Option<u64>,
}

impl LayerUse {
    fn total(&self) -> u64 {
        self.weights + self.gradients + self.activations.unwrap_or(0)
    }
}

/// Why a budget check failed: what went over, and the largest consumers.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetExceeded {
    /// The limits exceeded (empty when nothing was measured yet; see `note`).
    pub over: Vec<Overrun>,
    /// Categories, largest first: weights, gradients, optimizer state and other at the
    /// last report; feature maps and intermediate gradients at their peaks.
    pub by_category: Vec<(String, u64)>,
    /// The ten largest layers by weights + gradients (+ activations).
    pub by_layer: Vec<LayerUse>,
    /// Anything else worth saying.
    pub note: Option<String>,
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.over.is_empty() {
            return write!(
                f,
                "memory budget not checked: {}",
                self.note.as_deref().unwrap_or("no data")
            );
        }
        writeln!(f, "memory budget exceeded:")?;
        for o in &self.over {
            writeln!(
                f,
                "  {}: {} measured ({} B), budget {} ({} B): {} over",
                o.what,
                format::bytes(o.measured),
                o.measured,
                format::bytes(o.limit),
                o.limit,
                format::bytes(o.measured - o.limit)
            )?;
        }
        writeln!(f, "largest consumers by category:")?;
        for (name, b) in &self.by_category {
            writeln!(f, "  {name:<30} {:>12}", format::bytes(*b))?;
        }
        if !self.by_layer.is_empty() {
            writeln!(f, "largest layers:")?;
            for l in &self.by_layer {
                write!(
                    f,
                    "  {:<30} weights {:>11}, gradients {:>11}",
                    l.layer,
                    format::bytes(l.weights),
                    format::bytes(l.gradients)
                )?;
                if let Some(a) = l.activations {
                    write!(f, ", activations {:>11}", format::bytes(a))?;
                }
                writeln!(f)?;
            }
        }
        if let Some(n) = &self.note {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

// `unwrap()` and `expect()` print Debug: make it the readable message.
impl fmt::Debug for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for BudgetExceeded {}
