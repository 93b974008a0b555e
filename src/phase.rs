//! The phases of an iteration, found without user calls (see the crate docs).

use serde::{Deserialize, Serialize};

use crate::ffi::native;

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
    /// The phase the native layer numbers `p` (its idle state reads as forward).
    pub(crate) fn from_native(p: impl Into<u32>) -> Phase {
        match p.into() {
            native::PHASE_BACKWARD => Phase::Backward,
            native::PHASE_OPTIMIZER => Phase::Optimizer,
            _ => Phase::Forward,
        }
    }

    /// Lower-case name, as in the CSV.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_numbers_map_to_phases() {
        assert_eq!(Phase::from_native(native::PHASE_FORWARD), Phase::Forward);
        assert_eq!(
            Phase::from_native(native::PHASE_BACKWARD as u8),
            Phase::Backward
        );
        assert_eq!(
            Phase::from_native(native::PHASE_OPTIMIZER),
            Phase::Optimizer
        );
    }
}
