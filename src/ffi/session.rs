//! The session (`session.cpp`): start and stop, iterations, the state and the device counters.

use super::check;
use crate::error::Result;

extern "C" {
    fn memprof_start(want_cuda: i32, timeline_slot: i32, leaks: i32) -> i32;
    fn memprof_stop() -> i32;
    fn memprof_begin_iteration() -> i32;
    pub(super) fn memprof_state(out: *mut MpState) -> i32;
    fn memprof_device_stats(slot: i32, out: *mut MpDeviceStats) -> i32;
}

/// `MpDeviceStats`: the native layout of [`DeviceCounters`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MpDeviceStats {
    pub(super) live: i64,
    pub(super) peak_iter: i64,
    pub(super) peak_run: i64,
    pub(super) allocs: i64,
    pub(super) optimizer_born_live: i64,
    pub(super) feature_maps: i64,
    pub(super) reported_allocated: i64,
    pub(super) reported_reserved: i64,
    pub(super) reported_peak_allocated_iter: i64,
    pub(super) reported_peak_reserved_iter: i64,
    pub(super) reported_peak_allocated_run: i64,
    pub(super) reported_peak_reserved_run: i64,
}

/// The session's counters of one device slot, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DeviceCounters {
    /// Live now, as the session counts.
    pub live: i64,
    /// Peak of `live` in this iteration.
    pub peak_iter: i64,
    /// Allocations counted since the library loaded.
    pub allocs: i64,
    /// Live now of blocks born in the optimizer phase.
    pub optimizer_born_live: i64,
    /// Feature maps: blocks born in forward still live.
    pub feature_maps: i64,
    /// The device's allocator's own figures (CUDA), read with the counters.
    pub reported_allocated: i64,
    pub reported_reserved: i64,
    pub reported_peak_allocated_iter: i64,
    pub reported_peak_reserved_iter: i64,
}

/// `MpState`: the native layout of [`SessionState`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MpState {
    pub(super) generation: u32,
    pub(super) phase: u32,
    pub(super) active_backward: i64,
    pub(super) backward_passes: i64,
    pub(super) log_len: u64,
    pub(super) log_capacity: u64,
    pub(super) untagged_frees: i64,
    pub(super) cpu_installed: i32,
    pub(super) cuda_loaded: i32,
    pub(super) cuda_ooms_seen: i64,
    pub(super) hook_reentries: i64,
    pub(super) cuda_untracked: i64,
    pub(super) op_records: i32,
    pub(super) graph_task_direct: i32,
}

/// The session's global state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SessionState {
    /// Whether no session runs (the phase is idle).
    pub idle: bool,
    /// Backward passes of this iteration.
    pub backward_passes: u64,
    /// Bytes of the backward log's events held now.
    pub log_bytes: u64,
    /// Frees of blocks the session never saw born.
    pub untagged_frees: i64,
    /// Whether the CPU allocator hook is installed.
    pub cpu_installed: bool,
    /// Whether ops are being recorded (a step log or a dry run's trace).
    pub op_records: bool,
    /// Times a hook was entered from inside itself.
    pub hook_reentries: i64,
    /// CUDA frees of blocks not in the block table.
    pub cuda_untracked: i64,
    /// Whether a thread's graph task is read from libtorch's thread-local itself, not
    /// through a call into libtorch (its code was the expected one).
    pub graph_task_direct: bool,
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

pub(super) fn raw_state() -> Result<MpState> {
    let mut s = MpState::default();
    // SAFETY: `s` is a valid, writable MpState with the C layout.
    check(unsafe { memprof_state(&mut s) })?;
    Ok(s)
}

/// The session's global state.
pub(crate) fn state() -> Result<SessionState> {
    let s = raw_state()?;
    let log_events = s.log_len.min(s.log_capacity);
    Ok(SessionState {
        idle: s.phase == super::native::PHASE_IDLE,
        backward_passes: s.backward_passes.max(0) as u64,
        log_bytes: log_events * std::mem::size_of::<super::logs::MpLogEvent>() as u64,
        untagged_frees: s.untagged_frees,
        cpu_installed: s.cpu_installed != 0,
        op_records: s.op_records != 0,
        hook_reentries: s.hook_reentries,
        cuda_untracked: s.cuda_untracked,
        graph_task_direct: s.graph_task_direct != 0,
    })
}

/// The session's counters of device `slot`.
pub(crate) fn device_stats(slot: usize) -> Result<DeviceCounters> {
    let mut s = MpDeviceStats::default();
    // SAFETY: `s` is a valid, writable MpDeviceStats with the C layout.
    check(unsafe { memprof_device_stats(slot as i32, &mut s) })?;
    Ok(DeviceCounters {
        live: s.live,
        peak_iter: s.peak_iter,
        allocs: s.allocs,
        optimizer_born_live: s.optimizer_born_live,
        feature_maps: s.feature_maps,
        reported_allocated: s.reported_allocated,
        reported_reserved: s.reported_reserved,
        reported_peak_allocated_iter: s.reported_peak_allocated_iter,
        reported_peak_reserved_iter: s.reported_peak_reserved_iter,
    })
}
