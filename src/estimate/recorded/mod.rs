//! A recorded CUDA run as one more source of events for the one replay: the caching
//! allocator's own event history, as PyTorch records it
//! (`torch.cuda.memory._record_memory_history()`, then
//! `torch.cuda.memory._dump_snapshot("run.pickle")`), replayed through the model of the
//! allocator ([`super::CachingAllocator`]) by the replay every estimate goes through,
//! under the settings the run used or under others (what-ifs).
//!
//! Of the history's actions, `alloc` (the size asked for) and `free_completed` (the block
//! back in the pool) drive the replay; `segment_alloc` and `segment_free` (cudaMalloc and
//! cudaFree) give the recorded reserved bytes, `alloc` and `free_completed` the recorded
//! allocated bytes (as requested: the allocator counts whole blocks, a little more).
//! A history that begins after the run started (PyTorch keeps the last `max_entries`
//! events, or recording began late) starts from the segments the snapshot lists that it
//! never saw made, each seeded with the blocks still live at the end that the history
//! never allocated ([`Recording::segments_before`]); a free of a block it never saw
//! allocated is counted ([`RecordedRun::unknown_frees`]).

use std::collections::HashMap;
use std::path::Path;

mod captured;
mod csv_history;
mod peak;
mod pickle;
mod step;
pub use peak::PeakView;

use captured::Expanded;
use pickle::{Pickle, Value};

use super::{AllocatorConfig, Options, PoolState};
use crate::error::{Error, Result};
use crate::events::{Event, EventKind};
use crate::format::bytes;
use crate::phase::Phase;

/// What happened to a block or a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A cudaMalloc of a segment.
    SegmentAlloc,
    /// A cudaFree of a segment.
    SegmentFree,
    /// A block handed out (`size`: the bytes asked for).
    Alloc,
    /// A block freed by its tensor, not yet back in the pool (work still queued on a
    /// stream).
    FreeRequested,
    /// A block back in the pool.
    FreeCompleted,
    /// A history captured without a GPU (`scripts/eager-capture.py`): an op that CUDA
    /// runs on cuBLAS returned here (`lt`: on cuBLASLt, which takes a workspace of its
    /// own after the cuBLAS one), on the caller's thread or, `backward`, on the autograd
    /// engine's CUDA thread. The replay takes each thread's workspace at its first such
    /// op, at the GPU's size ([`Recording::gpu`]), as it does for a dry run.
    Workspace {
        /// cuBLASLt.
        lt: bool,
        /// On the autograd engine's thread.
        backward: bool,
    },
    /// A history captured without a GPU: a sum or mean returned here, whose CUDA kernel
    /// takes a staging buffer and semaphores from the caching allocator and frees them
    /// before it returns when it splits the reduction across thread blocks. `index`: the
    /// reduction's input and output among the history's; the replay sizes its buffers
    /// for the GPU ([`Recording::gpu`]) as a dry run does.
    Reduce {
        /// The reduction among the history's.
        index: u32,
    },
    /// Any other action (`snapshot`, `oom`, ...): not replayed.
    Other,
}

impl Action {
    fn parse(name: &str) -> Action {
        match name {
            "segment_alloc" | "segment_map" => Action::SegmentAlloc,
            "segment_free" | "segment_unmap" => Action::SegmentFree,
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            _ => Action::Other,
        }
    }
}

/// One event of a recorded history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedEvent {
    /// What happened.
    pub action: Action,
    /// The block's or the segment's address.
    pub addr: u64,
    /// Bytes asked for (a block) or obtained (a segment).
    pub size: u64,
    /// Where the block was asked for: an index into [`Recording::sites`], or
    /// [`NO_SITE`] where the history kept no frames.
    pub site: u32,
    /// The CUDA stream it was asked on (the history's `stream`; 0 where it has none).
    pub stream: u64,
}

/// The largest file [`Recording::read`] takes: 2 GiB (a snapshot of a million events
/// with Python stacks is a few hundred MB).
pub(crate) const MAX_FILE_BYTES: u64 = 2 << 30;

/// A [`RecordedEvent`] without a site.
pub const NO_SITE: u32 = u32::MAX;

/// Peak bytes of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peaks {
    /// Peak allocated bytes.
    pub allocated: u64,
    /// Peak reserved bytes.
    pub reserved: u64,
}

