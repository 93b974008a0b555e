//! Sharded data parallelism: a rank's peak under PyTorch's FSDP2 (`fully_shard`), from
//! the one-GPU dry run.
//!
//! The dry run gives the step's own events (activations, gradients, the optimizer's
//! temporaries) as one GPU makes them; FSDP2 changes the model's states and adds its
//! buffers at the units' boundaries. Read from PyTorch 2.11's
//! `torch/distributed/fsdp/_fully_shard/` (`_fsdp_param.py`, `_fsdp_param_group.py`,
//! `_fsdp_collectives.py`, `_fsdp_state.py`), per unit of world size `N` and rank `k`,
//! for a parameter of `n` elements and dim-0 size `d` (`r = n / d`, `c = ceil(d / N)`):
//! - **sharded parameter**: every rank holds the padded shard, `c·r` elements (a rank
//!   whose rows are fewer or none pads them);
//! - **forward**, at a unit's first op: the all-gather output, one block of the unit's
//!   padded unsharded bytes `N·Σ c·r` on the all-gather stream; the previous unit's
//!   all-gather output freed; each parameter unsharded, `N·c·r` elements, on the default
//!   stream. When the unit's forward ends its parameters are freed
//!   (`reshard_after_forward`, the default) or kept until its backward ends. The root
//!   (the model's parameters outside every unit) is unsharded at the step's first op and
//!   kept through backward;
//! - **backward**: at its first op the unit is unsharded again if it was resharded, and
//!   the unit before it in forward order is prefetched (its all-gather output); its
//!   gradients are made unsharded by autograd, as one GPU makes them; when its backward
//!   ends: its parameters freed, the previous reduce-scatter input freed, a reduce-scatter
//!   input of its padded unsharded bytes made, its unsharded gradients freed, and the
//!   reduce-scatter output (the sharded gradients, `Σ c·r` elements) made on the
//!   reduce-scatter stream, which lives until the loop's `zero_grad(set_to_none=True)`;
//! - **optimizer state**: the *unpadded* local shard (rank `k`: `clamp(d − k·c, 0, c)·r`
//!   elements) per state tensor, and the step's temporaries at the same size; Adam's and
//!   AdamW's foreach step (PyTorch's default) makes one more state-sized set at once.
//!
//! `units.rs` finds the units, `walk.rs` shards a dry run's events.
//!
//! **Mixed precision** (`MixedPrecisionPolicy(param_dtype, reduce_dtype)`, as
//! `_fsdp_param.py` clamps them: a `param_dtype` equal to the parameter's is none, a
//! `reduce_dtype` equal to the `param_dtype` is none): the dry run computes with the
//! parameters in `param_dtype` and the model's floating-point inputs cast to it
//! (`cast_forward_inputs`, at the root's pre-forward); the shards, the gradient shards
//! and the optimizer state stay in the parameters' own dtype. A unit's all-gather first
//! copies its shards into one flat input in `param_dtype` (`_get_param_all_gather_inputs`'
//! foreach copy), freed once copied into the output; the all-gather output and the
//! unsharded parameters are in `param_dtype`, and so are the gradients autograd makes;
//! the reduce-scatter input and output are in `reduce_dtype` (else the gradients'), and
//! an output in another dtype than the parameters' is cast to theirs on the
//! reduce-scatter stream (`_to_dtype_if_needed(reduce_output, orig_dtype)`).
//!
//! What is not modelled: CPU offload, explicit prefetching, NCCL's own buffers (outside
//! the caching allocator).

use tch::Kind;

use crate::error::{Error, Result};

mod ddp;
mod units;
mod walk;

pub(crate) use ddp::replicate;

pub(crate) use units::units;
pub(crate) use walk::shard;

/// How the model is sharded: FSDP2's `fully_shard` on each unit and on the root, over
/// `world` ranks, in the loop the estimate's options say (`zero_grad(set_to_none=True)`
/// after the forward pass and the loss, or before the forward pass with
/// `Options::zero_grad_first`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fsdp {
    /// Ranks (GPUs) the parameters are sharded over (at least 1).
    pub world: u32,
    /// `reshard_after_forward=True` (FSDP2's default): a unit's unsharded parameters are
    /// freed when its forward pass ends and gathered again for its backward pass;
    /// `false` keeps them until its backward pass ends.
    pub reshard_after_forward: bool,
    /// The root too (the model's parameters outside every unit): freed when the model's
    /// forward pass returns (before the loss) and gathered again for backward, as
    /// `fully_shard(model, reshard_after_forward=True)` set explicitly does. `false`
    /// (default, FSDP2's when the option is left unset): kept through backward.
    pub reshard_root: bool,
    /// The modules wrapped as units: a pattern of module paths where `*` stands for one
    /// path component or part of one (`transformer.h.*`, `layer*.*`). `None` (default):
    /// each module of the model's repeated module lists (the outermost, as people wrap
    /// blocks: `transformer.h.0`, `transformer.h.1`, ...).
    pub units: Option<String>,
    /// `MixedPrecisionPolicy(param_dtype=...)`: the dtype the units are gathered and
    /// computed in (`Kind::BFloat16`, `Kind::Half`); `None` (default): the parameters'
    /// own.
    pub param_dtype: Option<Kind>,
    /// `MixedPrecisionPolicy(reduce_dtype=...)`: the dtype gradients are
    /// reduce-scattered in; `None` (default): the gradients' (the `param_dtype`).
    pub reduce_dtype: Option<Kind>,
}

