//! A prediction held to the run it predicted: the allocation requests of an estimate's
//! dry run (as the one replay asked the allocator: the weights', the run's, the cuBLAS
//! and the kernels' workspaces) aligned with a recorded CUDA run's `alloc` actions
//! ([`Recording`]), by Myers' diff of the two sequences of requested sizes. Where they
//! diverge, and with which op of the prediction, is where the estimate misses. The
//! weights are compared as a set: the recorded requests from the first on that the
//! predicted weights account for (the order a program's tensors are moved to the GPU
//! in is the loader's, not the estimate's concern), then the rest in order.

use std::collections::HashMap;

use similar::{capture_diff_slices, Algorithm, DiffOp};

use super::recorded::{Action, Peaks, Recording};
use crate::names::Names;
use crate::replay::Request;

/// One place where the prediction's requests and the recorded ones part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The first recorded request of it (0-based, among the recorded `alloc`s).
    pub recorded_at: usize,
    /// The first predicted request of it (0-based, among the predicted requests after
    /// the weights' the record has).
    pub predicted_at: usize,
    /// The recorded requests (bytes) the prediction does not make there.
    pub recorded: Vec<u64>,
    /// The predicted requests (bytes, op) the record does not have there.
    pub predicted: Vec<(u64, String)>,
}

impl Divergence {
    /// Bytes the prediction asked for here less those the record asked for.
    pub fn net_bytes(&self) -> i64 {
        self.predicted.iter().map(|(b, _)| *b as i64).sum::<i64>()
            - self.recorded.iter().map(|b| *b as i64).sum::<i64>()
    }
}

/// A prediction against a recorded run.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Requests the record holds (`alloc` actions).
    pub recorded_requests: usize,
    /// Requests the prediction made.
    pub predicted_requests: usize,
    /// Requests of the same size in the same order on both sides (the weights' in any
    /// order).
    pub matched: usize,
    /// The predicted weights' requests the record has at its start.
    pub weights_matched: usize,
    /// Where they part, in order.
    pub divergences: Vec<Divergence>,
    /// The recorded peaks.
    pub recorded: Peaks,
    /// The predicted peaks.
    pub predicted: Peaks,
}

impl Comparison {
    /// Aligns `predicted` (with their ops' names from `names`) with `recording`'s.
    /// `weights`: how many of `predicted` (the first) are the weights'.
    pub(crate) fn new(
        recording: &Recording,
        predicted: &[Request],
        weights: usize,
        names: &mut Names,
        peaks: Peaks,
    ) -> Comparison {
        let all: Vec<u64> = recording
            .events
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .map(|e| e.size)
            .collect();
        // The weights as a set: the recorded requests from the first on that the
        // predicted weights account for; those left over are compared in order.
        let mut left: HashMap<u64, usize> = HashMap::new();
        for r in &predicted[..weights.min(predicted.len())] {
            *left.entry(r.bytes).or_default() += 1;
        }
        let mut skip = 0;
        while let Some(n) = all
            .get(skip)
            .and_then(|b| left.get_mut(b))
            .filter(|n| **n > 0)
        {
            *n -= 1;
            skip += 1;
        }
        let mut rest: Vec<Request> = predicted[..weights.min(predicted.len())]
            .iter()
            .filter(|r| {
                left.get_mut(&r.bytes)
                    .filter(|n| **n > 0)
                    .map(|n| *n -= 1)
                    .is_some()
            })
            .copied()
            .collect();
        rest.extend_from_slice(&predicted[weights.min(predicted.len())..]);
        let recorded = &all[skip..];
        let sizes: Vec<u64> = rest.iter().map(|r| r.bytes).collect();
        let mut matched = skip;
        let mut divergences: Vec<Divergence> = Vec::new();
        for op in capture_diff_slices(Algorithm::Myers, recorded, &sizes) {
            let (old, new) = match op {
                DiffOp::Equal { len, .. } => {
                    matched += len;
                    continue;
                }
                DiffOp::Delete {
                    old_index,
                    old_len,
                    new_index,
                } => ((old_index, old_len), (new_index, 0)),
                DiffOp::Insert {
                    old_index,
                    new_index,
                    new_len,
                } => ((old_index, 0), (new_index, new_len)),
                DiffOp::Replace {
                    old_index,
                    old_len,
                    new_index,
                    new_len,
                } => ((old_index, old_len), (new_index, new_len)),
            };
            divergences.push(Divergence {
                recorded_at: skip + old.0,
                predicted_at: new.0,
                recorded: recorded[old.0..old.0 + old.1].to_vec(),
                predicted: rest[new.0..new.0 + new.1]
                    .iter()
                    .map(|r| (r.bytes, names.get(r.op)))
                    .collect(),
            });
        }
        Comparison {
            recorded_requests: all.len(),
            predicted_requests: predicted.len(),
            matched,
            weights_matched: skip,
            divergences,
            recorded: recording.recorded_peaks(),
            predicted: peaks,
        }
    }

