//! The one seam to the native layer (`src/native/`): every `extern "C"` declaration
//! and every `unsafe` block of the crate lives here. The contract is
//! `src/native/memprof.h`; the structs below mirror it field for field, and build.rs
//! turns the header's layout table into compile-time checks of their sizes, field
//! offsets and the shared constants (`layout.rs`, included below), so a drift on
//! either side fails the build.
//!
//! Every native function returns a status; a failure becomes [`Error::Native`] with
//! the native layer's message. Nothing here panics.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};

use tch::Tensor;

use crate::error::{Error, Result};

/// Constants of the contract (`MP_*` in memprof.h).
pub(crate) mod native {
    pub const MAX_DEVICES: usize = 17;
    pub const PHASE_FORWARD: u32 = 0;
    pub const PHASE_BACKWARD: u32 = 1;
    pub const PHASE_OPTIMIZER: u32 = 2;
    pub const PHASE_IDLE: u32 = 3;
    pub const EV_ALLOC: u8 = 1;
    pub const EV_FREE: u8 = 2;
    pub const EV_OP_BEGIN: u8 = 3;
    pub const EV_OP_END: u8 = 4;
    pub const EV_LINK: u8 = 5;
    pub const EV_FLOPS: u8 = 6;
    pub const EV_UNCOUNTED: u8 = 7;
    pub const EV_PHASE: u8 = 8;
    pub const DEVICE_CPU: i32 = 0;
    pub const DEVICE_CUDA: i32 = 1;
    pub const CUDA_RESET_PEAKS: i32 = 0;
    pub const CUDA_EMPTY_CACHE: i32 = 1;
    pub const META_CAPACITY: u64 = 33_554_432;
    pub const META_ALLOC: i32 = 1;
    pub const META_FREE: i32 = 2;
    pub const META_OP: i32 = 3;
    pub const META_BLAS: i32 = 4;
    pub const META_MARK: i32 = 5;
}
pub(crate) use native::MAX_DEVICES;

/// Kinds of step-log events (`TlEvent::kind`).
pub(crate) mod ev {
    pub use super::native::{
        EV_ALLOC as ALLOC, EV_FLOPS as FLOPS, EV_FREE as FREE, EV_LINK as LINK,
        EV_OP_BEGIN as OP_BEGIN, EV_OP_END as OP_END, EV_PHASE as PHASE, EV_UNCOUNTED as UNCOUNTED,
    };
}

/// `MpDeviceStats`: the counters of one device slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeviceStats {
    pub live: i64,
    pub peak_iter: i64,
    pub peak_run: i64,
    pub allocs: i64,
    pub frees: i64,
    pub optimizer_born_live: i64,
    pub feature_maps: i64,
    pub reported_allocated: i64,
    pub reported_reserved: i64,
    pub reported_peak_allocated_iter: i64,
    pub reported_peak_reserved_iter: i64,
    pub reported_peak_allocated_run: i64,
    pub reported_peak_reserved_run: i64,
}

/// `MpState`: the session's global state.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct State {
    pub generation: u32,
    pub phase: u32,
    pub active_backward: i64,
    pub backward_passes: i64,
    pub log_len: u64,
    pub log_capacity: u64,
    pub untagged_frees: i64,
    pub cpu_installed: i32,
    pub cuda_loaded: i32,
    pub cuda_ooms_seen: i64,
    pub hook_reentries: i64,
    pub cuda_untracked: i64,
}

/// `MpLogEvent`: one birth (+size) or death (-size) of a block during backward.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LogEvent {
    pub ptr: u64,
    pub delta: i64,
    pub generation: u32,
    pub device: u32,
}

/// `MpBlock`: the allocation behind a tensor's storage.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Block {
    pub defined: i32,
    pub device: i32,
    pub tracked: i32,
    pub phase: u32,
    pub generation: u32,
    pub pad: u32,
    pub base: u64,
    pub bytes: i64,
}

impl Block {
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
}

