//! The one seam to the native layer (`src/native/memprof.cpp`): every `extern "C"`
//! declaration and every `unsafe` block of the crate lives here. The C++ side catches
//! every exception and reports failure as a status plus a thread-local message, which
//! this module turns into [`Error::Native`].

use std::ffi::{c_char, c_void};

use tch::Tensor;

use crate::error::{Error, Result};

/// Number of device slots: slot 0 is the CPU, slot `1 + i` is `cuda:i`.
pub(crate) const MAX_DEVICES: usize = 17;

/// The optimizer phase as the native layer numbers it (forward 0, backward 1).
pub(crate) const PHASE_OPTIMIZER: u32 = 2;

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

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct State {
    pub gen: u32,
    pub phase: u32,
    pub active_backward: i64,
    pub backward_passes: i64,
    pub log_len: u64,
    pub log_capacity: u64,
    pub untagged_frees: i64,
    pub cpu_installed: i32,
    pub cuda_loaded: i32,
    pub cuda_ooms_seen: i64,
}

/// One birth (+size) or death (-size) of a block during backward.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LogEvent {
    pub ptr: u64,
    pub delta: i64,
    pub gen: u32,
    pub device: u32,
}

/// The allocation behind a tensor's storage.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Block {
    pub defined: i32,
    pub device: i32,
    pub tracked: i32,
    pub phase: u32,
    pub gen: u32,
    pub pad: u32,
    pub base: u64,
    pub bytes: i64,
}

/// CUDA caching-allocator statistics of one device (aggregate pool).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

/// Kinds of step-log events (`TlEvent::kind`).
pub(crate) mod ev {
    pub const ALLOC: u8 = 1;
    pub const FREE: u8 = 2;
    pub const OP_BEGIN: u8 = 3;
    pub const OP_END: u8 = 4;
    pub const LINK: u8 = 5;
    pub const FLOPS: u8 = 6;
    pub const UNCOUNTED: u8 = 7;
    pub const PHASE: u8 = 8;
}

/// One event of the step log; field meanings depend on `kind` (see memprof.cpp).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TlEvent {
    pub kind: u8,
    pub phase: u8,
    pub device: u8,
    pub pad: u8,
    pub gen: u32,
    pub op: i32,
    pub aux: i32,
    pub ptr: u64,
    pub value: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TimelineHeader {
    pub len: u64,
    pub capacity: u64,
    pub start_gen: u32,
    pub ops: i32,
    pub start_live: i64,
    pub on: i32,
    pub device: i32,
}

/// A live block of the registry (leak hunting).
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

/// The live-block registry's own size.
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

/// One birth (+size) or death (-size) of the memory history.
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

/// Autocast state of one device type, to restore on exit.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Autocast {
    pub enabled: i32,
    pub dtype: i32,
}

extern "C" {
    fn memprof_last_error(buf: *mut c_char, len: usize) -> usize;
    fn memprof_start(want_cuda: i32, timeline_slot: i32, leaks: i32) -> i32;
    fn memprof_stop() -> i32;
    fn memprof_begin_iteration() -> i32;
    fn memprof_state(out: *mut State) -> i32;
    fn memprof_device_stats(slot: i32, out: *mut DeviceStats) -> i32;
    fn memprof_read_log(out: *mut LogEvent, cap: u64) -> u64;
    fn memprof_tensor_block(tensor: *const c_void, grad: i32, out: *mut Block) -> i32;
    fn memprof_cuda_stats(index: i32, out: *mut CudaStats) -> i32;
    fn memprof_timeline_header(out: *mut TimelineHeader) -> i32;
    fn memprof_read_timeline(out: *mut TlEvent, cap: u64) -> u64;
    fn memprof_name(id: i32, buf: *mut c_char, len: usize) -> i64;
    fn memprof_intern(name: *const c_char) -> i32;
    fn memprof_set_params(ptrs: *const u64, ids: *const i32, layers: *const i32, n: usize) -> i32;
    fn memprof_live_blocks(slot: i32, out: *mut LiveBlock, cap: u64) -> u64;
    fn memprof_registry(out: *mut Registry) -> i32;
    fn memprof_autocast_enter(
        device_type: i32,
        enabled: i32,
        dtype: i32,
        prev: *mut Autocast,
    ) -> i32;
    fn memprof_autocast_exit(device_type: i32, prev: *const Autocast) -> i32;
    fn memprof_history(on: i32, max_entries: u64) -> i32;
    fn memprof_set_oom_callback(cb: Option<OomCallback>) -> i32;
    fn memprof_read_history(out: *mut HistEvent, cap: u64) -> u64;
    fn memprof_cuda_history(on: i32, max_entries: i64) -> i32;
    fn memprof_cuda_snapshot(path: *const c_char) -> i32;
    fn memprof_cuda_control(index: i32, what: i32) -> i32;
    fn memprof_rng_get(device_type: i32, index: i32, out: *mut *mut c_void) -> i32;
    fn memprof_rng_set(device_type: i32, index: i32, state: *const c_void) -> i32;
    fn memprof_scope_push(id: i32) -> i32;
    fn memprof_scope_pop() -> i32;
}