impl Fsdp {
    /// FSDP2's defaults over `world` ranks: each block of the model's repeated module
    /// lists a unit, resharded after forward.
    pub fn over(world: u32) -> Fsdp {
        Fsdp {
            world,
            reshard_after_forward: true,
            reshard_root: false,
            units: None,
            param_dtype: None,
            reduce_dtype: None,
        }
    }

    /// Refuses a world of 0 ranks and a mixed precision that is not of floating-point
    /// dtypes.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.world == 0 {
            return Err(Error::InvalidInput {
                name: "fsdp",
                value: "0".into(),
                reason: "FSDP shards over at least 1 rank".into(),
            });
        }
        for (name, kind) in [
            ("fsdp-param-dtype", self.param_dtype),
            ("fsdp-reduce-dtype", self.reduce_dtype),
        ] {
            if let Some(k) = kind.filter(|k| !MIXED_DTYPES.iter().any(|(_, m)| m == k)) {
                return Err(Error::InvalidInput {
                    name,
                    value: format!("{k:?}"),
                    reason: "mixed precision is of f32, bf16 or f16".into(),
                });
            }
        }
        Ok(())
    }

    /// The dtype a parameter of dtype `orig` is gathered and computed in.
    pub(crate) fn param_kind(&self, orig: Kind) -> Kind {
        self.param_dtype.unwrap_or(orig)
    }

    /// The dtype a parameter of dtype `orig`'s gradients are reduce-scattered in.
    pub(crate) fn reduce_kind(&self, orig: Kind) -> Kind {
        self.reduce_dtype.unwrap_or(self.param_kind(orig))
    }
}

/// The dtypes of FSDP2's mixed precision, by their names on the command line.
pub(crate) const MIXED_DTYPES: [(&str, Kind); 3] = [
    ("f32", Kind::Float),
    ("bf16", Kind::BFloat16),
    ("f16", Kind::Half),
];

/// A dtype of [`MIXED_DTYPES`] by its name (`bf16`), or why not, in one line.
pub(crate) fn parse_mixed_dtype(flag: &'static str, name: &str) -> Result<Kind> {
    MIXED_DTYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, k)| *k)
        .ok_or_else(|| Error::InvalidInput {
            name: flag,
            value: name.to_string(),
            reason: "FSDP2's mixed precision is one of f32, bf16, f16".into(),
        })
}

/// The name of a dtype of [`MIXED_DTYPES`] (`bf16`).
pub(crate) fn mixed_dtype_name(kind: Kind) -> &'static str {
    MIXED_DTYPES
        .iter()
        .find(|(_, k)| *k == kind)
        .map_or("?", |(n, _)| n)
}

/// Data parallelism: PyTorch's `DistributedDataParallel` over `world` ranks with its
/// defaults (`bucket_cap_mb=25`, `find_unused_parameters=False`), as PyTorch 2.11's
/// reducer makes its buckets: at construction one flat bucket of every parameter; from
/// the second iteration (rebuilt in the order the first iteration's gradients became
/// ready) a first bucket of at least 1 MiB, then buckets of at least 25 MiB. Every rank
/// holds the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ddp {
    /// Ranks (GPUs).
    pub world: u32,
    /// `gradient_as_bucket_view=True`: the gradients are views into the buckets (no
    /// gradient of their own); `false` (PyTorch's default): autograd's gradients, copied
    /// into the buckets for the all-reduce.
    pub gradient_as_bucket_view: bool,
}

/// A model variable as FSDP2 sees it.
#[derive(Clone, Debug)]
pub(crate) struct Var {
    /// Its path (`transformer.h.0.attn.c_attn.weight`).
    pub name: String,
    /// Its block in the dry run (the weights' trace).
    pub ptr: u64,
    /// Its sizes.
    pub shape: Vec<i64>,
    /// Its dtype.
    pub kind: Kind,
    /// A parameter that trains (sharded; a gradient, reduce-scattered, and optimizer
    /// state on its shard).
    pub trainable: bool,
    /// A parameter saved without `requires_grad` (a fine-tune's frozen base weights):
    /// sharded and all-gathered like the others, no gradient, no optimizer state. A
    /// variable neither trainable nor frozen is a buffer (replicated on every rank).
    pub frozen: bool,
}

impl Var {
    /// A parameter, frozen or not: FSDP2 shards it (`fully_shard` shards every
    /// parameter of the module, whatever its `requires_grad`).
    pub(crate) fn sharded(&self) -> bool {
        self.trainable || self.frozen
    }