/// CUDA caching-allocator statistics of one device (aggregate pool).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaStats {
    /// Bytes in blocks handed to tensors now.
    pub allocated_current: i64,
    /// Peak of `allocated_current` since the allocator's last peak reset.
    pub allocated_peak: i64,
    /// Bytes the allocator holds from the driver (allocated plus cached).
    pub reserved_current: i64,
    /// Peak of `reserved_current`.
    pub reserved_peak: i64,
    /// Bytes in active blocks (allocated, or freed but still used by a stream).
    pub active_current: i64,
    /// Peak of `active_current`.
    pub active_peak: i64,
    /// Bytes tensors asked for (before rounding to blocks).
    pub requested_current: i64,
    /// Peak of `requested_current`.
    pub requested_peak: i64,
    /// Allocations that failed once and succeeded after freeing cached blocks.
    pub alloc_retries: i64,
    /// Out-of-memory errors raised by the allocator.
    pub ooms: i64,
    /// Free device memory as the driver reports it.
    pub free_bytes: i64,
    /// Total device memory.
    pub total_bytes: i64,
}

/// `MpTlEvent`: one event of the step log; field meanings depend on `kind` (see
/// memprof.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TlEvent {
    pub kind: u8,
    pub phase: u8,
    pub device: u8,
    pub pad: u8,
    pub generation: u32,
    pub op: i32,
    pub aux: i32,
    pub ptr: u64,
    pub value: i64,
}

/// `MpTimelineHeader`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TimelineHeader {
    pub len: u64,
    pub capacity: u64,
    pub start_generation: u32,
    pub ops: i32,
    pub start_live: i64,
    pub on: i32,
    pub device: i32,
}

/// `MpLiveBlock`: a live block of the registry (leak hunting).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LiveBlock {
    pub ptr: u64,
    pub size: i64,
    /// Name id of the op that allocated it, -1 none.
    pub op: i32,
    /// Name id of its layer, -1 unknown.
    pub layer: i32,
    /// Iteration (step, from 1) it was born in.
    pub iter: u32,
    pub phase: u8,
    pub device: u8,
    pub pad: u16,
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
}

/// `MpMetaEvent`: one event of the estimator's meta trace.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MetaEvent {
    /// Block id (alloc, free), 0 otherwise.
    pub id: u64,
    /// Block size (alloc, free), the mark's value (mark).
    pub bytes: i64,
    /// `native::META_*`.
    pub kind: i32,
    /// Interned op name (op, blas), -1 otherwise.
    pub name: i32,
}

/// `MpHistEvent`: one birth (+size) or death (-size) of the memory history.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HistEvent {
    pub ptr: u64,
    pub size: i64,
    pub op: i32,
    pub layer: i32,
    /// Microseconds (monotonic clock) << 8 | device slot.
    pub time_dev: u64,
}

/// `MpAutocast`: autocast state of one device type, to restore on exit.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Autocast {
    pub enabled: i32,
    pub dtype: i32,
}

// The compile-time layout checks generated from memprof.h.
include!(concat!(env!("OUT_DIR"), "/layout.rs"));

type OomCallback = extern "C" fn(*mut c_void, i32, i64, i64, i64);

