//! The live-block registry and the blocks behind tensors (`registry.cpp`).

use std::ffi::c_void;

use tch::Tensor;

use super::{buffer, check, native};
use crate::error::{Error, Result};
use crate::phase::Phase;

extern "C" {
    fn memprof_registry(out: *mut MpRegistry) -> i32;
    fn memprof_live_blocks(slot: i32, out: *mut MpLiveBlock, cap: u64, n: *mut u64) -> i32;
    fn memprof_tensor_block(tensor: *const c_void, grad: i32, out: *mut MpBlock) -> i32;
    fn memprof_tensor_blocks(
        tensors: *const *const c_void,
        n: usize,
        blocks: *mut MpBlock,
        grads: *mut MpBlock,
        flags: i32,
        frees: *mut u64,
    ) -> i32;
    fn memprof_watched_frees(out: *mut u64) -> i32;
    fn memprof_adopt_blocks(tensors: *const *const c_void, n: usize, bytes: *mut i64) -> i32;
    fn memprof_forget_cpu_blocks() -> i32;
    fn memprof_selftest_block_table(n: u64, errors: *mut u64) -> i32;
    fn memprof_cuda_report_cost(n: u64, other_thread: i32, ns: *mut u64) -> i32;
}

/// `MpBlock`: the native layout of a [`TensorBlock`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MpBlock {
    pub(super) defined: i32,
    pub(super) device: i32,
    pub(super) tracked: i32,
    pub(super) phase: u32,
    pub(super) generation: u32,
    pub(super) watched: u32,
    pub(super) birth_log: u32,
    pub(super) reserved: u32,
    pub(super) base: u64,
    pub(super) bytes: i64,
}

/// The allocation behind a tensor's storage (or its `.grad`'s).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TensorBlock {
    /// The block's address (its storage's data pointer).
    pub base: u64,
    /// Its bytes.
    pub bytes: u64,
    /// Whether there is a storage (a `.grad` may be undefined).
    pub defined: bool,
    /// Whether the session saw its birth.
    pub tracked: bool,
    /// The device slot it lives on (`None`: a device the session has no slot for).
    pub device: Option<usize>,
    /// The phase it was born in, and that phase's generation (where its birth was seen).
    pub phase: u32,
    pub generation: u32,
    /// Whether its free will count in [`watched_frees`].
    pub watched: bool,
    /// 1 + the place of its birth in the backward log where it was born in a backward
    /// pass and logged, else 0: see [`TensorBlock::birth_in`].
    pub birth_log: u32,
}

impl From<&MpBlock> for TensorBlock {
    fn from(b: &MpBlock) -> Self {
        TensorBlock {
            base: b.base,
            bytes: b.bytes.max(0) as u64,
            defined: b.defined != 0,
            tracked: b.tracked != 0,
            device: usize::try_from(b.device).ok(),
            phase: b.phase,
            generation: b.generation,
            watched: b.watched != 0,
            birth_log: b.birth_log,
        }
    }
}

impl TensorBlock {
    /// Whether the block's birth was seen on device `slot`.
    pub(crate) fn tracked_on(&self, slot: usize) -> bool {
        self.tracked && self.device == Some(slot)
    }
    /// The place of its birth in `log`, this iteration's backward log of device `slot`
    /// (the events of other devices in it are not its), if it was born there. The place
    /// it was logged at may be of an earlier iteration's log: its birth is this log's
    /// event there only if that event is a birth at its address, as no other block is
    /// born at an address while this one lives.
    pub(crate) fn birth_in(&self, log: &[super::BackwardEvent], slot: usize) -> Option<usize> {
        let at = (self.birth_log as usize).checked_sub(1)?;
        let e = log.get(at)?;
        (self.defined
            && self.tracked_on(slot)
            && e.ptr() == self.base
            && e.delta() > 0
            && e.device() as usize == slot)
            .then_some(at)
    }

    pub(crate) fn born_in_optimizer(&self) -> bool {
        self.tracked && self.phase == native::PHASE_OPTIMIZER
    }
    /// The same block as read before (whether it is watched aside).
    pub(crate) fn same(&self, other: &TensorBlock) -> bool {
        TensorBlock {
            watched: false,
            ..*self
        } == TensorBlock {
            watched: false,
            ..*other
        }
    }
}

