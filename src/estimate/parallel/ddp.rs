//! DDP: the one-GPU dry run with `DistributedDataParallel`'s gradient buckets
//! (`torch/nn/parallel/distributed.py` and the reducer of PyTorch 2.11: one bucket of
//! every parameter at construction, as `find_unused_parameters=False` asks; rebuilt at the
//! second iteration's forward pass from the order the gradients became ready, a first
//! bucket closed at 1 MiB, the others at 25 MiB; with `gradient_as_bucket_view` the
//! gradients are views into them).

use std::collections::{HashMap, HashSet};

use super::walk::{freed, surviving_backward_births, unique_blocks, Sharded};
use super::{Ddp, ShardedCategory, Var};
use crate::events::{Event, EventKind};
use crate::phase::Phase;

/// Block ids of the buckets.
const BUCKET_ID: u64 = 0x5C00_0000_0000_0000;
/// The rebuilt buckets' caps: the first, then every other.
const FIRST_BUCKET: u64 = 1 << 20;
const BUCKET: u64 = 25 << 20;

/// Bucket sizes (bytes) of `params` (each a parameter's bytes, in the order their
/// gradients become ready), as `_compute_bucket_assignment_by_size` closes them: a bucket
/// closes once it holds at least its cap, the first's 1 MiB, the rest 25 MiB.
pub(crate) fn rebuilt_buckets(params: &[u64]) -> Vec<u64> {
    let mut buckets = Vec::new();
    let mut now = 0;
    for &p in params {
        now += p;
        let cap = if buckets.is_empty() {
            FIRST_BUCKET
        } else {
            BUCKET
        };
        if now >= cap {
            buckets.push(now);
            now = 0;
        }
    }
    if now > 0 {
        buckets.push(now);
    }
    buckets
}

/// A rank of `ddp` over the dry run (`weights`, `run`) of a model whose variables are
/// `vars`, in the order the model registered them.
/// `foreach_set`: the optimizer's step makes one parameter-sized set at once (PyTorch's
/// foreach Adam and AdamW).
pub(crate) fn replicate(
    weights: &[Event],
    run: &[Event],
    vars: &[Var],
    ddp: &Ddp,
    foreach_set: bool,
) -> Sharded {
    let mut categories: HashMap<u64, ShardedCategory> = HashMap::new();
    let trainable: HashSet<u64> = vars.iter().filter(|v| v.trainable).map(|v| v.ptr).collect();
    let params: Vec<u64> = vars
        .iter()
        .filter(|v| v.trainable)
        .map(|v| v.bytes_in(v.kind))
        .collect();
    let mut out_weights: Vec<Event> = Vec::with_capacity(weights.len() + 1);
    for e in weights {
        if e.is_alloc() {
            let cat = if trainable.contains(&e.ptr) {
                ShardedCategory::Parameters
            } else {
                ShardedCategory::Buffers
            };
            if vars.iter().any(|v| v.ptr == e.ptr) {
                categories.insert(e.ptr, cat);
            }
        }
        out_weights.push(*e);
    }
    let mut next_id = BUCKET_ID;
    let mut bucket = |bytes: u64, at: &Event, out: &mut Vec<Event>| {
        next_id += 1;
        out.push(Event {
            kind: EventKind::Alloc { stream: 0 },
            ptr: next_id,
            value: bytes as i64,
            aux: 0,
            op: -1,
            ..*at
        });
        next_id
    };
    // At construction: one bucket of every parameter.
    let mut live: Vec<u64> = Vec::new();
    let total: u64 = params.iter().sum();
    if let Some(last) = weights.last() {
        if total > 0 {
            let id = bucket(total, last, &mut out_weights);
            categories.insert(id, ShardedCategory::Buckets);
            live.push(id);
        }
    }
    let run = unique_blocks(run);
    let grads = surviving_backward_births(&run);
    // With bucket views: autograd's gradients, freed when their op returns (the reducer
    // copies each into its bucket's view and points the parameter's gradient there).
    let mut copied: HashMap<i32, Vec<u64>> = HashMap::new();
    let mut dropped: HashSet<u64> = HashSet::new();
    let mut foreach_temp: Option<u64> = None;
    let mut out = Vec::with_capacity(run.len() + 64);
    let mut step = 0;
    let mut rebuilt = false;
    for (i, e) in run.iter().enumerate() {
        match e.kind {
            EventKind::Phase => {
                if let Some(id) = foreach_temp.take() {
                    out.push(freed(id, e));
                }
                step = step.max(e.generation);
                out.push(*e);
            }
            EventKind::OpEnd if copied.contains_key(&e.op) => {
                out.push(*e);
                for ptr in copied.remove(&e.op).unwrap_or_default() {
                    dropped.insert(ptr);
                    out.push(freed(ptr, e));
                }
            }
            // The second iteration's forward pass rebuilds the buckets, in the order the
            // gradients became ready, taken as the reverse of the order the model
            // registered its parameters (the order a model's forward pass uses them).
            EventKind::OpBegin if step >= 2 && !rebuilt && e.phase == Phase::Forward => {
                rebuilt = true;
                for id in live.drain(..) {
                    out.push(freed(id, e));
                }
                let ready: Vec<u64> = params.iter().rev().copied().collect();
                for b in rebuilt_buckets(&ready) {
                    let id = bucket(b, e, &mut out);
                    categories.insert(id, ShardedCategory::Buckets);
                    live.push(id);
                }
                out.push(*e);
            }
            EventKind::Alloc { .. } if grads.contains(&i) => {
                categories.insert(e.ptr, ShardedCategory::UnshardedGradients);
                out.push(*e);
                if ddp.gradient_as_bucket_view {
                    copied.entry(e.op).or_default().push(e.ptr);
                }
            }
            EventKind::Alloc { .. } if e.phase == Phase::Optimizer => {
                if foreach_set && foreach_temp.is_none() && total > 0 {
                    // PyTorch's foreach step: one more parameter-sized set, for the step.
                    let id = bucket(total, e, &mut out);
                    categories.insert(id, ShardedCategory::OptimizerState);
                    foreach_temp = Some(id);
                }
                categories.insert(e.ptr, ShardedCategory::OptimizerState);
                out.push(*e);
            }
            EventKind::Free if dropped.remove(&e.ptr) => {}
            _ => out.push(*e),
        }
    }
    Sharded {
        weights: out_weights,
        events: out,
        categories,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebuilt_buckets_close_at_1_mib_then_25_mib() {
        let mib = 1u64 << 20;
        // 0.5 + 0.75 MiB close the first bucket (1.25 MiB); 10 + 10 + 10 MiB the second
        // (30 MiB, past 25); the last 4 MiB is a bucket of its own.
        let params = [mib / 2, 3 * mib / 4, 10 * mib, 10 * mib, 10 * mib, 4 * mib];
        assert_eq!(rebuilt_buckets(&params), [5 * mib / 4, 30 * mib, 4 * mib]);
    }
}