/// A recorded history: its events (one device), and the allocator settings the run used
/// when the file says (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Debug, Clone, Default)]
pub struct Recording {
    /// The history, in order.
    pub events: Vec<RecordedEvent>,
    /// `PYTORCH_CUDA_ALLOC_CONF` as the run had it (a snapshot's `allocator_settings`).
    pub alloc_conf: Option<String>,
    /// Segments the file lists at its end that the history never saw made (it began
    /// after them): the events start with them, seeded from the file's end state (each
    /// with the blocks still live at the end that the history never allocated).
    pub segments_before: u64,
    /// Where blocks were asked for, each once: the first frame of an `alloc`'s stack
    /// outside PyTorch's own code (`name (file:line)`), or the CSV's `frame`.
    pub sites: Vec<String>,
    /// The GPU whose cuBLAS workspaces a captured history's [`Action::Workspace`] events
    /// take; `None`: the larger plausible size (Hopper's, 32 MiB a thread). A recorded
    /// run's own workspaces are among its allocations and it has no such event.
    pub gpu: Option<crate::estimate::Gpu>,
    /// A captured history's reductions ([`Action::Reduce`]'s `index`).
    pub(crate) reductions: Vec<crate::ffi::Reduction>,
}

/// A recorded history replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRun {
    /// The recorded peaks: reserved from the segment events, allocated from the blocks'
    /// sizes as asked for.
    pub recorded: Peaks,
    /// The replay's peaks under the settings it was given.
    pub replayed: Peaks,
    /// Frees of blocks the history never saw allocated.
    pub unknown_frees: u64,
    /// Whether the history, with the segments seeded from before it, accounts for every
    /// block it frees.
    pub complete: bool,
    /// The replay's pools when its reserved bytes first reached their peak, and the
    /// request (bytes asked for) that made the last segment then.
    pub at_reserved_peak: Option<(PoolState, u64)>,
    /// The CUDA streams the history asked for blocks on ([`Recording::streams`]). Over
    /// 1, the replayed peaks are of one stream's pool and can be under what the run
    /// needed (its recorded peak reserved is the run's own).
    pub streams: usize,
}

impl Recording {
    /// A memory snapshot as PyTorch writes it (`torch.cuda.memory._dump_snapshot`): the
    /// history of `device` (`device_traces[device]`) and the run's allocator settings.
    /// The pickle is read as data: no class is looked up, no code runs.
    pub fn from_snapshot(bytes: &[u8], device: usize) -> std::result::Result<Recording, String> {
        Self::from_pickle(&parse_snapshot(bytes)?, device)
    }