    /// The predicted requests the record does not have, and the recorded ones the
    /// prediction does not make, by the prediction's op there (the op of the first
    /// predicted request of the divergence for recorded ones): (op, predicted-only bytes,
    /// recorded-only bytes), the largest difference first.
    pub fn by_op(&self) -> Vec<(String, u64, u64)> {
        let mut by: HashMap<String, (u64, u64)> = HashMap::new();
        for d in &self.divergences {
            let at = d
                .predicted
                .first()
                .map_or_else(|| "(none)".to_string(), |(_, op)| op.clone());
            for (b, op) in &d.predicted {
                by.entry(op.clone()).or_default().0 += b;
            }
            by.entry(at).or_default().1 += d.recorded.iter().sum::<u64>();
        }
        let mut rows: Vec<(String, u64, u64)> =
            by.into_iter().map(|(op, (p, r))| (op, p, r)).collect();
        rows.sort_by_key(|(op, p, r)| (std::cmp::Reverse(p.abs_diff(*r)), op.clone()));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::recorded::{RecordedEvent, NO_SITE};

    fn recording(sizes: &[u64]) -> Recording {
        Recording {
            events: sizes
                .iter()
                .enumerate()
                .map(|(i, s)| RecordedEvent {
                    action: Action::Alloc,
                    addr: 4096 * (i as u64 + 1),
                    size: *s,
                    site: NO_SITE,
                    stream: 0,
                })
                .collect(),
            ..Recording::default()
        }
    }

    fn requests(sizes: &[u64]) -> Vec<Request> {
        sizes
            .iter()
            .map(|b| Request { bytes: *b, op: -1 })
            .collect()
    }

    /// Weights moved in another order match as a set; then one request the record has
    /// and the prediction does not, one replaced by a larger one, one extra at the end.
    #[test]
    fn requests_align_by_hand() {
        let rec = recording(&[30, 10, 20, 100, 7, 200, 300]);
        let pred = requests(&[10, 20, 30, 100, 250, 300, 9]);
        let c = Comparison::new(&rec, &pred, 3, &mut Names::default(), Peaks::default());
        assert_eq!((c.recorded_requests, c.predicted_requests), (7, 7));
        // 3 weights, then 100 and 300.
        assert_eq!((c.weights_matched, c.matched), (3, 5));
        let parts: Vec<(usize, Vec<u64>, Vec<u64>)> = c
            .divergences
            .iter()
            .map(|d| {
                (
                    d.recorded_at,
                    d.recorded.clone(),
                    d.predicted.iter().map(|(b, _)| *b).collect(),
                )
            })
            .collect();
        assert_eq!(
            parts,
            vec![(4, vec![7, 200], vec![250]), (7, vec![], vec![9]),]
        );
        assert_eq!(c.divergences[0].net_bytes(), 250 - 207);
        // By op: every predicted-only byte under the prediction's op ("(none)" here).
        assert_eq!(c.by_op(), vec![("(none)".to_string(), 259, 207)]);
    }

    /// A weight the record never has stays predicted-only, compared in order after the
    /// weights the record has.
    #[test]
    fn a_weight_the_record_lacks_is_a_divergence() {
        let rec = recording(&[10, 20, 5]);
        let pred = requests(&[20, 10, 64, 5]);
        let c = Comparison::new(&rec, &pred, 3, &mut Names::default(), Peaks::default());
        assert_eq!((c.weights_matched, c.matched), (2, 3));
        assert_eq!(c.divergences.len(), 1);
        assert_eq!(c.divergences[0].recorded_at, 2);
        assert_eq!(c.divergences[0].predicted[0].0, 64);
    }
}