fn last_error() -> Error {
    let mut buf = vec![0u8; 1024];
    // SAFETY: the buffer is valid for `len` bytes; the callee writes at most len-1
    // bytes plus a terminating NUL.
    unsafe { memprof_last_error(buf.as_mut_ptr().cast(), buf.len()) };
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

/// Starts the profiling session on the calling thread (the training thread);
/// `timeline_slot` turns the step event log on for that device slot, `leaks` the
/// live-block registry.
pub(crate) fn start(want_cuda: bool, timeline_slot: Option<usize>, leaks: bool) -> Result<()> {
    let slot = timeline_slot.map_or(-1, |s| s as i32);
    // SAFETY: plain call; the callee catches all exceptions.
    check(unsafe { memprof_start(want_cuda as i32, slot, leaks as i32) })
}

/// Ends the profiling session. Call on the thread that started it.
pub(crate) fn stop() -> Result<()> {
    // SAFETY: plain call; the callee catches all exceptions.
    check(unsafe { memprof_stop() })
}

/// Ends the current iteration and begins the next (forward phase).
pub(crate) fn begin_iteration() -> Result<()> {
    // SAFETY: plain call; the callee catches all exceptions.
    check(unsafe { memprof_begin_iteration() })
}

pub(crate) fn state() -> State {
    let mut s = State::default();
    // SAFETY: `s` is a valid, writable State with the C layout.
    unsafe { memprof_state(&mut s) };
    s
}

pub(crate) fn device_stats(slot: usize) -> Result<DeviceStats> {
    let mut s = DeviceStats::default();
    // SAFETY: `s` is a valid, writable DeviceStats with the C layout.
    check(unsafe { memprof_device_stats(slot as i32, &mut s) })?;
    Ok(s)
}

/// The backward events logged in this iteration, and whether the log overflowed.
pub(crate) fn read_log(into: &mut Vec<LogEvent>) -> bool {
    let st = state();
    let n = st.log_len.min(st.log_capacity) as usize;
    into.clear();
    into.resize(n, LogEvent::default());
    // SAFETY: `into` holds `n` initialised LogEvents; the callee copies at most `n`.
    let total = unsafe { memprof_read_log(into.as_mut_ptr(), n as u64) };
    let copied = (total.min(st.log_capacity) as usize).min(n);
    into.truncate(copied);
    total > st.log_capacity
}

/// The block behind `t`'s storage, or behind its `.grad` when `grad` is true.
pub(crate) fn tensor_block(t: &Tensor, grad: bool) -> Result<Block> {
    let mut b = Block::default();
    // SAFETY: tch's tensor handle is a pointer to an at::Tensor that outlives this call
    // (we hold `t`); the callee only reads it.
    check(unsafe { memprof_tensor_block(t.as_ptr() as *const c_void, grad as i32, &mut b) })?;
    Ok(b)
}

/// CUDA allocator statistics of `cuda:index`; an error (never a crash) without CUDA.
pub(crate) fn cuda_stats(index: usize) -> Result<CudaStats> {
    let mut s = CudaStats::default();
    // SAFETY: `s` is a valid, writable CudaStats with the C layout.
    check(unsafe { memprof_cuda_stats(index as i32, &mut s) })?;
    Ok(s)
}

pub(crate) fn timeline_header() -> TimelineHeader {
    let mut h = TimelineHeader::default();
    // SAFETY: `h` is a valid, writable TimelineHeader with the C layout.
    unsafe { memprof_timeline_header(&mut h) };
    h
}

/// This iteration's step log; returns whether it overflowed (events were dropped).
pub(crate) fn read_timeline(into: &mut Vec<TlEvent>) -> bool {
    let h = timeline_header();
    let n = h.len.min(h.capacity) as usize;
    into.clear();
    into.resize(n, TlEvent::default());
    // SAFETY: `into` holds `n` initialised TlEvents; the callee copies at most `n`.
    let total = unsafe { memprof_read_timeline(into.as_mut_ptr(), n as u64) };
    into.truncate((total.min(h.capacity) as usize).min(n));
    total > h.capacity
}

/// The interned name `id` (op or scope), if known.
pub(crate) fn name(id: i32) -> Option<String> {
    let mut buf = [0u8; 128];
    // SAFETY: the buffer is valid for its length; the callee writes at most len-1
    // bytes plus a NUL.
    let n = unsafe { memprof_name(id, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Interns `name` (a scope name) and returns its id.
pub(crate) fn intern(name: &str) -> Result<i32> {
    let c = std::ffi::CString::new(name.replace('\0', " "))
        .map_err(|e| Error::Native(e.to_string()))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let id = unsafe { memprof_intern(c.as_ptr()) };
    if id < 0 {
        Err(last_error())
    } else {
        Ok(id)
    }
}

/// Replaces the native table of model variables (storage pointer -> variable index
/// and the name id of its layer).
pub(crate) fn set_params(ptrs: &[u64], ids: &[i32], layers: &[i32]) -> Result<()> {
    let n = ptrs.len().min(ids.len()).min(layers.len());
    // SAFETY: the three slices are valid for `n` elements for the duration of the call.
    check(unsafe { memprof_set_params(ptrs.as_ptr(), ids.as_ptr(), layers.as_ptr(), n) })
}

/// The live blocks of device `slot` registered in this session, into `into`.
pub(crate) fn live_blocks(slot: usize, into: &mut Vec<LiveBlock>) {
    loop {
        let cap = into.capacity().max(1024);
        into.clear();
        into.resize(cap, LiveBlock::default());
        // SAFETY: `into` holds `cap` initialised LiveBlocks; the callee writes at most `cap`.
        let n = unsafe { memprof_live_blocks(slot as i32, into.as_mut_ptr(), cap as u64) } as usize;
        if n <= cap {
            into.truncate(n);
            return;
        }
        // More blocks than room (others were born meanwhile): grow and read again.
        into.reserve(n + n / 4 - into.len());
    }
}

pub(crate) fn registry() -> Registry {
    let mut r = Registry::default();
    // SAFETY: `r` is a valid, writable Registry with the C layout.
    unsafe { memprof_registry(&mut r) };
    r
}

pub(crate) fn scope_push(id: i32) -> Result<()> {
    // SAFETY: plain call on the calling thread's scope stack.
    check(unsafe { memprof_scope_push(id) })
}

pub(crate) fn scope_pop() -> Result<()> {
    // SAFETY: plain call on the calling thread's scope stack.
    check(unsafe { memprof_scope_pop() })
}

/// `(device_type, index)` as the native layer numbers devices: CPU 0, CUDA 1.
fn device_code(device: tch::Device) -> Result<(i32, i32)> {
    match device {
        tch::Device::Cpu => Ok((0, 0)),
        tch::Device::Cuda(i) => Ok((1, i as i32)),
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
    // SAFETY: `prev` is a valid, writable Autocast; the callee catches all exceptions.
    check(unsafe { memprof_autocast_enter(dt, 1, dtype, &mut prev) })?;
    Ok(prev)
}

pub(crate) fn autocast_exit(device: tch::Device, prev: &Autocast) -> Result<()> {
    let (dt, _) = device_code(device)?;
    // SAFETY: `prev` is a valid Autocast; the callee catches all exceptions.
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

/// Starts (clearing) or stops the memory history of every device.
pub(crate) fn history(on: bool, max_entries: u64) -> Result<()> {
    // SAFETY: plain call; the callee catches all exceptions.
    check(unsafe { memprof_history(on as i32, max_entries) })
}

/// The history's events, oldest first; returns whether older ones were overwritten.
pub(crate) fn read_history(into: &mut Vec<HistEvent>, ring: usize) -> bool {
    into.clear();
    into.resize(ring, HistEvent::default());
    // SAFETY: `into` holds `ring` initialised events; the callee copies at most `ring`.
    let total = unsafe { memprof_read_history(into.as_mut_ptr(), ring as u64) } as usize;
    into.truncate(total.min(ring));
    total > ring
}

/// CUDA: starts or stops the caching allocator's own history.
pub(crate) fn cuda_history(on: bool, max_entries: u64) -> Result<()> {
    let n = i64::try_from(max_entries).unwrap_or(i64::MAX);
    // SAFETY: plain call; the callee catches all exceptions and fails without CUDA.
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
    check(unsafe { memprof_cuda_control(index as i32, 0) })
}

/// CUDA: releases the caching allocator's unused cached blocks.
pub(crate) fn cuda_empty_cache() -> Result<()> {
    // SAFETY: plain call; fails softly without CUDA.
    check(unsafe { memprof_cuda_control(0, 1) })
}

/// Called by the native layer when an allocation fails, before the error is raised:
/// `(device slot, requested bytes, allocated bytes, reserved bytes (CUDA; 0 on the CPU))`.
pub(crate) type OomCallback = extern "C" fn(i32, i64, i64, i64);

/// Sets or clears the out-of-memory report writer.
pub(crate) fn set_oom_callback(cb: Option<OomCallback>) {
    // SAFETY: a plain store of a function pointer (or null) that lives for the program.
    unsafe { memprof_set_oom_callback(cb) };
}
