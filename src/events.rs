//! The one event model: what a profiled step, a dry run and a recorded history are
//! made of, whatever their source. The native logs (the step log of a profiled step,
//! the meta trace of a dry run) are decoded into it in `ffi`, once; a recorded
//! snapshot's history is read into it by `estimate::recorded`; the replay
//! (`replay::device`, the step passes) reads nothing else.

use crate::phase::Phase;

/// What an [`Event`] is, and what its fields mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EventKind {
    /// A block born: `ptr` the block, `value` its bytes, `phase` and `generation` its
    /// birth, `device` its device slot, `op` the timeline op running, `aux` its call
    /// stack's site id + 1 (0: none kept). `stream`: the CUDA stream it was asked on, as
    /// an index among the run's streams (0: the only one, or the first a recorded
    /// history asked on); the caching allocator reuses a freed block only for requests
    /// on its own stream. A profiled step and a dry run are one stream.
    Alloc {
        /// The stream's index.
        stream: u32,
    },
    /// A block freed: `ptr`, `value` minus its bytes, `phase` and `generation` its birth,
    /// `device`, `op`.
    Free,
    /// A timeline op begins: `op` its index in the step, `aux` its name id, `generation`
    /// its scope's name id + 1 (0: none), `value` the index of the first variable among
    /// its inputs (-1: none), `ptr` in TorchScript its module path's name id + 2 (1: the
    /// root module), 0 outside TorchScript.
    OpBegin,
    /// A timeline op returns: `op`, `aux` its name id, `value` the device's live bytes.
    OpEnd,
    /// A backward node's forward op: `op` the node, `aux` the forward op, `ptr` the
    /// autograd sequence number.
    Link,
    /// FLOPs counted at an op: `op`, `aux` the name id of the op counted, `value` FLOPs.
    Flops,
    /// An op with no FLOP formula: `op`, `aux` its name id.
    Uncounted,
    /// A phase begins: `phase`, `generation` the new generation (a dry run: its step).
    Phase,
    /// `op` (or an op nested in it) took the block `ptr` as an input.
    Read,
    /// A dry run: the weights and the first batch are on the device.
    Baseline,
    /// A dry run: an op that CUDA runs on cuBLAS (`lt` false) or on cuBLASLt (`lt` true)
    /// returned, inside timeline op `op`; `aux` its name id.
    Workspace {
        /// cuBLASLt (which takes a workspace of its own after the cuBLAS one).
        lt: bool,
    },
    /// A dry run: a CUDA kernel inside timeline op `op` takes `value` bytes after its
    /// outputs and frees them before it returns (cuDNN's convolution workspace); `size`
    /// what the size is.
    Transient {
        /// Where the size comes from.
        size: TransientSize,
    },
    /// A recorded history: the run released the allocator's cached segments here
    /// (`torch.cuda.empty_cache()`, or the allocator's own last retry before an
    /// out-of-memory error): the replay releases its own (no field is read).
    Release,
}

/// One event of a profiled step or of a dry run (see [`EventKind`] for the fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Event {
    pub kind: EventKind,
    pub phase: Phase,
    pub device: u8,
    pub generation: u32,
    pub op: i32,
    pub aux: i32,
    pub ptr: u64,
    pub value: i64,
}

impl Event {
    /// An event of `kind` with every field empty (no op, no block, forward).
    #[cfg(test)]
    pub(crate) fn new(kind: EventKind) -> Event {
        Event {
            kind,
            phase: Phase::Forward,
            device: 0,
            generation: 0,
            op: -1,
            aux: 0,
            ptr: 0,
            value: 0,
        }
    }

    /// Whether it is a birth or a death of a block.
    pub(crate) fn is_block(&self) -> bool {
        matches!(self.kind, EventKind::Alloc { .. } | EventKind::Free)
    }

    /// Whether it is a birth of a block (on any stream).
    pub(crate) fn is_alloc(&self) -> bool {
        matches!(self.kind, EventKind::Alloc { .. })
    }
}

/// What a kernel's workspace ([`EventKind::Transient`]) is sized by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TransientSize {
    /// The kernel's own size (measured on the GPU as one request, or known).
    Exact,
    /// The larger plausible size: a convolution not measured on the GPU.
    Bound,
    /// The most a measured call held at once, over requests not known one by one (a
    /// convolution backward's).
    Measured,
    /// Beside a `Measured` one, the same call's larger plausible size, for the pool's
    /// other layout.
    Rule,
    /// One of the requests of a measured call that are known one by one.
    Split,
}