extern "C" {
    fn memprof_last_error(buf: *mut c_char, len: usize, needed: *mut usize) -> i32;
    fn memprof_start(want_cuda: i32, timeline_slot: i32, leaks: i32) -> i32;
    fn memprof_stop() -> i32;
    fn memprof_begin_iteration() -> i32;
    fn memprof_state(out: *mut State) -> i32;
    fn memprof_device_stats(slot: i32, out: *mut DeviceStats) -> i32;
    fn memprof_registry(out: *mut Registry) -> i32;
    fn memprof_timeline_header(out: *mut TimelineHeader) -> i32;
    fn memprof_read_log(out: *mut LogEvent, cap: u64, total: *mut u64) -> i32;
    fn memprof_read_timeline(out: *mut TlEvent, cap: u64, total: *mut u64) -> i32;
    fn memprof_read_history(out: *mut HistEvent, cap: u64, total: *mut u64, ring: *mut u64) -> i32;
    fn memprof_live_blocks(slot: i32, out: *mut LiveBlock, cap: u64, n: *mut u64) -> i32;
    fn memprof_tensor_block(tensor: *const c_void, grad: i32, out: *mut Block) -> i32;
    fn memprof_tensor_blocks(
        tensors: *const *const c_void,
        n: usize,
        blocks: *mut Block,
        grads: *mut Block,
    ) -> i32;
    fn memprof_name(id: i32, buf: *mut c_char, len: usize, name_len: *mut i64) -> i32;
    fn memprof_intern(name: *const c_char, id: *mut i32) -> i32;
    fn memprof_set_params(ptrs: *const u64, ids: *const i32, layers: *const i32, n: usize) -> i32;
    fn memprof_scope_push(id: i32) -> i32;
    fn memprof_scope_pop() -> i32;
    fn memprof_history(on: i32, max_entries: u64) -> i32;
    fn memprof_set_oom_callback(cb: Option<OomCallback>, ctx: *mut c_void) -> i32;
    fn memprof_write_stdout(buf: *const c_char, len: usize) -> i32;
    fn memprof_process_memory(resident: *mut i64, peak_resident: *mut i64) -> i32;
    fn memprof_cuda_stats(index: i32, out: *mut CudaStats) -> i32;
    fn memprof_cuda_history(on: i32, max_entries: i64) -> i32;
    fn memprof_cuda_snapshot(path: *const c_char) -> i32;
    fn memprof_cuda_control(index: i32, what: i32) -> i32;
    fn memprof_autocast_enter(
        device_type: i32,
        enabled: i32,
        dtype: i32,
        prev: *mut Autocast,
    ) -> i32;
    fn memprof_autocast_exit(device_type: i32, prev: *const Autocast) -> i32;
    fn memprof_rng_get(device_type: i32, index: i32, out: *mut *mut c_void) -> i32;
    fn memprof_rng_set(device_type: i32, index: i32, state: *const c_void) -> i32;
    fn memprof_meta_begin() -> i32;
    fn memprof_meta_end() -> i32;
    fn memprof_meta_mark(value: i32) -> i32;
    fn memprof_meta_read(out: *mut MetaEvent, cap: u64, total: *mut u64) -> i32;
    fn memprof_meta_empty(
        sizes: *const i64,
        n: usize,
        like: *const c_void,
        out: *mut *mut c_void,
    ) -> i32;
    fn memprof_meta_convert(tensor: *mut c_void) -> i32;
    fn memprof_script_load(path: *const c_char, out: *mut *mut c_void) -> i32;
    fn memprof_script_free(module: *mut c_void) -> i32;
    fn memprof_script_train(module: *mut c_void, on: i32) -> i32;
    fn memprof_script_forward(
        module: *mut c_void,
        inputs: *const *const c_void,
        n: usize,
        out: *mut *mut c_void,
    ) -> i32;
    fn memprof_script_tensor(
        module: *mut c_void,
        which: i32,
        index: u64,
        n: *mut u64,
        tensor: *mut *mut c_void,
        name_buf: *mut c_char,
        len: usize,
        name_len: *mut u64,
    ) -> i32;
    fn memprof_selftest_block_table(n: u64, errors: *mut u64) -> i32;
    fn memprof_selftest_reenter() -> i32;
}

fn last_error() -> Error {
    let mut buf = [0u8; 1024];
    let mut needed = 0usize;
    // SAFETY: the buffer is valid for its length; the callee writes at most len-1 bytes
    // plus a NUL, and `needed` is a valid out-pointer.
    unsafe { memprof_last_error(buf.as_mut_ptr().cast(), buf.len(), &mut needed) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Error::Native(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn check(status: i32) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// A vector of `n` default values, or an error if the memory cannot be had (the OOM
/// path calls the readers below when the process may be out of memory).
fn buffer<T: Default + Clone>(into: &mut Vec<T>, n: usize) -> Result<()> {
    into.clear();
    into.try_reserve_exact(n)
        .map_err(|e| Error::Native(format!("cannot allocate a buffer of {n} events: {e}")))?;
    into.resize(n, T::default());
    Ok(())
}

/// Starts the profiling session on the calling thread (the training thread);
/// `timeline_slot` turns the step log on for that device slot, `leaks` the live-block
/// registry.
pub(crate) fn start(want_cuda: bool, timeline_slot: Option<usize>, leaks: bool) -> Result<()> {
    let slot = timeline_slot.map_or(-1, |s| s as i32);
    // SAFETY: plain call.
    check(unsafe { memprof_start(want_cuda as i32, slot, leaks as i32) })
}

/// Ends the profiling session. Call on the thread that started it.
pub(crate) fn stop() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_stop() })
}

/// Ends the current iteration and begins the next (forward phase).
pub(crate) fn begin_iteration() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_begin_iteration() })
}