    fn from_pickle(p: &Pickle, device: usize) -> std::result::Result<Recording, String> {
        let top = p.root();
        if !p.is_dict(top) {
            return Err(bad("the snapshot", "not a dictionary"));
        }
        let list = |v: Value| p.list_of(v);
        let text = |v: Value| p.text(v);
        let number = |v: Value| p.number(v);
        let traces = p.get(top, "device_traces").and_then(list).ok_or_else(|| {
            bad(
                "the snapshot",
                "no `device_traces`: record the history first \
                 (torch.cuda.memory._record_memory_history())",
            )
        })?;
        let trace = traces.get(device).copied().and_then(list).ok_or_else(|| {
            bad(
                "the snapshot",
                format!("no history for device {device} ({} recorded)", traces.len()),
            )
        })?;
        let mut events = Vec::with_capacity(trace.len());
        let mut seen_segments = Vec::new();
        let mut sites = Sites::default();
        for &e in trace {
            if !p.is_dict(e) {
                continue;
            }
            let action = p
                .get(e, "action")
                .and_then(text)
                .map_or(Action::Other, Action::parse);
            let (Some(addr), Some(size)) = (
                p.get(e, "addr").and_then(number),
                p.get(e, "size").and_then(number),
            ) else {
                continue;
            };
            if action == Action::SegmentAlloc {
                seen_segments.push(addr);
            }
            let site = match action {
                Action::Alloc => p
                    .get(e, "frames")
                    .and_then(list)
                    .and_then(|f| site_of(p, f))
                    .map_or(NO_SITE, |f| sites.id(&f)),
                _ => NO_SITE,
            };
            let stream = p.get(e, "stream").and_then(number).unwrap_or(0);
            events.push(RecordedEvent {
                action,
                addr,
                size,
                site,
                stream,
            });
        }
        // Segments made before the history began: seeded from the snapshot's end state,
        // before the history's events, as the history's start found them as far as the
        // end state tells: each with the blocks still live at the end that the history
        // never allocated (in address order), or empty.
        let allocated: std::collections::HashSet<u64> = events
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .map(|e| e.addr)
            .collect();
        let mut seed = Vec::new();
        let mut segments_before = 0;
        for &segment in p.get(top, "segments").and_then(list).into_iter().flatten() {
            if !p.is_dict(segment) {
                continue;
            }
            let (Some(addr), Some(total)) = (
                p.get(segment, "address").and_then(number),
                p.get(segment, "total_size").and_then(number),
            ) else {
                continue;
            };
            if p.get(segment, "device").and_then(number) != Some(device as u64)
                || seen_segments.contains(&addr)
            {
                continue;
            }
            segments_before += 1;
            let stream = p.get(segment, "stream").and_then(number).unwrap_or(0);
            seed.push(RecordedEvent {
                action: Action::SegmentAlloc,
                addr,
                size: total,
                site: NO_SITE,
                stream,
            });
            let mut live: Vec<(u64, u64, u32)> = p
                .get(segment, "blocks")
                .and_then(list)
                .into_iter()
                .flatten()
                .copied()
                .filter(|&b| p.is_dict(b))
                .filter(|&b| p.get(b, "state").and_then(text) == Some("active_allocated"))
                .filter_map(|b| {
                    let a = p.get(b, "address").and_then(number)?;
                    let size = p.get(b, "requested_size").or_else(|| p.get(b, "size"));
                    let site = p
                        .get(b, "frames")
                        .and_then(list)
                        .and_then(|f| site_of(p, f))
                        .map_or(NO_SITE, |f| sites.id(&f));
                    Some((a, size.and_then(number)?, site))
                })
                .filter(|(a, _, _)| !allocated.contains(a))
                .collect();
            live.sort_unstable();
            if live.is_empty() {
                // An empty segment: made by a block of its size, freed.
                let small = p.get(segment, "segment_type").and_then(text) == Some("small");
                let size = if small { 1 } else { total };
                for action in [Action::Alloc, Action::FreeCompleted] {
                    seed.push(RecordedEvent {
                        action,
                        addr,
                        size,
                        site: NO_SITE,
                        stream,
                    });
                }
            }
            seed.extend(live.into_iter().map(|(addr, size, site)| RecordedEvent {
                action: Action::Alloc,
                addr,
                size,
                site,
                stream,
            }));
        }
        seed.extend(events);
        let events = seed;
        let alloc_conf = p
            .get(top, "allocator_settings")
            .and_then(|s| p.get(s, "PYTORCH_CUDA_ALLOC_CONF"))
            .and_then(text)
            .map(str::to_string);
        Ok(Recording {
            events,
            alloc_conf,
            segments_before,
            gpu: None,
            sites: sites.names,
            reductions: Vec::new(),
        })
    }

    /// A file: a snapshot pickle (the history of `device`), gzipped or not, or the compact
    /// CSV (`.csv`). A file over 2 GiB (or gzipped to more) is refused: its
    /// objects take a few times its size in memory. A pickle is read as it comes, so its
    /// bytes are never held whole beside them.
    pub fn read(path: &Path, device: usize) -> Result<Recording> {
        Recording::read_with_progress(path, device, &mut |_, _| {})
    }

