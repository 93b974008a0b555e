//! The session (`session.cpp`): start and stop, iterations, the state and the device counters.

use super::check;
use crate::error::Result;

extern "C" {
    fn memprof_start(want_cuda: i32, timeline_slot: i32, leaks: i32) -> i32;
    fn memprof_stop() -> i32;
    fn memprof_begin_iteration() -> i32;
    pub(super) fn memprof_state(out: *mut State) -> i32;
    fn memprof_device_stats(slot: i32, out: *mut DeviceStats) -> i32;
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
    pub op_records: i32,
    pub pad: i32,
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
