//! Step anatomy: live bytes by category after every op of one iteration, the peak and
//! who reached it, per-layer memory and FLOPs.
//!
//! The values of the step anatomy: what the replay's step passes make of one step's
//! events, whichever source they came from (a profiled iteration's step log, the
//! estimator's dry run, a recorded snapshot), and what the reports read. Nothing here
//! runs while the model does, and nothing here prints or writes files.

mod scope;
pub(crate) mod sites;
mod types;

pub use scope::{scope, Scope};
pub use types::{
    Category, CategoryBytes, IdleAtPeak, IdleBlock, IdleGroup, IdleSite, LayerProfile, Peak,
    StepFiles, StepProfile, StepRow, UncountedOp, UNKNOWN_SITE,
};
pub(crate) use types::{IdleReplay, LiveCurve, StepKind, StepStart, VarEntry, CATEGORIES};