pub(crate) fn state() -> Result<State> {
    let mut s = State::default();
    // SAFETY: `s` is a valid, writable State with the C layout.
    check(unsafe { memprof_state(&mut s) })?;
    Ok(s)
}

pub(crate) fn device_stats(slot: usize) -> Result<DeviceStats> {
    let mut s = DeviceStats::default();
    // SAFETY: `s` is a valid, writable DeviceStats with the C layout.
    check(unsafe { memprof_device_stats(slot as i32, &mut s) })?;
    Ok(s)
}

pub(crate) fn registry() -> Result<Registry> {
    let mut r = Registry::default();
    // SAFETY: `r` is a valid, writable Registry with the C layout.
    check(unsafe { memprof_registry(&mut r) })?;
    Ok(r)
}

pub(crate) fn timeline_header() -> Result<TimelineHeader> {
    let mut h = TimelineHeader::default();
    // SAFETY: `h` is a valid, writable TimelineHeader with the C layout.
    check(unsafe { memprof_timeline_header(&mut h) })?;
    Ok(h)
}

/// The backward events logged in this iteration; returns whether the log overflowed.
pub(crate) fn read_log(into: &mut Vec<LogEvent>) -> Result<bool> {
    let st = state()?;
    let n = st.log_len.min(st.log_capacity) as usize;
    buffer(into, n)?;
    let mut total = 0u64;
    // SAFETY: `into` holds `n` initialised LogEvents; the callee copies at most `n`.
    check(unsafe { memprof_read_log(into.as_mut_ptr(), n as u64, &mut total) })?;
    into.truncate((total.min(st.log_capacity) as usize).min(n));
    Ok(total > st.log_capacity)
}

/// This iteration's step log; returns whether it overflowed (events were dropped).
pub(crate) fn read_timeline(into: &mut Vec<TlEvent>) -> Result<bool> {
    let h = timeline_header()?;
    let n = h.len.min(h.capacity) as usize;
    buffer(into, n)?;
    let mut total = 0u64;
    // SAFETY: `into` holds `n` initialised TlEvents; the callee copies at most `n`.
    check(unsafe { memprof_read_timeline(into.as_mut_ptr(), n as u64, &mut total) })?;
    into.truncate((total.min(h.capacity) as usize).min(n));
    Ok(total > h.capacity)
}

/// The memory history's length: (events appended since it started, ring size). The
/// events a read returns are `min(appended, ring)`.
pub(crate) fn history_len() -> Result<(u64, u64)> {
    let (mut total, mut ring) = (0u64, 0u64);
    // SAFETY: cap 0 with a null buffer only reads the counts into valid out-pointers.
    check(unsafe { memprof_read_history(std::ptr::null_mut(), 0, &mut total, &mut ring) })?;
    Ok((total, ring))
}

