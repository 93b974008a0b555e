//! Peaks gathered over the iterations of an epoch and of the whole run.

use crate::stats::IterationStats;

/// Highest values seen over a span of iterations.
#[derive(Debug, Default, Clone)]
pub(super) struct Peaks {
    pub iterations: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub feature_maps: u64,
    pub intermediate: u64,
}

impl Peaks {
    pub(super) fn add(&mut self, s: &IterationStats) {
        self.iterations += 1;
        self.allocated = self.allocated.max(s.peak_allocated_bytes);
        self.reserved = self.reserved.max(s.peak_reserved_bytes);
        self.feature_maps = self.feature_maps.max(s.feature_maps_bytes);
        self.intermediate = self.intermediate.max(s.intermediate_gradients_bytes);
    }
}
