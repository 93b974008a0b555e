//! The live-block registry and the blocks behind tensors (`registry.cpp`).

use std::ffi::c_void;

use tch::Tensor;

use super::{buffer, check, native};
use crate::error::{Error, Result};
use crate::phase::Phase;

extern "C" {
    fn memprof_registry(out: *mut Registry) -> i32;
    fn memprof_live_blocks(slot: i32, out: *mut LiveBlock, cap: u64, n: *mut u64) -> i32;
    fn memprof_tensor_block(tensor: *const c_void, grad: i32, out: *mut Block) -> i32;
    fn memprof_tensor_blocks(
        tensors: *const *const c_void,
        n: usize,
        blocks: *mut Block,
        grads: *mut Block,
        flags: i32,
        frees: *mut u64,
    ) -> i32;
    fn memprof_watched_frees(out: *mut u64) -> i32;
    fn memprof_adopt_blocks(tensors: *const *const c_void, n: usize, bytes: *mut i64) -> i32;
    fn memprof_forget_cpu_blocks() -> i32;
    fn memprof_selftest_block_table(n: u64, errors: *mut u64) -> i32;
}

/// `MpBlock`: the allocation behind a tensor's storage.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Block {
    pub(super) defined: i32,
    pub(super) device: i32,
    pub(super) tracked: i32,
    pub(super) phase: u32,
    pub(super) generation: u32,
    pub(super) watched: u32,
    pub(super) base: u64,
    pub(super) bytes: i64,
}

impl Block {
    /// The block's address (its storage's data pointer).
    pub(crate) fn base(&self) -> u64 {
        self.base
    }
    pub(crate) fn is_defined(&self) -> bool {
        self.defined != 0
    }
    /// Whether the block's birth was seen on device `slot`.
    pub(crate) fn tracked_on(&self, slot: usize) -> bool {
        self.tracked != 0 && self.device == slot as i32
    }
    pub(crate) fn born_in_optimizer(&self) -> bool {
        self.tracked != 0 && self.phase == native::PHASE_OPTIMIZER
    }
    pub(crate) fn size(&self) -> u64 {
        self.bytes.max(0) as u64
    }
    /// Whether its free will count in [`watched_frees`].
    pub(crate) fn is_watched(&self) -> bool {
        self.watched != 0
    }
    /// The same block as read before (whether it is watched aside).
    pub(crate) fn same(&self, other: &Block) -> bool {
        (
            self.defined,
            self.device,
            self.tracked,
            self.phase,
            self.generation,
        ) == (
            other.defined,
            other.device,
            other.tracked,
            other.phase,
            other.generation,
        ) && (self.base, self.bytes) == (other.base, other.bytes)
    }
}

/// `MpLiveBlock`: a live block of the registry (leak hunting). Read where the native
/// layer wrote it (no copy: the out-of-memory path reads it too); its fields are read
/// through its methods.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LiveBlock {
    pub(super) ptr: u64,
    pub(super) size: i64,
    /// Name id of the op that allocated it, -1 none.
    pub(super) op: i32,
    /// Name id of its layer, -1 unknown.
    pub(super) layer: i32,
    /// Iteration (step, from 1) it was born in.
    pub(super) iter: u32,
    pub(super) phase: u8,
    pub(super) device: u8,
    pub(super) pad: u16,
}

impl LiveBlock {
    /// Its address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.size.max(0) as u64
    }

    /// Name id of the op that allocated it (`-1`: none; read with `names::Names`).
    pub(crate) fn op(&self) -> i32 {
        self.op
    }

    /// Name id of its layer (`-1`: unknown).
    pub(crate) fn layer(&self) -> i32 {
        self.layer
    }

    /// The iteration (step, from 1) it was born in.
    pub(crate) fn iteration(&self) -> u32 {
        self.iter
    }

    /// The phase it was born in.
    pub(crate) fn phase(&self) -> Phase {
        super::phase(self.phase)
    }
}

/// `MpRegistry`: the live-block registry's own size.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Registry {
    pub capacity: u64,
    pub high_water: u64,
    pub live: i64,
    pub dropped: i64,
    pub entry_bytes: u64,
    pub on: i32,
    pub pad: i32,
    /// What the ops took from their inputs, learned (leak hunting's layers, the
    /// timeline's variables and FLOPs): bytes of the entries ever written.
    pub learned_ops_bytes: u64,
    /// Ops of this session that took them from the learned ones, not their inputs.
    pub looked_up_ops: u64,
}

pub(crate) fn registry() -> Result<Registry> {
    let mut r = Registry::default();
    // SAFETY: `r` is a valid, writable Registry with the C layout.
    check(unsafe { memprof_registry(&mut r) })?;
    Ok(r)
}

/// The live blocks of device `slot` registered in this session, into `into`.
pub(crate) fn live_blocks(slot: usize, into: &mut Vec<LiveBlock>) -> Result<()> {
    let mut n = 0u64;
    // SAFETY: cap 0 with a null buffer only counts.
    check(unsafe { memprof_live_blocks(slot as i32, std::ptr::null_mut(), 0, &mut n) })?;
    for _ in 0..8 {
        // Room for blocks born while reading.
        let cap = n as usize + n as usize / 4 + 64;
        buffer(into, cap)?;
        // SAFETY: `into` holds `cap` initialised LiveBlocks; the callee writes at most `cap`.
        check(unsafe { memprof_live_blocks(slot as i32, into.as_mut_ptr(), cap as u64, &mut n) })?;
        if n as usize <= cap {
            into.truncate(n as usize);
            return Ok(());
        }
    }
    Err(Error::Native(
        "the live-block registry kept growing while it was read".into(),
    ))
}