/// The history's newest events (at most `max`), oldest first; returns whether older
/// ones were overwritten or left out.
pub(crate) fn read_history(into: &mut Vec<HistEvent>, max: usize) -> Result<bool> {
    let (total, ring) = history_len()?;
    let n = (total.min(ring) as usize).min(max);
    buffer(into, n)?;
    let (mut total, mut ring) = (0u64, 0u64);
    // SAFETY: `into` holds `n` initialised events; the callee copies at most `n`.
    check(unsafe { memprof_read_history(into.as_mut_ptr(), n as u64, &mut total, &mut ring) })?;
    into.truncate((total.min(ring) as usize).min(n));
    Ok(total > into.len() as u64)
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

/// The blocks behind each of `tensors` and behind their `.grad`, into `blocks` and
/// `grads` (replacing their contents), in one native call.
pub(crate) fn tensor_blocks(
    tensors: &[&Tensor],
    blocks: &mut Vec<Block>,
    grads: &mut Vec<Block>,
) -> Result<()> {
    let handles: Vec<*const c_void> = tensors
        .iter()
        .map(|t| t.as_ptr() as *const c_void)
        .collect();
    blocks.clear();
    blocks.resize(handles.len(), Block::default());
    grads.clear();
    grads.resize(handles.len(), Block::default());
    // SAFETY: every handle points to an at::Tensor that outlives this call (we hold the
    // `&Tensor`s); `blocks` and `grads` hold `handles.len()` initialised Blocks each, and
    // the callee writes exactly that many.
    check(unsafe {
        memprof_tensor_blocks(
            handles.as_ptr(),
            handles.len(),
            blocks.as_mut_ptr(),
            grads.as_mut_ptr(),
        )
    })
}

/// A tensor's handle as a number: the same tensor object gives the same number for as
/// long as it lives. Only compared, never turned back into a pointer.
pub(crate) fn tensor_handle(t: &Tensor) -> usize {
    t.as_ptr() as usize
}

/// The interned name `id` (op, layer or scope), if known.
pub(crate) fn name(id: i32) -> Result<Option<String>> {
    let mut buf = [0u8; 128];
    let mut len = 0i64;
    // SAFETY: the buffer is valid for its length; the callee writes at most len-1 bytes
    // plus a NUL.
    check(unsafe { memprof_name(id, buf.as_mut_ptr().cast(), buf.len(), &mut len) })?;
    if len < 0 {
        return Ok(None);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(Some(String::from_utf8_lossy(&buf[..end]).into_owned()))
}

/// Interns `name` and returns its id.
pub(crate) fn intern(name: &str) -> Result<i32> {
    let c = std::ffi::CString::new(name.replace('\0', " "))
        .map_err(|e| Error::Native(e.to_string()))?;
    let mut id = -1;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    check(unsafe { memprof_intern(c.as_ptr(), &mut id) })?;
    Ok(id)
}

/// Replaces the native table of model variables (storage pointer -> variable index
/// and the name id of its layer).
pub(crate) fn set_params(ptrs: &[u64], ids: &[i32], layers: &[i32]) -> Result<()> {
    if ptrs.len() != ids.len() || ptrs.len() != layers.len() {
        return Err(Error::Native(format!(
            "set_params: {} pointers, {} ids, {} layers",
            ptrs.len(),
            ids.len(),
            layers.len()
        )));
    }
    // SAFETY: the three slices are valid for `len` elements for the duration of the call.
    check(unsafe { memprof_set_params(ptrs.as_ptr(), ids.as_ptr(), layers.as_ptr(), ptrs.len()) })
}

pub(crate) fn scope_push(id: i32) -> Result<()> {
    // SAFETY: plain call on the calling thread's scope stack.
    check(unsafe { memprof_scope_push(id) })
}

pub(crate) fn scope_pop() -> Result<()> {
    // SAFETY: plain call on the calling thread's scope stack.
    check(unsafe { memprof_scope_pop() })
}

/// Starts (clearing) or stops the memory history of every device.
pub(crate) fn history(on: bool, max_entries: u64) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_history(on as i32, max_entries) })
}

/// Writes to standard output with one `write(2)` loop: no lock (a thread holding
/// Rust's stdout lock cannot stall it), no allocation. For the out-of-memory path.
pub(crate) fn write_stdout_unlocked(text: &str) -> Result<()> {
    // SAFETY: the pointer and length describe `text`'s bytes for the call's duration.
    check(unsafe { memprof_write_stdout(text.as_ptr().cast(), text.len()) })
}

/// The process's resident memory and its peak since start, in bytes (zeros where the
/// system does not tell).
pub(crate) fn process_memory() -> Result<(u64, u64)> {
    let (mut rss, mut peak) = (0i64, 0i64);
    // SAFETY: both pointers are valid, writable i64s for the call's duration.
    check(unsafe { memprof_process_memory(&mut rss, &mut peak) })?;
    Ok((rss.max(0) as u64, peak.max(0) as u64))
}

/// CUDA allocator statistics of `cuda:index`; an error (never a crash) without CUDA.
pub(crate) fn cuda_stats(index: usize) -> Result<CudaStats> {
    let mut s = CudaStats::default();
    // SAFETY: `s` is a valid, writable CudaStats with the C layout.
    check(unsafe { memprof_cuda_stats(index as i32, &mut s) })?;
    Ok(s)
}

/// CUDA: starts or stops the caching allocator's own history.
pub(crate) fn cuda_history(on: bool, max_entries: u64) -> Result<()> {
    let n = i64::try_from(max_entries).unwrap_or(i64::MAX);
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_history(on as i32, n) })
}

/// CUDA: writes the caching allocator's snapshot to `path`.
pub(crate) fn cuda_snapshot(path: &std::path::Path) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().to_string_lossy().as_bytes())
        .map_err(|e| Error::Native(e.to_string()))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    check(unsafe { memprof_cuda_snapshot(c.as_ptr()) })
}

