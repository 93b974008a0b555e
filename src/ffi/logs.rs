//! The native logs (`logs.cpp`): the backward log, the step log, the memory history.

use super::events::{decode, MpTlEvent};
use super::{buffer, check};
use crate::error::Result;

extern "C" {
    fn memprof_timeline_header(out: *mut MpTimelineHeader) -> i32;
    fn memprof_log_view(events: *mut *const MpLogEvent, len: *mut u64, total: *mut u64) -> i32;
    fn memprof_read_timeline(out: *mut MpTlEvent, cap: u64, total: *mut u64) -> i32;
    fn memprof_read_history(
        out: *mut MpHistEvent,
        cap: u64,
        total: *mut u64,
        ring: *mut u64,
    ) -> i32;
    fn memprof_history(on: i32, max_entries: u64) -> i32;
    fn memprof_set_detail(on: i32) -> i32;
    fn memprof_relearn() -> i32;
    fn memprof_site(id: u64, out: *mut MpSite) -> i32;
}

/// `MpLogEvent`: one event of the native backward log.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MpLogEvent {
    pub(super) ptr: u64,
    pub(super) delta: i64,
    pub(super) generation: u32,
    pub(super) device: u32,
}

/// One birth (+bytes) or death (-bytes) of a block during backward: the native record
/// itself, so that the log is read where it lies (`repr(transparent)`: a slice of
/// records is a slice of these).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackwardEvent(MpLogEvent);

impl BackwardEvent {
    /// The event of `delta` bytes (positive at a birth, negative at a death) of the block
    /// at `ptr`, in backward pass `generation` (the phase generation), on device slot
    /// `device` (0: CPU, 1 + i: cuda:i). The native layer makes them; tests too.
    #[cfg(test)]
    pub(crate) fn new(ptr: u64, delta: i64, generation: u32, device: u32) -> Self {
        BackwardEvent(MpLogEvent {
            ptr,
            delta,
            generation,
            device,
        })
    }
    /// The block's address.
    pub(crate) fn ptr(&self) -> u64 {
        self.0.ptr
    }
    /// Its bytes: positive at its birth, negative at its death.
    pub(crate) fn delta(&self) -> i64 {
        self.0.delta
    }
    /// The backward pass it happened in (the phase generation).
    pub(crate) fn generation(&self) -> u32 {
        self.0.generation
    }
    /// The device slot (0: CPU, 1 + i: cuda:i).
    pub(crate) fn device(&self) -> u32 {
        self.0.device
    }
}

/// `MpSite`: the call stack of one allocation of the detailed step, innermost first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct MpSite {
    pub(super) frames: u32,
    pub(super) pad: u32,
    pub(super) ips: [u64; super::native::SITE_DEPTH],
}

/// `MpTimelineHeader`: the step log's state.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MpTimelineHeader {
    pub(super) len: u64,
    pub(super) capacity: u64,
    pub(super) start_generation: u32,
    pub(super) ops: i32,
    pub(super) start_live: i64,
    pub(super) on: i32,
    pub(super) device: i32,
    pub(super) records: i32,
    pub(super) learning: i32,
}

/// Where this iteration's step log starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct StepLogStart {
    /// The phase generation when the iteration began.
    pub generation: u32,
    /// Bytes live on the logged device when it began.
    pub live: i64,
}

/// What an iteration's step log holds of its ops (`MpRecords`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Records {
    /// No op's events, only blocks and phases: an iteration between the learning ones,
    /// whose ops are the learned iteration's (`profiler::template`).
    None,
    /// The ops' events after the iteration parted from the learned ones.
    After,
    /// Every op's events.
    All,
}

/// What this iteration's step log holds of its ops, and whether the iteration learns.
pub(crate) fn step_log_records() -> Result<(Records, bool)> {
    let h = timeline_header()?;
    let records = match h.records {
        0 => Records::None,
        1 => Records::After,
        _ => Records::All,
    };
    Ok((records, h.learning != 0))
}

/// The next iteration learns its ops again.
pub(crate) fn relearn() -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_relearn() })
}

/// `MpHistEvent`: the native layout of a [`HistoryEvent`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MpHistEvent {
    pub(super) ptr: u64,
    pub(super) size: i64,
    pub(super) op: i32,
    pub(super) layer: i32,
    /// Microseconds (monotonic clock) << 8 | device slot.
    pub(super) time_dev: u64,
}

/// One birth or death of the memory history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistoryEvent {
    /// The block's address.
    pub ptr: u64,
    /// Whether it is a birth (else a death).
    pub alloc: bool,
    /// The block's bytes.
    pub bytes: u64,
    /// Name id of the op it happened in (`-1`: none; read with `names::Names`).
    pub op: i32,
    /// Name id of the layer it happened in (`-1`: unknown).
    pub layer: i32,
    /// When it happened: microseconds of the monotonic clock.
    pub time_us: i64,
    /// The device slot it happened on (0: CPU, 1 + i: cuda:i).
    pub device: u8,
}

impl From<&MpHistEvent> for HistoryEvent {
    fn from(e: &MpHistEvent) -> Self {
        HistoryEvent {
            ptr: e.ptr,
            alloc: e.size >= 0,
            bytes: e.size.unsigned_abs(),
            op: e.op,
            layer: e.layer,
            time_us: (e.time_dev >> 8) as i64,
            device: (e.time_dev & 0xff) as u8,
        }
    }
}