/// `MpLiveBlock`: the native layout of a [`RegisteredBlock`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MpLiveBlock {
    pub(super) ptr: u64,
    pub(super) size: i64,
    pub(super) op: i32,
    pub(super) layer: i32,
    pub(super) iter: u32,
    pub(super) phase: u8,
    pub(super) device: u8,
    pub(super) pad: u16,
}

/// A live block of the registry (leak hunting, out-of-memory reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegisteredBlock {
    /// Its address.
    pub ptr: u64,
    /// Its bytes.
    pub bytes: u64,
    /// Name id of the op that allocated it (`-1`: none; read with `names::Names`).
    pub op: i32,
    /// Name id of its layer (`-1`: unknown).
    pub layer: i32,
    /// The iteration (step, from 1) it was born in.
    pub iteration: u32,
    /// The phase it was born in.
    pub phase: Phase,
}

impl From<&MpLiveBlock> for RegisteredBlock {
    fn from(b: &MpLiveBlock) -> Self {
        RegisteredBlock {
            ptr: b.ptr,
            bytes: b.size.max(0) as u64,
            op: b.op,
            layer: b.layer,
            iteration: b.iter,
            phase: super::phase(b.phase),
        }
    }
}

/// `MpRegistry`: the native layout of [`RegistryUse`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MpRegistry {
    pub(super) capacity: u64,
    pub(super) high_water: u64,
    pub(super) live: i64,
    pub(super) dropped: i64,
    pub(super) entry_bytes: u64,
    pub(super) on: i32,
    pub(super) pad: i32,
    pub(super) learned_ops_bytes: u64,
    pub(super) looked_up_ops: u64,
}

/// The live-block registry's own size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RegistryUse {
    /// Entries in use now.
    pub live: i64,
    /// Entries ever used.
    pub high_water: u64,
    /// Births it had no room for (not registered).
    pub dropped: i64,
    /// Bytes it has touched: its entries ever used, and what the ops took from their
    /// inputs, learned (leak hunting's layers, the timeline's variables and FLOPs).
    pub bytes: u64,
    /// Ops of this session that took those from the learned ones, not their inputs.
    pub looked_up_ops: u64,
}

pub(crate) fn registry() -> Result<RegistryUse> {
    let mut r = MpRegistry::default();
    // SAFETY: `r` is a valid, writable MpRegistry with the C layout.
    check(unsafe { memprof_registry(&mut r) })?;
    Ok(RegistryUse {
        live: r.live,
        high_water: r.high_water,
        dropped: r.dropped,
        bytes: r.high_water * r.entry_bytes + r.learned_ops_bytes,
        looked_up_ops: r.looked_up_ops,
    })
}
/// The live blocks of device `slot` registered in this session, into `into`.
pub(crate) fn live_blocks(slot: usize, into: &mut Vec<RegisteredBlock>) -> Result<()> {
    let mut raw: Vec<MpLiveBlock> = Vec::new();
    let mut n = 0u64;
    // SAFETY: cap 0 with a null buffer only counts.
    check(unsafe { memprof_live_blocks(slot as i32, std::ptr::null_mut(), 0, &mut n) })?;
    for _ in 0..8 {
        // Room for blocks born while reading.
        let cap = n as usize + n as usize / 4 + 64;
        buffer(&mut raw, cap)?;
        // SAFETY: `raw` holds `cap` initialised MpLiveBlocks; the callee writes at most `cap`.
        check(unsafe { memprof_live_blocks(slot as i32, raw.as_mut_ptr(), cap as u64, &mut n) })?;
        if n as usize <= cap {
            raw.truncate(n as usize);
            into.clear();
            into.try_reserve_exact(raw.len())
                .map_err(|e| Error::Native(format!("cannot allocate {} blocks: {e}", raw.len())))?;
            into.extend(raw.iter().map(RegisteredBlock::from));
            return Ok(());
        }
    }
    Err(Error::Native(
        "the live-block registry kept growing while it was read".into(),
    ))
}

/// The block behind `t`'s storage, or behind its `.grad` when `grad` is true.
pub(crate) fn tensor_block(t: &Tensor, grad: bool) -> Result<TensorBlock> {
    let mut b = MpBlock::default();
    // SAFETY: tch's tensor handle is a pointer to an at::Tensor that outlives this call
    // (we hold `t`); the callee only reads it.
    check(unsafe { memprof_tensor_block(t.as_ptr() as *const c_void, grad as i32, &mut b) })?;
    Ok(TensorBlock::from(&b))
}