/// CUDA: resets the peak statistics of `cuda:index`.
pub(crate) fn cuda_reset_peaks(index: usize) -> Result<()> {
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_control(index as i32, native::CUDA_RESET_PEAKS) })
}

/// CUDA: releases the caching allocator's unused cached blocks.
pub(crate) fn cuda_empty_cache() -> Result<()> {
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_control(0, native::CUDA_EMPTY_CACHE) })
}

/// `(device_type, index)` as the native layer numbers devices.
fn device_code(device: tch::Device) -> Result<(i32, i32)> {
    match device {
        tch::Device::Cpu => Ok((native::DEVICE_CPU, 0)),
        tch::Device::Cuda(i) => Ok((native::DEVICE_CUDA, i as i32)),
        other => Err(Error::Native(format!(
            "{other:?}: only the CPU and CUDA are supported"
        ))),
    }
}

/// Enters autocast for `device` in `dtype` (a c10::ScalarType code); returns the state
/// to hand to [`autocast_exit`].
pub(crate) fn autocast_enter(device: tch::Device, dtype: i32) -> Result<Autocast> {
    let (dt, _) = device_code(device)?;
    let mut prev = Autocast::default();
    // SAFETY: `prev` is a valid, writable Autocast.
    check(unsafe { memprof_autocast_enter(dt, 1, dtype, &mut prev) })?;
    Ok(prev)
}

pub(crate) fn autocast_exit(device: tch::Device, prev: &Autocast) -> Result<()> {
    let (dt, _) = device_code(device)?;
    // SAFETY: `prev` is a valid Autocast.
    check(unsafe { memprof_autocast_exit(dt, prev) })
}

/// The default random generator's state of `device`.
pub(crate) fn rng_state(device: tch::Device) -> Result<Tensor> {
    let (dt, index) = device_code(device)?;
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `out` is a valid pointer slot; on success the callee stores a new
    // at::Tensor* that we own, as tch owns the tensors its functions return.
    check(unsafe { memprof_rng_get(dt, index, &mut out) })?;
    if out.is_null() {
        return Err(Error::Native("no generator state returned".into()));
    }
    // SAFETY: `out` is a heap at::Tensor* (tch's C_tensor), owned from here on.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// Restores the default random generator's state of `device`.
pub(crate) fn set_rng_state(device: tch::Device, state: &Tensor) -> Result<()> {
    let (dt, index) = device_code(device)?;
    // SAFETY: `state` is a live tensor handle for the duration of the call.
    check(unsafe { memprof_rng_set(dt, index, state.as_ptr() as *const c_void) })
}

// ---------------------------------------------------------------------------------
// The estimator's dry run on the meta device.

/// Starts the meta trace (one per process at a time); installs the meta trace
/// allocator and the missing meta kernels the first time.
pub(crate) fn meta_begin() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_begin() })
}

/// Stops the meta trace.
pub(crate) fn meta_end() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_end() })
}

/// Puts a mark with `value` into the meta trace.
pub(crate) fn meta_mark(value: i32) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_meta_mark(value) })
}

/// The meta trace's events; `false` when the trace overflowed its capacity.
pub(crate) fn meta_read(into: &mut Vec<MetaEvent>) -> Result<bool> {
    let mut total = 0u64;
    // SAFETY: a zero-capacity read only writes `total`.
    check(unsafe { memprof_meta_read(std::ptr::null_mut(), 0, &mut total) })?;
    let n = total.min(native::META_CAPACITY) as usize;
    buffer(into, n)?;
    let mut again = 0u64;
    // SAFETY: `into` holds `n` writable events.
    check(unsafe { memprof_meta_read(into.as_mut_ptr(), n as u64, &mut again) })?;
    Ok(total <= native::META_CAPACITY)
}

fn owned_tensor(out: *mut c_void, what: &str) -> Result<Tensor> {
    if out.is_null() {
        return Err(Error::Native(format!("{what}: no tensor returned")));
    }
    // SAFETY: `out` is a heap at::Tensor* (tch's C_tensor) the callee made for us.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// A new meta tensor of `sizes` with the dtype of `like`.
pub(crate) fn meta_empty(sizes: &[i64], like: &Tensor) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `sizes` is valid for its length, `like` a live tensor, `out` a valid slot.
    check(unsafe {
        memprof_meta_empty(sizes.as_ptr(), sizes.len(), like.as_ptr().cast(), &mut out)
    })?;
    owned_tensor(out, "memprof_meta_empty")
}