    /// [`read`](Self::read), calling `progress` with the bytes of the file read so far
    /// and its size, every 16 MiB (a progress line).
    pub fn read_with_progress(
        path: &Path,
        device: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Recording> {
        use std::io::{BufRead, Read};
        let failed = |reason: String| Error::Recording {
            path: path.to_path_buf(),
            reason,
        };
        let size = std::fs::metadata(path)
            .map_err(|e| failed(crate::fs::io_reason(&e)))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(failed(too_large(size)));
        }
        let file = std::fs::File::open(path).map_err(|e| failed(crate::fs::io_reason(&e)))?;
        let mut tick = |read: u64| progress(read, size);
        let mut file = Counted {
            inner: Box::new(std::io::BufReader::with_capacity(1 << 20, file)),
            read: 0,
            tick: Some(&mut tick),
            next_tick: TICK,
        };
        let gzipped = file
            .fill_buf()
            .map_err(|e| failed(crate::fs::io_reason(&e)))?
            .starts_with(&[0x1f, 0x8b]);
        // Gzipped (`.pickle.gz`): read through, up to the same bound.
        let mut src: Box<dyn BufRead + '_> = if gzipped {
            Box::new(std::io::BufReader::with_capacity(
                1 << 20,
                flate2::bufread::GzDecoder::new(file).take(MAX_FILE_BYTES + 1),
            ))
        } else {
            Box::new(file)
        };
        if path
            .to_string_lossy()
            .trim_end_matches(".gz")
            .ends_with(".csv")
        {
            let mut text = Vec::new();
            src.read_to_end(&mut text).map_err(|e| {
                failed(format!(
                    "gzipped, but not read whole ({}): a damaged or cut file",
                    e.kind()
                ))
            })?;
            if text.len() as u64 > MAX_FILE_BYTES {
                return Err(failed(format!(
                    "gzipped, and {}",
                    too_large(text.len() as u64)
                )));
            }
            return Recording::from_csv(&String::from_utf8_lossy(&text)).map_err(failed);
        }
        let mut counted = Counted {
            inner: src,
            read: 0,
            tick: None,
            next_tick: TICK,
        };
        let p = Pickle::read(&mut counted).map_err(|e| {
            if counted.read > MAX_FILE_BYTES {
                failed(format!("gzipped, and {}", too_large(counted.read)))
            } else if gzipped && e.starts_with("the file could not be read") {
                failed("gzipped, but not read whole: a damaged or cut file".to_string())
            } else {
                failed(bad(
                    "the snapshot",
                    format!("not a pickle PyTorch wrote: {e}"),
                ))
            }
        })?;
        Recording::from_pickle(&p, device).map_err(failed)
    }

    /// The recorded peaks.
    pub fn recorded_peaks(&self) -> Peaks {
        let (mut reserved, mut allocated) = (0i64, 0i64);
        let mut peaks = Peaks::default();
        let mut live: HashMap<u64, u64> = HashMap::new();
        for e in &self.events {
            match e.action {
                Action::SegmentAlloc => reserved += e.size as i64,
                Action::SegmentFree => reserved -= e.size as i64,
                Action::Alloc => {
                    live.insert(e.addr, e.size);
                    allocated += e.size as i64;
                }
                Action::FreeCompleted => allocated -= live.remove(&e.addr).unwrap_or(0) as i64,
                _ => {}
            }
            peaks.reserved = peaks.reserved.max(reserved.max(0) as u64);
            peaks.allocated = peaks.allocated.max(allocated.max(0) as u64);
        }
        peaks
    }

    /// The history as the one replay's events: an allocation per `alloc` on its stream
    /// (the block named by its address, `aux` its site + 1, 0 without one), a free per
    /// `free_completed`, a release of the cache where the history released segments
    /// (`segment_free` or `segment_unmap` after other actions: `empty_cache()` releases
    /// them one after another, one release).
    fn replay_events(&self) -> Vec<Event> {
        self.replay_events_at().map(|(_, e)| e).collect()
    }

    /// The same, each with the index of the history's event it comes from (a reduction's
    /// buffers each an event of their own, at its index).
    pub(crate) fn replay_events_at(&self) -> impl Iterator<Item = (usize, Event)> + '_ {
        let streams = self.stream_indices();
        let buffers = self.reduction_buffers();
        let mut released = false;
        self.events.iter().enumerate().flat_map(move |(i, e)| {
            let event = |kind, value, phase| Event {
                kind,
                phase,
                device: 0,
                generation: 1,
                op: -1,
                aux: 0,
                ptr: e.addr,
                value,
            };
            let (kind, value) = match e.action {
                Action::Alloc => (
                    EventKind::Alloc {
                        stream: streams[&e.stream],
                    },
                    e.size as i64,
                ),
                Action::FreeCompleted => (EventKind::Free, -(e.size as i64)),
                // The replay gives backward's cuBLAS calls the autograd thread's
                // workspace.
                Action::Workspace { lt, backward } => {
                    released = false;
                    let phase = if backward {
                        Phase::Backward
                    } else {
                        Phase::Forward
                    };
                    return Expanded::One(Some((i, event(EventKind::Workspace { lt }, 0, phase))));
                }
                // Each buffer taken after the kernel's output and freed before it
                // returns, one after the other (as a dry run logs them).
                Action::Reduce { index } => {
                    released = false;
                    let sizes = buffers.get(index as usize).cloned().unwrap_or_default();
                    return Expanded::Many(i, sizes.into_iter(), e.addr);
                }
                Action::SegmentFree if !released => (EventKind::Release, 0),
                Action::SegmentFree => return Expanded::One(None),
                _ => {
                    released = false;
                    return Expanded::One(None);
                }
            };
            released = kind == EventKind::Release;
            let mut out = event(kind, value, Phase::Forward);
            if e.action == Action::Alloc && e.site != NO_SITE {
                out.aux = e.site as i32 + 1;
            }
            Expanded::One(Some((i, out)))
        })
    }

    /// The recorded id of each stream the replay numbers (its index), in that order.
    pub fn stream_ids(&self) -> Vec<u64> {
        let mut ids: Vec<(u32, u64)> = self
            .stream_indices()
            .into_iter()
            .map(|(id, index)| (index, id))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Each stream the history asked for blocks on, numbered in the order first asked.
    pub(crate) fn stream_indices(&self) -> HashMap<u64, u32> {
        let mut indices = HashMap::new();
        for e in self.events.iter().filter(|e| e.action == Action::Alloc) {
            let next = indices.len() as u32;
            indices.entry(e.stream).or_insert(next);
        }
        indices
    }

    /// The CUDA streams blocks were asked on (1 for a history of one stream, or one
    /// without streams). The replay keeps each stream's freed blocks for that stream, as
    /// PyTorch does.
    pub fn streams(&self) -> usize {
        self.stream_indices().len().max(1)
    }

    /// Replays the history under `config`.
    pub fn replay(&self, config: &AllocatorConfig) -> RecordedRun {
        let options = Options {
            allocator: config.clone(),
            gpu: self.workspace_gpu(),
            ..Options::default()
        };
        let device =
            crate::replay::through_allocator(&[], &self.replay_events(), &options.device());
        RecordedRun {
            recorded: self.recorded_peaks(),
            replayed: Peaks {
                allocated: device.stats.peak_allocated,
                reserved: device.stats.peak_reserved,
            },
            unknown_frees: device.unknown_frees,
            complete: device.unknown_frees == 0,
            at_reserved_peak: device.at_reserved_peak,
            streams: self.streams(),
        }
    }
}