/// Frees of watched blocks since the process started: of the variables' own blocks, and
/// of their `.grad` blocks ([`tensor_blocks`] watches them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WatchedFrees {
    pub variables: u64,
    pub grads: u64,
}

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

/// The blocks behind each of `tensors` and behind their `.grad`, into `blocks` and
/// `grads` (replacing their contents), in one native call; with `blocks` `None`, the
/// `.grad` blocks only. With `watch`, each block whose birth was seen is watched from now
/// on ([`TensorBlock::watched`]): its free counts in [`watched_frees`]. Returns
/// [`watched_frees`] as it was before the blocks were read.
pub(crate) fn tensor_blocks(
    tensors: &[&Tensor],
    blocks: Option<&mut Vec<TensorBlock>>,
    grads: &mut Vec<TensorBlock>,
    watch: bool,
) -> Result<WatchedFrees> {
    BlockReader::default().read(tensors.iter().copied(), blocks, grads, watch)
}

/// [`tensor_blocks`] with its buffers kept from one read to the next: the read that
/// `record_stats` makes every step allocates nothing once they have their room.
#[derive(Debug, Default)]
pub(crate) struct BlockReader {
    /// The tensors' handles (`at::Tensor*`, as [`tensor_handle`] gives them).
    handles: Vec<usize>,
    raw_blocks: Vec<MpBlock>,
    raw_grads: Vec<MpBlock>,
}

impl BlockReader {
    /// [`tensor_blocks`] of the tensors `tensors` yields.
    pub(crate) fn read<'a>(
        &mut self,
        tensors: impl Iterator<Item = &'a Tensor>,
        blocks: Option<&mut Vec<TensorBlock>>,
        grads: &mut Vec<TensorBlock>,
        watch: bool,
    ) -> Result<WatchedFrees> {
        self.handles.clear();
        self.handles.extend(tensors.map(tensor_handle));
        let n = self.handles.len();
        let mut flags = if watch { native::BLOCKS_WATCH } else { 0 };
        if blocks.is_none() {
            flags |= native::BLOCKS_GRADS_ONLY;
        }
        // The callee writes every one of the n entries: a buffer already n long (the
        // same variables as the last call) is handed over as it is.
        if blocks.is_some() && self.raw_blocks.len() != n {
            buffer(&mut self.raw_blocks, n)?;
        }
        if self.raw_grads.len() != n {
            buffer(&mut self.raw_grads, n)?;
        }
        let blocks_ptr = if blocks.is_some() {
            self.raw_blocks.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        };
        let mut frees = [0u64; 2];
        // SAFETY: every handle is `Tensor::as_ptr` of a tensor the caller lends for this
        // call (an at::Tensor that outlives it), read as the `const void*` it is;
        // `raw_grads`, and `raw_blocks` unless null (then the callee reads the .grad
        // blocks only), hold `n` initialised MpBlocks each, and the callee writes exactly
        // that many; `frees` has the two slots the callee writes.
        check(unsafe {
            memprof_tensor_blocks(
                self.handles.as_ptr() as *const *const c_void,
                n,
                blocks_ptr,
                self.raw_grads.as_mut_ptr(),
                flags,
                frees.as_mut_ptr(),
            )
        })?;
        if let Some(b) = blocks {
            b.clear();
            b.extend(self.raw_blocks.iter().map(TensorBlock::from));
        }
        grads.clear();
        grads.extend(self.raw_grads.iter().map(TensorBlock::from));
        Ok(WatchedFrees {
            variables: frees[0],
            grads: frees[1],
        })
    }
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

/// The CUDA accounting path without a GPU: `n` fake cuda:0 blocks reported born, then
/// dead, to a reporter as the caching allocator reports them, on this thread or on a
/// thread of its own; the time of the `2 n` reports.
pub(crate) fn cuda_report_cost(n: u64, other_thread: bool) -> Result<std::time::Duration> {
    let mut ns = 0;
    // SAFETY: `ns` is a valid out-pointer.
    check(unsafe { memprof_cuda_report_cost(n, other_thread as i32, &mut ns) })?;
    Ok(std::time::Duration::from_nanos(ns))
}

/// Self-check of the native CUDA block table without a GPU: inserts, finds and removes
/// `n` fake blocks per writer with two concurrent writers; returns the mismatches.
pub(crate) fn selftest_block_table(n: u64) -> Result<u64> {
    let mut errors = 0;
    // SAFETY: `errors` is a valid out-pointer.
    check(unsafe { memprof_selftest_block_table(n, &mut errors) })?;
    Ok(errors)
}