    fn rows_and_row(&self) -> (u64, u64) {
        let numel: u64 = self.shape.iter().map(|&s| s.max(0) as u64).product();
        let d = self.shape.first().map_or(1, |&d| d.max(0) as u64);
        if d == 0 {
            return (0, 0);
        }
        (d, numel / d)
    }

    /// Rows of the padded shard: `ceil(d / N)`.
    fn shard_rows(&self, world: u64) -> u64 {
        self.rows_and_row().0.div_ceil(world)
    }

    /// Bytes of its padded shard, which every rank holds.
    pub fn padded_shard_bytes(&self, world: u64) -> u64 {
        self.padded_shard_numel(world) * elem_bytes(self.kind)
    }

    /// Elements of its padded shard.
    pub(super) fn padded_shard_numel(&self, world: u64) -> u64 {
        self.shard_rows(world) * self.rows_and_row().1
    }

    /// Bytes of rank `rank`'s real rows (the optimizer state's size).
    pub fn local_shard_bytes(&self, world: u64, rank: u64) -> u64 {
        let (d, r) = self.rows_and_row();
        let c = self.shard_rows(world);
        d.saturating_sub(rank * c).min(c) * r * elem_bytes(self.kind)
    }

    /// Bytes unsharded in `kind`: the padded shard times the world.
    pub(super) fn unsharded_bytes_in(&self, world: u64, kind: Kind) -> u64 {
        world * self.padded_shard_numel(world) * elem_bytes(kind)
    }

    /// Bytes of the whole variable in `kind`.
    pub(super) fn bytes_in(&self, kind: Kind) -> u64 {
        let (d, r) = self.rows_and_row();
        d * r * elem_bytes(kind)
    }
}

/// Bytes of one element of `kind`.
pub(super) fn elem_bytes(kind: Kind) -> u64 {
    kind.elt_size_in_bytes() as u64
}

/// What a block of a sharded rank is, for the breakdown at its peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShardedCategory {
    /// The rank's padded parameter shards.
    ShardedParameters,
    /// Parameters, whole (DDP replicates them).
    Parameters,
    /// DDP's gradient buckets (the reducer's flat tensors).
    Buckets,
    /// The model's buffers (replicated).
    Buffers,
    /// Parameters unsharded for a unit's forward or backward pass.
    UnshardedParameters,
    /// All-gather outputs (the unit's padded unsharded bytes).
    AllGather,
    /// Gradients as autograd makes them, unsharded, until the unit's reduce-scatter.
    UnshardedGradients,
    /// Reduce-scatter inputs.
    ReduceScatter,
    /// Reduce-scatter outputs: the rank's gradient shards.
    ShardedGradients,
    /// The optimizer's state on the rank's shard.
    OptimizerState,
    /// Everything else: activations kept for backward, temporaries, workspaces, the batch.
    Other,
}

impl ShardedCategory {
    /// Its name in the output.
    pub fn name(self) -> &'static str {
        match self {
            ShardedCategory::ShardedParameters => "sharded parameters",
            ShardedCategory::Parameters => "parameters",
            ShardedCategory::Buckets => "gradient buckets",
            ShardedCategory::Buffers => "buffers",
            ShardedCategory::UnshardedParameters => "unsharded parameters",
            ShardedCategory::AllGather => "all-gather",
            ShardedCategory::UnshardedGradients => "unsharded gradients",
            ShardedCategory::ReduceScatter => "reduce-scatter",
            ShardedCategory::ShardedGradients => "sharded gradients",
            ShardedCategory::OptimizerState => "optimizer state",
            ShardedCategory::Other => "activations and other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, shape: &[i64]) -> Var {
        Var {
            name: name.into(),
            ptr: 0,
            shape: shape.to_vec(),
            kind: Kind::Float,
            trainable: true,
            frozen: false,
        }
    }

    #[test]
    fn a_padded_shard_is_ceil_of_the_rows_over_the_world() {
        // 50257 rows of 768 over 8 ranks: 6283 rows each (8 x 6283 = 50264, 7 padding
        // rows), rank 7 holding 50257 - 7 x 6283 = 6276 real rows.
        let wte = var("transformer.wte.weight", &[50257, 768]);
        assert_eq!(wte.padded_shard_bytes(8), 6283 * 768 * 4);
        assert_eq!(wte.local_shard_bytes(8, 0), 6283 * 768 * 4);
        assert_eq!(wte.local_shard_bytes(8, 7), 6276 * 768 * 4);
        // 3 rows over 8: rank 0..2 one row each, ranks 3..7 none, every rank pads to 1.
        let small = var("b", &[3]);
        assert_eq!(small.padded_shard_bytes(8), 4);
        assert_eq!(small.local_shard_bytes(8, 2), 4);
        assert_eq!(small.local_shard_bytes(8, 3), 0);
    }
}
