//! The phases of an iteration, found without user calls (see the crate docs).

use serde::{Deserialize, Serialize};

/// Phase of an op or of a block's birth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    /// From the iteration's first op to the first autograd node.
    #[serde(rename = "forward")]
    Forward,
    /// Autograd nodes, until control returns to user code.
    #[serde(rename = "backward")]
    Backward,
    /// After backward, until the next forward op or `record_stats`.
    #[serde(rename = "optimizer")]
    Optimizer,
}

impl Phase {
    /// Lower-case name, as in the CSV.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}