/// The block behind `t`'s storage, or behind its `.grad` when `grad` is true.
pub(crate) fn tensor_block(t: &Tensor, grad: bool) -> Result<Block> {
    let mut b = Block::default();
    // SAFETY: tch's tensor handle is a pointer to an at::Tensor that outlives this call
    // (we hold `t`); the callee only reads it.
    check(unsafe { memprof_tensor_block(t.as_ptr() as *const c_void, grad as i32, &mut b) })?;
    Ok(b)
}

/// Frees of watched blocks since the process started: of the variables' own blocks, and
/// of their `.grad` blocks ([`tensor_blocks`] watches them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WatchedFrees {
    pub variables: u64,
    pub grads: u64,
}

/// The blocks behind each of `tensors` and behind their `.grad`, into `blocks` and
/// `grads` (replacing their contents), in one native call; with `blocks` `None`, the
/// `.grad` blocks only. With `watch`, each block whose birth was seen is watched from now
/// on ([`Block::is_watched`]): its free counts in [`watched_frees`]. Returns
/// [`watched_frees`] as it was before the blocks were read.
/// Adopts the blocks behind `tensors` and their gradients that no report showed born
/// (CUDA blocks from before the session): counted live from now on. The bytes adopted.
pub(crate) fn adopt_blocks(tensors: &[&Tensor]) -> Result<u64> {
    let handles: Vec<*const c_void> = tensors
        .iter()
        .map(|t| t.as_ptr() as *const c_void)
        .collect();
    let mut bytes = 0i64;
    // SAFETY: every handle points to an at::Tensor that outlives this call (we hold the
    // `&Tensor`s); `bytes` is a valid, writable i64.
    check(unsafe { memprof_adopt_blocks(handles.as_ptr(), handles.len(), &mut bytes) })?;
    Ok(bytes.max(0) as u64)
}

/// Test mode: the CPU accounting made to see only what happens from now on, as CUDA's
/// reporter does (every CPU block born so far unknown until adopted). For the process.
pub(crate) fn forget_cpu_blocks() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_forget_cpu_blocks() })
}

pub(crate) fn tensor_blocks(
    tensors: &[&Tensor],
    blocks: Option<&mut Vec<Block>>,
    grads: &mut Vec<Block>,
    watch: bool,
) -> Result<WatchedFrees> {
    let handles: Vec<*const c_void> = tensors
        .iter()
        .map(|t| t.as_ptr() as *const c_void)
        .collect();
    let mut flags = if watch { native::BLOCKS_WATCH } else { 0 };
    let blocks_ptr = match blocks {
        Some(b) => {
            b.clear();
            b.resize(handles.len(), Block::default());
            b.as_mut_ptr()
        }
        None => {
            flags |= native::BLOCKS_GRADS_ONLY;
            std::ptr::null_mut()
        }
    };
    grads.clear();
    grads.resize(handles.len(), Block::default());
    let mut frees = [0u64; 2];
    // SAFETY: every handle points to an at::Tensor that outlives this call (we hold the
    // `&Tensor`s); `grads`, and `blocks` unless null (then the callee reads the .grad
    // blocks only), hold `handles.len()` initialised Blocks each, and the callee writes
    // exactly that many; `frees` has the two slots the callee writes.
    check(unsafe {
        memprof_tensor_blocks(
            handles.as_ptr(),
            handles.len(),
            blocks_ptr,
            grads.as_mut_ptr(),
            flags,
            frees.as_mut_ptr(),
        )
    })?;
    Ok(WatchedFrees {
        variables: frees[0],
        grads: frees[1],
    })
}

/// How many watched blocks (see [`tensor_blocks`]) were freed since the process started,
/// by kind: while a count stays the same, every watched block of its kind is still where
/// it was.
pub(crate) fn watched_frees() -> Result<WatchedFrees> {
    let mut n = [0u64; 2];
    // SAFETY: `n` has the two slots the callee writes.
    check(unsafe { memprof_watched_frees(n.as_mut_ptr()) })?;
    Ok(WatchedFrees {
        variables: n[0],
        grads: n[1],
    })
}

/// A tensor's handle as a number: the same tensor object gives the same number for as
/// long as it lives. Only compared, never turned back into a pointer.
pub(crate) fn tensor_handle(t: &Tensor) -> usize {
    t.as_ptr() as usize
}

/// Self-check of the native CUDA block table without a GPU: inserts, finds and removes
/// `n` fake blocks per writer with two concurrent writers; returns the mismatches.
pub(crate) fn selftest_block_table(n: u64) -> Result<u64> {
    let mut errors = 0;
    // SAFETY: `errors` is a valid out-pointer.
    check(unsafe { memprof_selftest_block_table(n, &mut errors) })?;
    Ok(errors)
}