/// Moves `t` onto the meta device in place (every handle sharing it follows).
pub(crate) fn meta_convert(t: &Tensor) -> Result<()> {
    // SAFETY: `t` is a live tensor handle; the callee changes the TensorImpl it points
    // to, not the handle.
    check(unsafe { memprof_meta_convert(t.as_ptr() as *mut c_void) })
}

/// A TorchScript module loaded onto the meta device.
pub(crate) struct ScriptModule {
    ptr: *mut c_void,
}

impl ScriptModule {
    pub(crate) fn load(path: &std::path::Path) -> Result<ScriptModule> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::Native(format!("{}: the path has a NUL byte", path.display())))?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `c` is a NUL-terminated string, `ptr` a valid slot.
        check(unsafe { memprof_script_load(c.as_ptr(), &mut ptr) })?;
        Ok(ScriptModule { ptr })
    }

    pub(crate) fn set_train(&self, on: bool) -> Result<()> {
        // SAFETY: `ptr` is the live module this value owns.
        check(unsafe { memprof_script_train(self.ptr, on as i32) })
    }

    /// forward(inputs...) and the first tensor it returns.
    pub(crate) fn forward(&self, inputs: &[Tensor]) -> Result<Tensor> {
        let ptrs: Vec<*const c_void> = inputs.iter().map(|t| t.as_ptr().cast()).collect();
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: the module is live; `ptrs` holds live tensor handles for the call.
        check(unsafe { memprof_script_forward(self.ptr, ptrs.as_ptr(), ptrs.len(), &mut out) })?;
        owned_tensor(out, "memprof_script_forward")
    }

    /// The parameters (`buffers` false) or buffers, recursively, with dotted names.
    pub(crate) fn tensors(&self, buffers: bool) -> Result<Vec<(String, Tensor)>> {
        let which = buffers as i32;
        let mut n = 0u64;
        let mut unused: *mut c_void = std::ptr::null_mut();
        let mut name_len = 0u64;
        // SAFETY: an index past the end only writes `n`.
        check(unsafe {
            memprof_script_tensor(
                self.ptr,
                which,
                u64::MAX,
                &mut n,
                &mut unused,
                std::ptr::null_mut(),
                0,
                &mut name_len,
            )
        })?;
        let mut out = Vec::with_capacity(n as usize);
        let mut buf = vec![0u8; 512];
        for i in 0..n {
            let mut count = 0u64;
            let mut t: *mut c_void = std::ptr::null_mut();
            // SAFETY: `buf` is valid for its length; `t`, `n`, `name_len` valid slots.
            check(unsafe {
                memprof_script_tensor(
                    self.ptr,
                    which,
                    i,
                    &mut count,
                    &mut t,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut name_len,
                )
            })?;
            let tensor = owned_tensor(t, "memprof_script_tensor")?;
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            out.push((String::from_utf8_lossy(&buf[..end]).into_owned(), tensor));
        }
        Ok(out)
    }
}

impl Drop for ScriptModule {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the module this value owns, freed once.
        unsafe { memprof_script_free(self.ptr) };
    }
}

/// What the native layer passes when an allocation fails, before the error is raised.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OomEvent {
    /// Device slot.
    pub slot: usize,
    /// Bytes asked for (CUDA: the rounded block size).
    pub requested: i64,
    /// Bytes allocated when it failed.
    pub allocated: i64,
    /// CUDA: bytes reserved by the caching allocator; 0 on the CPU.
    pub reserved: i64,
}

type OomFn = Box<dyn Fn(OomEvent) + Send + Sync>;

/// The out-of-memory hook of a session: calls `f` from the failing allocation (on the
/// thread that allocated; on CUDA inside the caching allocator's OOM path). Dropping it
/// unregisters `f` and returns once no call of it is running.
pub(crate) struct OomHook {
    ctx: *mut OomFn,
}

