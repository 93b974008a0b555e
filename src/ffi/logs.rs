//! The native logs (`logs.cpp`): the backward log, the step log, the memory history.

use super::events::{decode, TlEvent};
use super::{buffer, check};
use crate::error::Result;

extern "C" {
    fn memprof_timeline_header(out: *mut TimelineHeader) -> i32;
    fn memprof_read_log(out: *mut LogEvent, cap: u64, total: *mut u64) -> i32;
    fn memprof_read_timeline(out: *mut TlEvent, cap: u64, total: *mut u64) -> i32;
    fn memprof_read_history(out: *mut HistEvent, cap: u64, total: *mut u64, ring: *mut u64) -> i32;
    fn memprof_history(on: i32, max_entries: u64) -> i32;
    fn memprof_set_detail(on: i32) -> i32;
    fn memprof_site(id: u64, out: *mut Site) -> i32;
}

/// `MpLogEvent`: one birth (+size) or death (-size) of a block during backward. Read
/// where the native layer wrote it (no copy); its fields are read through its methods.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LogEvent {
    pub(super) ptr: u64,
    pub(super) delta: i64,
    pub(super) generation: u32,
    pub(super) device: u32,
}

impl LogEvent {
    /// An event as the native layer logs it (for tests of what reads the log).
    #[cfg(test)]
    pub(crate) fn new(ptr: u64, delta: i64, generation: u32, device: u32) -> Self {
        LogEvent {
            ptr,
            delta,
            generation,
            device,
        }
    }

    /// The block's address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its bytes: positive at its birth, negative at its death.
    pub(crate) fn delta(&self) -> i64 {
        self.delta
    }

    /// The backward pass it happened in (the phase generation).
    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }

    /// The device slot (0: CPU, 1 + i: cuda:i).
    pub(crate) fn device(&self) -> u32 {
        self.device
    }
}

/// `MpSite`: the call stack of one allocation of the detailed step, innermost first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site {
    pub frames: u32,
    pub pad: u32,
    pub ips: [u64; super::native::SITE_DEPTH],
}

impl Site {
    /// Its return addresses.
    pub(crate) fn addresses(&self) -> &[u64] {
        &self.ips[..(self.frames as usize).min(self.ips.len())]
    }
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

/// `MpHistEvent`: one birth (+size) or death (-size) of the memory history. Read where
/// the native layer wrote it (no copy); its fields are read through its methods.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HistEvent {
    pub(super) ptr: u64,
    pub(super) size: i64,
    pub(super) op: i32,
    pub(super) layer: i32,
    /// Microseconds (monotonic clock) << 8 | device slot: read through
    /// [`HistEvent::time_us`] and [`HistEvent::device`].
    pub(super) time_dev: u64,
}

impl HistEvent {
    /// The block's address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Whether it is a birth (else a death).
    pub(crate) fn is_alloc(&self) -> bool {
        self.size >= 0
    }

    /// The block's bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.size.unsigned_abs()
    }

    /// Name id of the op it happened in (`-1`: none; read with `names::Names`).
    pub(crate) fn op(&self) -> i32 {
        self.op
    }

    /// Name id of the layer it happened in (`-1`: unknown).
    pub(crate) fn layer(&self) -> i32 {
        self.layer
    }

    /// When it happened: microseconds of the monotonic clock.
    pub(crate) fn time_us(&self) -> i64 {
        (self.time_dev >> 8) as i64
    }

    /// The device slot it happened on (0: CPU, 1 + i: cuda:i).
    pub(crate) fn device(&self) -> u8 {
        (self.time_dev & 0xff) as u8
    }
}

pub(crate) fn timeline_header() -> Result<TimelineHeader> {
    let mut h = TimelineHeader::default();
    // SAFETY: `h` is a valid, writable TimelineHeader with the C layout.
    check(unsafe { memprof_timeline_header(&mut h) })?;
    Ok(h)
}

/// The backward events logged in this iteration; returns whether the log overflowed.
pub(crate) fn read_log(into: &mut Vec<LogEvent>) -> Result<bool> {
    let st = super::state()?;
    let n = st.log_len.min(st.log_capacity) as usize;
    buffer(into, n)?;
    let mut total = 0u64;
    // SAFETY: `into` holds `n` initialised LogEvents; the callee copies at most `n`.
    check(unsafe { memprof_read_log(into.as_mut_ptr(), n as u64, &mut total) })?;
    into.truncate((total.min(st.log_capacity) as usize).min(n));
    Ok(total > st.log_capacity)
}

/// This iteration's step log, decoded; returns whether it overflowed (events were
/// dropped).
pub(crate) fn read_timeline(into: &mut Vec<super::Event>) -> Result<bool> {
    let h = timeline_header()?;
    let n = h.len.min(h.capacity) as usize;
    let mut raw: Vec<TlEvent> = Vec::new();
    buffer(&mut raw, n)?;
    let mut total = 0u64;
    // SAFETY: `raw` holds `n` initialised TlEvents; the callee copies at most `n`.
    check(unsafe { memprof_read_timeline(raw.as_mut_ptr(), n as u64, &mut total) })?;
    raw.truncate((total.min(h.capacity) as usize).min(n));
    decode(&raw, into)?;
    Ok(total > h.capacity)
}

/// Turns the step detail (op reads and allocation sites) on or off for the iteration that
/// begins now.
pub(crate) fn set_detail(on: bool) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_set_detail(on as i32) })
}

/// The call stack of site `id` (an alloc event's `aux - 1`) of the detailed step.
pub(crate) fn site(id: u64) -> Result<Site> {
    let mut s = Site {
        frames: 0,
        pad: 0,
        ips: [0; super::native::SITE_DEPTH],
    };
    // SAFETY: `s` is a valid, writable Site with the C layout.
    check(unsafe { memprof_site(id, &mut s) })?;
    Ok(s)
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

/// Starts (clearing) or stops the memory history of every device.
pub(crate) fn history(on: bool, max_entries: u64) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_history(on as i32, max_entries) })
}