/// Reads `n` native records with `read(buffer, n, total)` (the callee writes at most
/// `n` and sets `total`) and decodes the first `keep(total)` into `into`; returns
/// `total`.
fn read_records<R: Default + Clone, T>(
    into: &mut Vec<T>,
    n: usize,
    read: impl FnOnce(*mut R, u64, &mut u64) -> i32,
    keep: impl FnOnce(u64) -> usize,
) -> Result<u64>
where
    for<'a> T: From<&'a R>,
{
    let mut raw: Vec<R> = Vec::new();
    buffer(&mut raw, n)?;
    let mut total = 0u64;
    check(read(raw.as_mut_ptr(), n as u64, &mut total))?;
    raw.truncate(keep(total).min(n));
    into.clear();
    into.try_reserve_exact(raw.len()).map_err(|e| {
        crate::error::Error::Native(format!("cannot allocate {} events: {e}", raw.len()))
    })?;
    into.extend(raw.iter().map(T::from));
    Ok(total)
}

fn timeline_header() -> Result<MpTimelineHeader> {
    let mut h = MpTimelineHeader::default();
    // SAFETY: `h` is a valid, writable MpTimelineHeader with the C layout.
    check(unsafe { memprof_timeline_header(&mut h) })?;
    Ok(h)
}

/// Where this iteration's step log starts.
pub(crate) fn step_log_start() -> Result<StepLogStart> {
    let h = timeline_header()?;
    Ok(StepLogStart {
        generation: h.start_generation,
        live: h.start_live,
    })
}

/// The profiler's reader of the backward log: the events are read where the native layer
/// logged them (a copy of them cost a tenth of `record_stats` on a step of many small
/// ops), for as long as the reader is borrowed.
#[derive(Debug, Default)]
pub(crate) struct LogReader {
    _own: (),
}

impl LogReader {
    /// The backward events logged in this iteration, and whether the log overflowed
    /// (events were dropped).
    pub(crate) fn read(&mut self) -> Result<(&[BackwardEvent], bool)> {
        let mut events: *const MpLogEvent = std::ptr::null();
        let (mut len, mut total) = (0u64, 0u64);
        // SAFETY: three valid out-pointers the callee writes.
        check(unsafe { memprof_log_view(&mut events, &mut len, &mut total) })?;
        if events.is_null() || len == 0 {
            return Ok((&[], total > len));
        }
        // SAFETY: the native log (`MpLogEvent`s, whose layout the build checks, each a
        // BackwardEvent by `repr(transparent)`; plain integers, any bits a valid value) is allocated once, when the library
        // loads, and never freed or moved; `len` is within it. Its entries are rewound
        // only by `memprof_begin_iteration` or a session's start or end, which the
        // profiler calls from the thread that owns this reader, never while the `&mut
        // self` this slice borrows is held. Backward has returned when the profiler reads
        // it; a thread that allocates in a backward phase at this very moment may still
        // be writing its entry (the native copy this replaced read it the same way).
        let log =
            unsafe { std::slice::from_raw_parts(events.cast::<BackwardEvent>(), len as usize) };
        Ok((log, total > len))
    }
}
/// This iteration's step log, decoded; returns whether it overflowed (events were
/// dropped).
pub(crate) fn read_timeline(into: &mut Vec<crate::events::Event>) -> Result<bool> {
    let h = timeline_header()?;
    let n = h.len.min(h.capacity) as usize;
    let mut raw: Vec<MpTlEvent> = Vec::new();
    buffer(&mut raw, n)?;
    let mut total = 0u64;
    // SAFETY: `raw` holds `n` initialised MpTlEvents; the callee copies at most `n`.
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

/// The call stack of site `id` (an alloc event's `aux - 1`) of the detailed step: its
/// return addresses, innermost first.
pub(crate) fn site(id: u64) -> Result<Vec<u64>> {
    let mut s = MpSite {
        frames: 0,
        pad: 0,
        ips: [0; super::native::SITE_DEPTH],
    };
    // SAFETY: `s` is a valid, writable MpSite with the C layout.
    check(unsafe { memprof_site(id, &mut s) })?;
    Ok(s.ips[..(s.frames as usize).min(s.ips.len())].to_vec())
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
pub(crate) fn read_history(into: &mut Vec<HistoryEvent>, max: usize) -> Result<bool> {
    let (total, ring) = history_len()?;
    let n = (total.min(ring) as usize).min(max);
    let ring = std::cell::Cell::new(0u64);
    let total = read_records(
        into,
        n,
        // SAFETY: the buffer holds `n` initialised MpHistEvents; the callee copies at
        // most `n` and writes `total` and `ring`.
        |buf: *mut MpHistEvent, cap, total| unsafe {
            memprof_read_history(buf, cap, total, ring.as_ptr())
        },
        |total| total.min(ring.get()) as usize,
    )?;
    Ok(total > into.len() as u64)
}

/// Starts (clearing) or stops the memory history of every device.
pub(crate) fn history(on: bool, max_entries: u64) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { memprof_history(on as i32, max_entries) })
}