/// Sites, each named once.
#[derive(Default)]
struct Sites {
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Sites {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }
}

/// The site of a stack of frames (`{filename, line, name}`, innermost first): the first
/// frame outside PyTorch's own code (its Python package and its C++), or the first.
fn site_of(p: &Pickle, frames: &[Value]) -> Option<String> {
    let frames: Vec<(&str, u64, &str)> = frames
        .iter()
        .filter(|&&f| p.is_dict(f))
        .map(|&f| {
            (
                p.get(f, "filename").and_then(|v| p.text(v)).unwrap_or(""),
                p.get(f, "line").and_then(|v| p.number(v)).unwrap_or(0),
                p.get(f, "name").and_then(|v| p.text(v)).unwrap_or(""),
            )
        })
        .collect();
    let own = |file: &str| {
        [
            "/torch/",
            "site-packages/torch",
            "/c10/",
            "/aten/",
            "/csrc/",
        ]
        .iter()
        .any(|p| file.contains(p))
            || file.starts_with("??")
            || file.is_empty()
    };
    let (file, line, name) = frames
        .iter()
        .find(|(file, _, _)| !own(file))
        .or_else(|| frames.first())?;
    Some(format!("{name} ({file}:{line})"))
}

fn bad(what: &str, reason: impl std::fmt::Display) -> String {
    format!("{what}: {reason}")
}

fn parse_snapshot(mut bytes: &[u8]) -> std::result::Result<Pickle, String> {
    Pickle::read(&mut bytes)
        .map_err(|e| bad("the snapshot", format!("not a pickle PyTorch wrote: {e}")))
}

/// A stream that counts the bytes read from it (a gzipped file's bound), and calls its
/// `tick` every [`TICK`] bytes (the file's progress).
struct Counted<'a> {
    inner: Box<dyn std::io::BufRead + 'a>,
    read: u64,
    tick: Option<&'a mut dyn FnMut(u64)>,
    next_tick: u64,
}

/// How often the reading's progress is told.
const TICK: u64 = 16 << 20;

impl Counted<'_> {
    fn count(&mut self, n: usize) {
        self.read += n as u64;
        if self.read >= self.next_tick {
            self.next_tick = self.read + TICK;
            if let Some(tick) = self.tick.as_mut() {
                tick(self.read);
            }
        }
    }
}

impl std::io::Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count(n);
        Ok(n)
    }
}

impl std::io::BufRead for Counted<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, n: usize) {
        self.inner.consume(n);
        self.count(n);
    }
}

/// A file over the reader's bound, why and what to do.
fn too_large(size: u64) -> String {
    format!(
        "{} is more than the {} this reader takes (its objects take a few times its size \
         in memory): record fewer events \
         (_record_memory_history(max_entries=...)) or without stacks",
        bytes(size),
        bytes(MAX_FILE_BYTES)
    )
}