extern "C" fn oom_trampoline(
    ctx: *mut c_void,
    slot: i32,
    requested: i64,
    allocated: i64,
    reserved: i64,
) {
    if ctx.is_null() || slot < 0 {
        return;
    }
    // SAFETY: `ctx` is the `OomFn` box registered by `OomHook::install`, alive until the
    // hook's drop, which waits for running calls before freeing it.
    let f = unsafe { &*(ctx as *const OomFn) };
    let event = OomEvent {
        slot: slot as usize,
        requested,
        allocated,
        reserved,
    };
    // A panic must not unwind into C++.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(event)));
}

impl OomHook {
    pub(crate) fn install(f: impl Fn(OomEvent) + Send + Sync + 'static) -> Result<OomHook> {
        let ctx: *mut OomFn = Box::into_raw(Box::new(Box::new(f)));
        // SAFETY: the trampoline matches MpOomCallback; `ctx` stays valid until drop.
        if let Err(e) = check(unsafe { memprof_set_oom_callback(Some(oom_trampoline), ctx.cast()) })
        {
            // SAFETY: not registered: we still own the box.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(e);
        }
        Ok(OomHook { ctx })
    }
}

impl Drop for OomHook {
    fn drop(&mut self) {
        // SAFETY: unregisters; returns once no call is running, so the box is free after.
        let status = unsafe { memprof_set_oom_callback(None, std::ptr::null_mut()) };
        if status == 0 {
            // SAFETY: `ctx` came from Box::into_raw in install and is no longer used.
            drop(unsafe { Box::from_raw(self.ctx) });
        } else {
            log::warn!("tch-memprof: unregistering the OOM hook failed; its state is leaked");
        }
    }
}

/// Self-check of the native CUDA block table without a GPU: inserts, finds and removes
/// `n` fake blocks per writer with two concurrent writers; returns the mismatches.
pub(crate) fn selftest_block_table(n: u64) -> Result<u64> {
    let mut errors = 0;
    // SAFETY: `errors` is a valid out-pointer.
    check(unsafe { memprof_selftest_block_table(n, &mut errors) })?;
    Ok(errors)
}

/// Re-enters the CPU allocation hook on purpose (the negative control of
/// `State::hook_reentries`).
pub(crate) fn selftest_reenter() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_selftest_reenter() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// `VmRSS:` or `VmHWM:` of /proc/self/status, in bytes.
    fn status_field(key: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb * 1024
    }

    #[test]
    fn process_memory_agrees_with_proc_status_and_sees_touched_pages() {
        let (rss0, _) = process_memory().unwrap();
        let status_rss = status_field("VmRSS:");
        // Read a moment apart; the test harness's other threads may move a few pages.
        assert!(
            rss0.abs_diff(status_rss) < 4 << 20,
            "statm {rss0} vs VmRSS {status_rss}"
        );
        // 64 MiB written page by page become resident.
        let touched = vec![1u8; 64 << 20];
        let (rss1, peak1) = process_memory().unwrap();
        assert!(rss1 >= rss0 + (60 << 20), "{rss0} -> {rss1} after 64 MiB");
        let status_hwm = status_field("VmHWM:");
        assert!(
            peak1.abs_diff(status_hwm) < 4 << 20,
            "ru_maxrss {peak1} vs VmHWM {status_hwm}"
        );
        drop(touched);
        // SAFETY: both pointers null: the callee checks and writes nothing.
        assert_eq!(
            unsafe { memprof_process_memory(std::ptr::null_mut(), std::ptr::null_mut()) },
            -1
        );
    }

    #[test]
    fn a_null_out_pointer_is_an_error_with_a_message() {
        // SAFETY: the callee checks the pointer and writes nothing.
        let status = unsafe { memprof_state(std::ptr::null_mut()) };
        assert_eq!(status, -1);
        let msg = last_error().to_string();
        assert!(msg.contains("memprof_state: null pointer"), "{msg}");
    }

    #[test]
    fn unknown_name_ids_are_none() {
        assert_eq!(name(-5).unwrap(), None);
        let id = intern("tch-memprof-test-name").unwrap();
        assert_eq!(name(id).unwrap().as_deref(), Some("tch-memprof-test-name"));
        assert_eq!(intern("tch-memprof-test-name").unwrap(), id);
    }

    #[test]
    fn offsets_are_checked_at_compile_time() {
        // The generated checks cover every field; one spot check that they are real.
        assert_eq!(offset_of!(TlEvent, value), 24);
    }
}
