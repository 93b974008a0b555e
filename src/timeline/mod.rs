//! Step anatomy: live bytes by category after every op of one iteration, the peak and
//! who reached it, per-layer memory and FLOPs.
//!
//! The native step log records every block birth and death, op begin and end, phase
//! change and counted FLOP of an iteration; once the iteration is over, the
//! recorder replays it into a [`StepProfile`]. The estimator's dry run is one more
//! source of the same events (the meta trace), replayed by the same passes
//! once its bytes went through the caching-allocator model
//! ([`Estimate::step`](crate::estimate::Estimate::step)).
//! Nothing here runs while the model does, and nothing here prints or writes files:
//! the profiler hands profiles to its reports.

mod recorder;
mod replay;
mod scope;
pub(crate) mod sites;
mod template;
mod types;

pub use crate::phase::Phase;
pub(crate) use recorder::{Recorder, StepKind};
pub(crate) use replay::replay as replay_step;
pub use scope::{scope, Scope};
#[cfg(test)]
pub(crate) use types::CATEGORIES;
pub use types::{
    Category, CategoryBytes, IdleAtPeak, IdleBlock, IdleGroup, IdleSite, LayerProfile, Peak,
    StepFiles, StepProfile, StepRow, UncountedOp, UNKNOWN_SITE,
};
pub(crate) use types::{StepStart, VarEntry};
